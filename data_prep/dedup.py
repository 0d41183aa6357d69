"""Exact and near-duplicate document removal for the corpus front door.

    dedup = Deduplicator(threshold=0.8)
    for doc in docs:
        if dedup.check(doc) is None:
            keep(doc)
    print(dedup.kept, dedup.exact, dedup.near)

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

Memory per kept document: its signature (4 bytes x `num_perm`, in blocks of a numpy
array), an entry in each of the `b` band tables (a 64-bit key object and a dict slot) and
a 128-bit digest of the normalized text in a set: about 1.5 KB at the defaults, about
9 GB for English Wikipedia. Dedup is per process: run it where all documents pass (the
front door's single writer), or shard the corpus by a hash of the text first.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

_P = np.uint64(0x100000001B3)  # the polynomial hash's base (odd: invertible mod 2^64)
_P_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier of the final mix
_BLOCK = 1024  # signatures per block of the signature store


def normalize(text: str) -> str:
    """The form that exact duplicates share: casefolded, whitespace runs made one space."""
    return " ".join(text.casefold().split())


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


class Deduplicator:
    """Remembers the documents it kept; says whether a new one duplicates one of them."""

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
        self._tables: list[dict[int, int | list[int]]] = [{} for _ in range(self.bands)]
        self._blocks: list[np.ndarray] = []
        self._digests: set[int] = set()
        # A near duplicate needs this many equal signature values.
        self._min_equal = int(np.ceil(threshold * num_perm - 1e-9))
        self._pow = self._inv = np.zeros(0, np.uint64)
        self.kept = 0
        self.exact = 0
        self.near = 0

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

    def _stored(self, key: int) -> np.ndarray:
        return self._blocks[key // _BLOCK][key % _BLOCK]

    def check(self, text: str) -> str | None:
        """None: new (now remembered); "exact" or "near": a duplicate of a kept document."""
        norm = normalize(text)
        digest = int.from_bytes(hashlib.blake2b(norm.encode("utf-8"), digest_size=16).digest())
        if digest in self._digests:
            self.exact += 1
            return "exact"
        sig = self.signature(norm)
        bands = sig[:self.bands * self.rows].reshape(self.bands, self.rows).astype(np.uint64)
        keys = (bands * self._band_mult).sum(axis=1).tolist()
        candidates = set()
        for table, k in zip(self._tables, keys):
            hit = table.get(k)
            if isinstance(hit, list):
                candidates.update(hit)
            elif hit is not None:
                candidates.add(hit)
        for c in sorted(candidates):
            if int(np.count_nonzero(self._stored(c) == sig)) >= self._min_equal:
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
        self._digests.add(digest)
        self.kept += 1
        return None
