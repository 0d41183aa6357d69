"""Near-duplicate removal: documents/s, MB/s and memory per kept document.

    python benchmarks/dedup_speed.py              # 5,000 documents of ~2 KB
    python benchmarks/dedup_speed.py --docs=300   # a quick run

Documents: `--words`-word windows of the sample corpus (data_prep/sample_corpus) at seeded
random offsets, each with one word replaced by its number, so that many overlap a little
and some a lot (near duplicates, exercising the candidate check). Two implementations of
the same algorithm (word 5-gram MinHash, 128 permutations, LSH banding for threshold 0.8
weighted towards recall, candidates confirmed on the signatures):
- data_prep.dedup.Deduplicator, the front door's;
- datasketch's MinHash (`update_batch`, SHA-1 per shingle) and MinHashLSH, if installed.
Speed is one thread's wall time over all documents. Memory, in a second run: what
tracemalloc counts as allocated, its growth over the second half of the documents divided
by the documents kept in that half (fixed costs left out).
"""

from __future__ import annotations

import os
import random
import sys
import time
import tracemalloc

if __package__ in (None, ""):  # run as a script: make `data_prep` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from data_prep.dedup import Deduplicator, normalize  # noqa: E402

SAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "data_prep", "sample_corpus")


def documents(n: int, words: int, seed: int = 0) -> list[str]:
    w = []
    for name in sorted(os.listdir(SAMPLE)):
        if name.endswith(".txt"):
            with open(os.path.join(SAMPLE, name), encoding="utf-8") as f:
                w += f.read().split()
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        start = rng.randrange(len(w) - words)
        doc = w[start:start + words]
        doc[rng.randrange(words)] = str(i)
        docs.append(" ".join(doc))
    return docs


class DatasketchDedup:
    """The same algorithm on datasketch's MinHash and MinHashLSH."""

    def __init__(self, threshold=0.8, num_perm=128, shingle=5, seed=1):
        from datasketch import MinHash, MinHashLSH

        self._minhash = MinHash
        self._template = MinHash(num_perm=num_perm, seed=seed)
        self._lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=(0.1, 0.9))
        self._sigs = {}
        self._digests = set()
        self.threshold, self.num_perm, self.shingle, self.seed = threshold, num_perm, shingle, seed
        self.kept = self.exact = self.near = 0

    def check(self, text):
        import hashlib

        norm = normalize(text)
        digest = hashlib.blake2b(norm.encode(), digest_size=16).digest()
        if digest in self._digests:
            self.exact += 1
            return "exact"
        w = norm.split(" ")
        k = min(self.shingle, len(w))
        m = self._minhash(num_perm=self.num_perm, seed=self.seed,
                          permutations=self._template.permutations, scheme="affine32")
        m.update_batch([" ".join(w[i:i + k]).encode() for i in range(len(w) - k + 1)])
        for key in sorted(self._lsh.query(m)):
            if (self._sigs[key] == m.hashvalues).mean() >= self.threshold:
                self.near += 1
                return "near"
        self._lsh.insert(self.kept, m, check_duplication=False)
        self._sigs[self.kept] = m.hashvalues
        self._digests.add(digest)
        self.kept += 1
        return None


FLAGS = flags.FLAGS


def main(argv):
    del argv
    docs = documents(FLAGS.docs, FLAGS.words)
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    print(f"{len(docs)} documents, {mb / len(docs) * 1e6:.0f} bytes each on average, "
          f"{mb:.2f} MB; single thread")
    print(f"  {'implementation':<28}{'docs/s':>9}{'MB/s':>8}{'kept':>7}{'near':>7}"
          f"{'exact':>7}{'B/kept doc':>12}")
    for label, make in (("data_prep.dedup", Deduplicator), ("datasketch", DatasketchDedup)):
        try:
            d = make()
        except ImportError as e:
            print(f"  {label:<28}not installed ({e.name})")
            continue
        start = time.perf_counter()
        for doc in docs:
            d.check(doc)
        seconds = time.perf_counter() - start
        tracemalloc.start()
        m = make()
        half = len(docs) // 2
        for doc in docs[:half]:
            m.check(doc)
        mem, kept = tracemalloc.get_traced_memory()[0], m.kept
        for doc in docs[half:]:
            m.check(doc)
        per_doc = (tracemalloc.get_traced_memory()[0] - mem) / max(m.kept - kept, 1)
        tracemalloc.stop()
        print(f"  {label:<28}{len(docs) / seconds:9.0f}{mb / seconds:8.2f}{d.kept:7d}"
              f"{d.near:7d}{d.exact:7d}{per_doc:12.0f}", flush=True)
    return 0


if __name__ == "__main__":
    flags.DEFINE_integer("docs", 5000, "Number of documents.")
    flags.DEFINE_integer("words", 330, "Words per document (330: about 2 KB of English).")
    app.run(main)
