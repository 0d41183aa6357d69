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

Near duplicates: MinHash signatures indexed by datasketch's MinHashLSH, its banding chosen
for recall (at the default threshold, a pair with Jaccard similarity 0.9 is a candidate
with probability 0.999, 0.85 with 0.975). The LSH gives candidates; a candidate counts only when the
two signatures agree on >= threshold of their `num_perm` values, so the banding's false
positives are not dropped. The signature is computed with numpy in one pass per document
(datasketch's `MinHash.update_batch` hashes every shingle with SHA-1 in Python, which alone
would take most of the front door's time budget): a shingle's hash is a polynomial hash of
its UTF-8 bytes mod 2^64, all shingles at once from prefix sums, mixed down to 32 bits;
the `num_perm` permutations are affine maps mod 2^32 with odd multipliers (datasketch's
own "affine32" scheme).

Memory per kept document: a 16-byte digest of the normalized text (exact duplicates), its
signature (4 bytes x `num_perm`: 512 bytes at the default) and one entry in each of the LSH
band tables (9 bands at the defaults, each a key of 8 bytes after hashing the band). With
Python's object overhead that is about 1.5 KB per document: about 9 GB for English
Wikipedia's ~6M articles. Dedup is per process: run it where all documents pass (the
front door's single writer), or shard the corpus by a hash of the text first.
"""

from __future__ import annotations

import hashlib

import numpy as np
from datasketch import LeanMinHash, MinHashLSH

_P = np.uint64(0x100000001B3)  # the polynomial hash's base (odd: invertible mod 2^64)
_P_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd 64-bit multiplier of the final mix


def normalize(text: str) -> str:
    """The form that exact duplicates share: casefolded, whitespace runs made one space."""
    return " ".join(text.casefold().split())


def _band_hash(band: bytes) -> bytes:
    """An LSH band's key: 8 bytes instead of the band's 4 x r bytes."""
    return hashlib.blake2b(band, digest_size=8).digest()


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
        # Banding that misses few pairs above the threshold (weights: false positives,
        # false negatives): its extra candidates are checked on the signatures anyway.
        self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=(0.1, 0.9),
                               hashfunc=_band_hash)
        self._digests: set[bytes] = set()
        self._signatures: list[np.ndarray] = []
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

    def check(self, text: str) -> str | None:
        """None: new (now remembered); "exact" or "near": a duplicate of a kept document."""
        norm = normalize(text)
        digest = hashlib.blake2b(norm.encode("utf-8"), digest_size=16).digest()
        if digest in self._digests:
            self.exact += 1
            return "exact"
        sig = self.signature(norm)
        minhash = LeanMinHash(seed=self.seed, hashvalues=sig, scheme="affine32")
        for key in sorted(self._lsh.query(minhash)):
            if int(np.count_nonzero(self._signatures[key] == sig)) >= self._min_equal:
                self.near += 1
                return "near"
        key = len(self._signatures)
        self._signatures.append(sig)
        self._lsh.insert(key, minhash, check_duplication=False)
        self._digests.add(digest)
        self.kept += 1
        return None
