"""data_prep/dedup.py: exact and near-duplicate documents removed, others kept."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from data_prep.dedup import Deduplicator, DiskDeduplicator, digest, lsh_bands, normalize
from tests.conftest import REPO
from tests.data_prep.helpers import mixed_corpus, passages


def _jaccard(a: str, b: str, k: int = 5) -> float:
    """The exact Jaccard similarity of two texts' word k-gram sets (what MinHash estimates)."""
    sa, sb = ({tuple(w[i:i + k]) for i in range(len(w) - k + 1)}
              for w in (normalize(a).split(), normalize(b).split()))
    return len(sa & sb) / len(sa | sb)


def _edit(doc: str, positions, word: str = "zyzzyva") -> str:
    w = doc.split()
    for i in positions:
        w[i] = word
    return " ".join(w)


def test_exact_duplicates_after_case_and_whitespace():
    d = Deduplicator()
    doc = passages(1)[0]
    assert d.check(doc) is None
    assert d.check(doc) == "exact"
    assert d.check("  " + doc.upper().replace(" ", " \n\t ") + "\n") == "exact"
    assert normalize(" A\tb\n\nC ") == "a b c"
    assert (d.kept, d.exact, d.near) == (1, 2, 0)


def test_near_duplicates_removed_unrelated_kept():
    docs = passages(40)
    d = Deduplicator()
    assert [d.check(doc) for doc in docs] == [None] * 40  # unrelated passages all kept
    # A few words changed (each in up to 5 shingles): Jaccard ~0.9 > 0.8.
    near = [_edit(docs[3], [10, 150, 290]), _edit(docs[7], [0, 1, 2, 100, 200, 299], "the")]
    assert [round(_jaccard(a, b), 2) for a, b in zip(near, (docs[3], docs[7]))] == [0.9, 0.94]
    assert [d.check(doc) for doc in near] == ["near", "near"]
    # Every 8th word changed: a different document at the default threshold.
    far = _edit(docs[5], range(0, 300, 8))
    assert _jaccard(far, docs[5]) < 0.3
    assert d.check(far) is None
    assert (d.kept, d.exact, d.near) == (41, 0, 2)


def test_threshold_decides():
    doc = passages(1)[0]
    edited = _edit(doc, range(0, 300, 30))  # 10 words changed
    assert round(_jaccard(doc, edited), 2) == 0.73
    strict, loose = Deduplicator(threshold=0.9), Deduplicator(threshold=0.5)
    for d in (strict, loose):
        d.check(doc)
    assert strict.check(edited) is None and loose.check(edited) == "near"


def test_banding_and_candidates_against_brute_force():
    """Overlapping windows of one text (many pairs near the threshold, shared buckets):
    every "near" is a kept document whose signature agrees on >= 80%, and LSH finds
    nearly all of those."""
    assert lsh_bands(0.8, 128) == (14, 9)  # recall-weighted
    assert lsh_bands(0.8, 128, 0.5, 0.5) == (9, 13)  # datasketch MinHashLSH's default
    w = (REPO / "data_prep" / "sample_corpus" / "britannica.txt").read_text().split()
    docs = [" ".join(w[i:i + 200]) for i in range(0, 8000, 7)]
    d = Deduplicator()
    kept, missed, found = np.zeros((0, 128), np.uint32), 0, 0
    for doc in docs:
        sig = d.signature(normalize(doc))
        best = (kept == sig).sum(axis=1).max(initial=0)
        answer = d.check(doc)
        if answer == "near":
            assert best >= 0.8 * 128
            found += 1
        else:
            assert answer is None
            missed += best >= 0.8 * 128
            kept = np.vstack([kept, sig])
    assert any(isinstance(v, list) for table in d._tables for v in table.values())
    assert found > 700 and missed <= 0.05 * found, (found, missed)
    assert (d.kept, d.near) == (len(kept), found)


def test_short_and_empty_documents():
    d = Deduplicator()
    assert d.check("") is None and d.check("  \n") == "exact"
    assert d.check("two words") is None and d.check("Two  WORDS") == "exact"
    assert d.check("two other words") is None
    with pytest.raises(ValueError, match="threshold=1.5"):
        Deduplicator(threshold=1.5)


def _disk_decisions(docs, folder, **kw) -> tuple[list, DiskDeduplicator]:
    with DiskDeduplicator(str(folder), **kw) as d:
        for i, doc in enumerate(docs):
            norm = normalize(doc)
            d.add(digest(norm), d.signature(norm), doc.encode(), i)
        d.finish()
        kept = list(d.kept_payloads())
        answers = d.decisions()
    assert not folder.exists()  # close removes its files
    assert kept == [(doc.encode(), i) for i, (doc, a) in enumerate(zip(docs, answers))
                    if a is None]
    return answers, d


def test_disk_deduplicator_decides_as_deduplicator(tmp_path):
    """The out-of-core index gives check's answers, document for document, and hands back
    the kept documents' payloads in order."""
    docs = mixed_corpus()
    ref = Deduplicator()
    expected = [ref.check(doc) for doc in docs]
    assert ref.kept > 250 and ref.exact > 50 and ref.near > 100
    # A block boundary inside the corpus, few partitions: entries of every kind mixed.
    answers, d = _disk_decisions(docs, tmp_path / "spool", partitions=3, block=100)
    assert answers == expected
    assert (d.documents, d.kept, d.exact, d.near) == (len(docs), ref.kept, ref.exact, ref.near)
    assert d.split_partitions == 0


def test_partitions_over_the_budget_are_split_again(tmp_path):
    """A partition file bigger than partition_bytes is re-partitioned by another hash (and
    again, while it is too big) before it is read: the same answers. One key in every entry
    (the same text many times) cannot be split; it is read whole."""
    docs = mixed_corpus(1)[:500]
    ref = Deduplicator()
    expected = [ref.check(doc) for doc in docs]
    answers, d = _disk_decisions(docs, tmp_path / "a", partitions=2, partition_bytes=4000)
    assert answers == expected and d.split_partitions > 20
    same = ["one text, again and again " * 20] * 300
    answers, d = _disk_decisions(same, tmp_path / "b", partitions=2, partition_bytes=4000)
    assert answers == [None] + ["exact"] * 299


_SCRIPT = """
import json
from data_prep.dedup import Deduplicator, normalize
w = open("data_prep/sample_corpus/britannica.txt", encoding="utf-8").read().split()
docs = [" ".join(w[i * 300:(i + 1) * 300]) for i in range(20)]
for i in range(0, 20, 3):
    e = docs[i].split()
    e[i] = e[100 + i] = e[200 + i] = "zyzzyva"
    docs.append(" ".join(e))
docs += docs[:2]
d = Deduplicator()
print(json.dumps([[d.check(doc) for doc in docs], d.signature(normalize(docs[0])).tolist()]))
"""


def test_deterministic_across_processes():
    """The same documents in the same order: the same answers and signatures, whatever
    Python's string hash seed."""
    outs = [json.loads(subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}).stdout)
        for seed in ("1", "2")]
    assert outs[0] == outs[1]
    assert outs[0][0] == [None] * 20 + ["near"] * 7 + ["exact"] * 2
    assert len(outs[0][1]) == 128


def test_benchmark_table():
    out = subprocess.run([sys.executable, "benchmarks/dedup_speed.py", "--docs=300"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("300 documents, ")
    assert lines[1].split() == ["implementation", "docs/s", "MB/s", "kept", "near", "exact",
                                "B/kept", "doc"]
    ours = lines[2].split()
    assert ours[0] == "data_prep.dedup" and len(ours) == 7
    assert float(ours[1]) > 0 and int(ours[3]) + int(ours[4]) + int(ours[5]) == 300
    assert 500 < float(ours[6]) < 5000  # bytes per kept document
    assert lines[3].split()[0] == "datasketch" and len(lines) == 4
