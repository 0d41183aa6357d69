"""Exact and near-duplicate document removal for the corpus front door.

    dedup = Deduplicator(threshold=0.8)
    for doc in docs:
        if dedup.check(doc) is None:
            keep(doc)
    print(dedup.kept, dedup.exact, dedup.near)

DiskDeduplicator makes the same decisions out of core, all at the end (its docstring).

`check(text)` returns None for a new document (and remembers it), "exact" when the
text equals a kept one after normalization (Unicode casefold, every run of whitespace made
one space, leading and trailing whitespace dropped), and "near" when the estimated Jaccard
similarity of its word `shingle`-grams (after the same normalization) with a kept
document is >= `threshold`. The answer depends only on the texts and the order of the
calls, so a corpus read in the same order gives the same output.

Near duplicates: MinHash with LSH banding (Broder; Leskovec et al., Mining of Massive
Datasets, ch. 3). A kept document's `num_perm`-value signature is cut into `b` bands of
`r` values; a new document whose band equals a kept one's in any band is a candidate, and
counts as "near" only when the two signatures agree on >= threshold of their values, so
the banding's false candidates are never dropped. `b` and `r` minimise 0.1 x the false
candidate rate + 0.9 x the missed rate (datasketch's MinHashLSH optimiser and weights):
recall first, since the check removes false candidates. At the defaults (b=14, r=9) a
pair with Jaccard similarity 0.9 is a candidate with probability 0.999, 0.85 with 0.975.

Why not datasketch itself, the usual library: its `MinHash.update_batch` hashes every
shingle with SHA-1 in Python, slower than the rest of the front door together, and its
MinHashLSH keeps a Python set for every bucket, about three times the memory of the plain
tables here (see benchmarks/RESULTS.md). Here a signature is a few numpy operations
per document (a shingle's hash is a polynomial hash of its UTF-8 bytes mod 2^64, all
shingles at once from prefix sums; the permutations are affine maps mod 2^32 with odd
multipliers, datasketch's "affine32" scheme), and a band table maps a 64-bit key to a
document number.

Memory. Deduplicator keeps, per kept document, its signature (4 bytes x `num_perm`, in
blocks of a numpy array), an entry in each of the `b` band tables (a 64-bit key object and
a dict slot) and a 128-bit digest in a set: about 1.5 KB at the defaults, about 9 GB for
English Wikipedia. DiskDeduplicator gives the same answers in memory that grows only with
the documents that share a key with another (duplicates, false candidates): it spools them
to disk (a copy of each document's payload plus about 0.9 KB: its signature and an entry
per band and for its digest), groups the entries by key one hash partition at a time, and
runs the greedy rule (`greedy`) over just the documents that share a key with another; the
corpus front door uses it. Either is one sequential pass in input order: the Beam pipeline
groups the keys on its workers and sends only the documents of shared keys to that pass.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import struct

import numpy as np

_P = np.uint64(0x100000001B3)  # the polynomial hash's base (odd: invertible mod 2^64)
_P_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier of the final mix
_BLOCK = 1024  # signatures per block of the signature store


def normalize(text: str) -> str:
    """The form that exact duplicates share: casefolded, whitespace runs made one space."""
    return " ".join(text.casefold().split())


def digest(norm: str) -> int:
    """The exact-duplicate key of a normalized text (`normalize`): 128-bit BLAKE2b."""
    return int.from_bytes(hashlib.blake2b(norm.encode("utf-8"), digest_size=16).digest())


@functools.lru_cache(maxsize=None)
def lsh_bands(threshold: float, num_perm: int, false_candidate_weight: float = 0.1,
              missed_weight: float = 0.9) -> tuple[int, int]:
    """(b, r), b * r <= num_perm, minimising the weighted areas under the false-candidate
    curve (Jaccard below the threshold) and the missed curve (above it)."""
    lo, hi = np.linspace(0.0, threshold, 201), np.linspace(threshold, 1.0, 201)
    best = (np.inf, 1, num_perm)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            false = np.trapezoid(1 - (1 - lo ** r) ** b, lo)
            missed = np.trapezoid((1 - hi ** r) ** b, hi)
            error = false_candidate_weight * false + missed_weight * missed
            if error < best[0]:
                best = (error, b, r)
    return best[1], best[2]


class MinHasher:
    """The MinHash signatures and LSH band keys that both deduplicators share."""

    def __init__(self, threshold: float = 0.8, num_perm: int = 128, shingle: int = 5,
                 seed: int = 1):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold={threshold}: must be in (0, 1]")
        if num_perm < 2 or shingle < 1:
            raise ValueError(f"num_perm={num_perm}, shingle={shingle}: need num_perm >= 2 "
                             f"and shingle >= 1")
        self.threshold = threshold
        self.num_perm = num_perm
        self.shingle = shingle
        self.seed = seed
        rng = np.random.RandomState(seed)
        self._a = rng.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
        self._b = rng.randint(0, 1 << 32, num_perm, dtype=np.uint32)
        self.bands, self.rows = lsh_bands(threshold, num_perm)
        # A band's key: its r values (as uint64) times random odd 64-bit multipliers, summed.
        self._band_mult = (rng.randint(0, 1 << 63, (self.bands, self.rows), dtype=np.uint64)
                           * np.uint64(2) + np.uint64(1))
        # A near duplicate needs this many equal signature values.
        self.min_equal = int(np.ceil(threshold * num_perm - 1e-9))
        self._pow = self._inv = np.zeros(0, np.uint64)

    def _powers(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """P^j and P^-j mod 2^64 for j < n (grown on demand, kept)."""
        if len(self._pow) < n:
            m = max(n, 2 * len(self._pow))
            self._pow = np.cumprod(np.full(m, _P, np.uint64)) * _P_INV  # P^0 .. P^(m-1)
            self._inv = np.cumprod(np.full(m, _P_INV, np.uint64)) * _P
        return self._pow[:n], self._inv[:n]

    def signature(self, norm: str) -> np.ndarray:
        """MinHash of the word `shingle`-grams of a normalized text: uint32[num_perm].

        A shingle's hash is the polynomial hash (mod 2^64) of its UTF-8 bytes, computed for
        all shingles at once from prefix sums: no Python work per word."""
        data = np.frombuffer(norm.encode("utf-8"), np.uint8)
        n = len(data)
        spaces = np.flatnonzero(data == 32)
        starts = np.concatenate(([0], spaces + 1))
        ends = np.concatenate((spaces, [n]))
        k = min(self.shingle, len(starts))
        starts, ends = starts[:len(starts) - k + 1], ends[k - 1:]
        pw, inv = self._powers(n + 1)
        prefix = np.zeros(n + 1, np.uint64)
        np.cumsum((data.astype(np.uint64) + np.uint64(1)) * pw[:n], out=prefix[1:])
        s = (prefix[ends] - prefix[starts]) * inv[starts]
        s ^= s >> np.uint64(31)
        s *= _MIX
        h = (s >> np.uint64(32)).astype(np.uint32)
        m = np.multiply.outer(h, self._a)
        m += self._b
        return m.min(axis=0)

    def band_keys(self, sigs: np.ndarray) -> np.ndarray:
        """The LSH keys of signatures uint32[..., num_perm]: uint64[..., bands]."""
        bands = sigs[..., :self.bands * self.rows].astype(np.uint64)
        bands = bands.reshape(sigs.shape[:-1] + (self.bands, self.rows))
        return (bands * self._band_mult).sum(axis=-1)


class Deduplicator(MinHasher):
    """Remembers the documents it kept; says whether a new one duplicates one of them."""

    def __init__(self, threshold: float = 0.8, num_perm: int = 128, shingle: int = 5,
                 seed: int = 1):
        super().__init__(threshold, num_perm, shingle, seed)
        self._tables: list[dict[int, int | list[int]]] = [{} for _ in range(self.bands)]
        self._blocks: list[np.ndarray] = []
        self._digests: set[int] = set()
        self.kept = 0
        self.exact = 0
        self.near = 0

    def _stored(self, key: int) -> np.ndarray:
        return self._blocks[key // _BLOCK][key % _BLOCK]

    def check(self, text: str) -> str | None:
        """None: new (now remembered); "exact" or "near": a duplicate of a kept document."""
        norm = normalize(text)
        return self.check_digest(digest(norm), lambda: self.signature(norm))

    def check_digest(self, text_digest: int, sig) -> str | None:
        """`check` of a document known by `digest(normalize(text))` and its signature
        (`signature(normalize(text))`, or a function computing it, called only when the
        document is not an exact duplicate): for signatures made in worker processes."""
        if text_digest in self._digests:
            self.exact += 1
            return "exact"
        sig = sig() if callable(sig) else sig
        keys = self.band_keys(sig).tolist()
        candidates = set()
        for table, k in zip(self._tables, keys):
            hit = table.get(k)
            if isinstance(hit, list):
                candidates.update(hit)
            elif hit is not None:
                candidates.add(hit)
        for c in sorted(candidates):
            if int(np.count_nonzero(self._stored(c) == sig)) >= self.min_equal:
                self.near += 1
                return "near"
        doc = self.kept
        if doc % _BLOCK == 0:
            self._blocks.append(np.empty((_BLOCK, self.num_perm), np.uint32))
        self._blocks[-1][doc % _BLOCK] = sig
        for table, k in zip(self._tables, keys):
            hit = table.setdefault(k, doc)
            if hit != doc:
                if isinstance(hit, list):
                    hit.append(doc)
                else:
                    table[k] = [hit, doc]
        self._digests.add(text_digest)
        self.kept += 1
        return None


def greedy(members, signature, min_equal: int):
    """Deduplicator.check's decisions over the documents that share a key with another.

    members: (doc, exact group or None, [band groups]) in input order, where a group is a
    digest or a (band, key) that two or more documents have; signature(doc): its MinHash.
    Yields (doc, "exact" | "near") for the dropped ones. A document in no group is kept by
    check (nothing shares a key with it) and changes no other answer, so it is left out."""
    exact_kept: set = set()
    band_kept: dict = {}
    for doc, exact_group, band_groups in members:
        if exact_group is not None and exact_group in exact_kept:
            yield doc, "exact"
            continue
        candidates = set()
        for g in band_groups:
            candidates.update(band_kept.get(g, ()))
        if candidates:
            sig = signature(doc)
            if any(int(np.count_nonzero(signature(c) == sig)) >= min_equal
                   for c in sorted(candidates)):
                yield doc, "near"
                continue
        if exact_group is not None:
            exact_kept.add(exact_group)
        for g in band_groups:
            band_kept.setdefault(g, []).append(doc)


# One entry per (document, band) and per (document, digest): band entries are
# (band, band key, 0, doc), digest entries (bands, high 64 bits, low 64 bits, doc).
_ENTRY = np.dtype([("k1", "<u8"), ("k2", "<u8"), ("doc", "<u8"), ("band", "<u2")])
_SPOOL_HEADER = struct.Struct("<QQ")  # a spooled payload's length and its caller's integer
_MASK64 = (1 << 64) - 1
_MAX_SPLITS = 8  # times a partition is split again; past that it is read whole


class DiskDeduplicator(MinHasher):
    """Deduplicator's decisions, made at the end, in memory that grows with the duplicates
    (and false LSH candidates) only, not with all the documents.

        with DiskDeduplicator(folder) as d:
            for doc in docs:
                norm = normalize(doc)
                d.add(digest(norm), d.signature(norm), doc.encode())
            d.finish()
            for payload, info in d.kept_payloads():
                keep(payload)

    `add` spools each document to `folder`: its payload (any bytes, with an integer), its
    signature, and an entry per band and one for its digest, written to one of
    `partitions` files by a hash of the key. `finish` reads one partition at a time, finds
    the keys that two or more documents share (a partition bigger than `partition_bytes`
    is split again by another hash first), and runs Deduplicator.check's greedy rule in
    input order over just the documents holding such a key (`greedy`), reading their
    signatures back from the file. Memory: a block of signatures and entries while adding,
    one partition while grouping (about three times its file), and state proportional to
    the documents that share a key with another (duplicates and false candidates), not to
    all documents. Disk: the payloads, plus 4 x num_perm bytes of signature and 26 bytes
    per entry (bands + 1 of them) per document, about 0.9 KB at the defaults.
    """

    def __init__(self, folder: str, threshold: float = 0.8, num_perm: int = 128,
                 shingle: int = 5, seed: int = 1, partitions: int = 64,
                 partition_bytes: int = 64 << 20, block: int = 4096):
        super().__init__(threshold, num_perm, shingle, seed)
        if partitions < 2 or partition_bytes < 1 or block < 1:
            raise ValueError(f"partitions={partitions}, partition_bytes={partition_bytes}, "
                             f"block={block}: need >= 2, >= 1, >= 1")
        self.folder = folder
        self.partitions = partitions
        self.partition_bytes = partition_bytes
        self.split_partitions = 0  # partitions that were over partition_bytes
        os.makedirs(folder, exist_ok=True)
        self._spool = self._sig_file = None
        self._runs: list = []
        self._sig_path = os.path.join(folder, "signatures")
        try:
            self._spool = open(os.path.join(folder, "spool"), "wb")
            self._sig_file = open(self._sig_path, "wb")
            for j in range(partitions):
                self._runs.append(open(self._run_path(j), "wb"))
        except BaseException:
            self.close()
            raise
        self._sig_buf = np.empty((block, num_perm), np.uint32)
        self._dig_buf = np.empty((block, 2), np.uint64)
        self._fill = 0
        self.documents = 0
        self.kept = self.exact = self.near = 0
        self._dropped = np.zeros(0, np.int64)   # dropped documents, in order
        self._reasons = np.zeros(0, np.uint8)   # 1 exact, 2 near
        self._finished = False

    def _run_path(self, j: int, parent: str | None = None) -> str:
        return f"{parent}.{j}" if parent else os.path.join(self.folder, f"part-{j}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def add(self, text_digest: int, sig: np.ndarray, payload: bytes = b"",
            info: int = 0) -> None:
        """Spools one document: `digest(normalize(text))`, `signature(normalize(text))`,
        and what `kept_payloads` gives back if it is kept."""
        if self._finished:
            raise RuntimeError("add after finish")
        i = self._fill
        self._sig_buf[i] = sig
        self._dig_buf[i] = (text_digest >> 64, text_digest & _MASK64)
        self._spool.write(_SPOOL_HEADER.pack(len(payload), info))
        self._spool.write(payload)
        self._fill += 1
        if self._fill == len(self._sig_buf):
            self._flush()

    def _flush(self) -> None:
        n, b = self._fill, self.bands
        if not n:
            return
        sigs = self._sig_buf[:n]
        sigs.tofile(self._sig_file)
        k1 = np.empty((n, b + 1), np.uint64)
        k2 = np.zeros((n, b + 1), np.uint64)
        k1[:, :b] = self.band_keys(sigs)
        k1[:, b] = self._dig_buf[:n, 0]
        k2[:, b] = self._dig_buf[:n, 1]
        entries = np.empty(n * (b + 1), _ENTRY)
        entries["k1"] = k1.ravel()
        entries["k2"] = k2.ravel()
        entries["doc"] = np.repeat(np.arange(self.documents, self.documents + n,
                                             dtype=np.uint64), b + 1)
        entries["band"] = np.tile(np.arange(b + 1, dtype=np.uint16), n)
        self._scatter(entries, self._runs, 0)
        self.documents += n
        self._fill = 0

    def _scatter(self, entries: np.ndarray, files, depth: int) -> None:
        """Appends each entry to files[hash of its key, salted by depth % partitions]."""
        x = (entries["k1"] ^ (entries["k2"] * _MIX)
             ^ (entries["band"].astype(np.uint64) * _P)
             ^ np.uint64((0x2545F4914F6CDD1D * (depth + 1)) & _MASK64))
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
        part = (x % np.uint64(len(files))).astype(np.int64)
        order = np.argsort(part, kind="stable")
        ends = np.cumsum(np.bincount(part, minlength=len(files)))
        for f, chunk in zip(files, np.split(entries[order], ends[:-1])):
            if len(chunk):
                chunk.tofile(f)

    def _groups(self, path: str, depth: int, out: list) -> None:
        """Appends (docs, group ids, is digest group) of the shared keys in a partition
        file to `out`, splitting the file first when it is over partition_bytes."""
        size = os.path.getsize(path)
        if size > self.partition_bytes and depth < _MAX_SPLITS:
            self.split_partitions += 1
            children = [self._run_path(j, path) for j in range(self.partitions)]
            files = [open(c, "wb") for c in children]
            chunk = max(1, self.partition_bytes // _ENTRY.itemsize)
            with open(path, "rb") as f:
                while len(entries := np.fromfile(f, _ENTRY, chunk)):
                    self._scatter(entries, files, depth + 1)
            for f in files:
                f.close()
            os.remove(path)
            sizes = [os.path.getsize(c) for c in children]
            # One key in every entry (the same document many times over) does not split:
            # it is read whole, as the state for it grows with its documents anyway.
            deeper = depth + 1 if max(sizes) < size else _MAX_SPLITS
            for c in children:
                self._groups(c, deeper, out)
            return
        entries = np.fromfile(path, _ENTRY)
        os.remove(path)
        if not len(entries):
            return
        entries = entries[np.lexsort((entries["k2"], entries["k1"], entries["band"]))]
        new = np.ones(len(entries), bool)
        new[1:] = ((entries["band"][1:] != entries["band"][:-1])
                   | (entries["k1"][1:] != entries["k1"][:-1])
                   | (entries["k2"][1:] != entries["k2"][:-1]))
        group = np.cumsum(new) - 1
        shared = np.bincount(group)[group] >= 2
        out.append((entries["doc"][shared].astype(np.int64),
                    group[shared] + self._next_group,
                    entries["band"][shared] == self.bands))
        self._next_group += int(group[-1]) + 1

    def finish(self) -> None:
        """Decides every document added (the spool and the partitions are closed)."""
        if self._finished:
            return
        self._flush()
        self._finished = True
        for f in [self._spool, self._sig_file] + self._runs:
            f.close()
        found: list = []
        self._next_group = 0
        for j in range(self.partitions):
            self._groups(self._run_path(j), 0, found)
        docs = np.concatenate([d for d, _, _ in found] or [np.zeros(0, np.int64)])
        groups = np.concatenate([g for _, g, _ in found] or [np.zeros(0, np.int64)])
        is_digest = np.concatenate([e for _, _, e in found] or [np.zeros(0, bool)])
        del found
        order = np.lexsort((groups, docs))
        docs, groups, is_digest = docs[order], groups[order], is_digest[order]
        starts = np.append(np.flatnonzero(np.diff(docs, prepend=-1)), len(docs))

        def members():  # numpy arrays, not lists of Python ints: a third of the memory
            for s, e in zip(starts[:-1].tolist(), starts[1:].tolist()):
                g, digests = groups[s:e], is_digest[s:e]
                exact = int(g[digests][0]) if digests.any() else None
                yield int(docs[s]), exact, g[~digests].tolist()

        sigs = (np.memmap(self._sig_path, np.uint32, "r", shape=(self.documents,
                                                                 self.num_perm))
                if self.documents else None)
        dropped = list(greedy(members(), lambda d: sigs[d], self.min_equal))
        del sigs
        os.remove(self._sig_path)
        self._dropped = np.array([d for d, _ in dropped], np.int64)
        self._reasons = np.array([1 if r == "exact" else 2 for _, r in dropped], np.uint8)
        self.exact = int(np.count_nonzero(self._reasons == 1))
        self.near = len(dropped) - self.exact
        self.kept = self.documents - len(dropped)

    def decisions(self) -> list[str | None]:
        """Deduplicator.check's answer for every document, in order (after finish)."""
        out: list[str | None] = [None] * self.documents
        for d, r in zip(self._dropped.tolist(), self._reasons.tolist()):
            out[d] = "exact" if r == 1 else "near"
        return out

    def kept_payloads(self):
        """(payload, info) of the kept documents, in input order (after finish)."""
        if not self._finished:
            raise RuntimeError("kept_payloads before finish")
        dropped = self._dropped.tolist() + [-1]
        j = 0
        with open(os.path.join(self.folder, "spool"), "rb") as f:
            for doc in range(self.documents):
                size, info = _SPOOL_HEADER.unpack(f.read(_SPOOL_HEADER.size))
                if doc == dropped[j]:
                    f.seek(size, os.SEEK_CUR)
                    j += 1
                    continue
                yield f.read(size), info

    def close(self) -> None:
        """Removes the folder and everything in it."""
        for f in [self._spool, self._sig_file] + self._runs:
            if f is not None:
                f.close()
        shutil.rmtree(self.folder, ignore_errors=True)
