"""Sentence splitters compared: boundary precision / recall / F1 and MB/s of a single thread.

    python benchmarks/sentence_split.py            # quality on the labelled text, speed on ~4 MB
    python benchmarks/sentence_split.py --mb=0.05  # a quick run

Quality: two files of English text, one sentence per line, paragraphs separated by blank
lines, written to contain the cases that break simple rules (abbreviations, decimals and
prices, initials, quotes with dialogue tags, ellipses, parentheses, numbered lists, URLs
and e-mail addresses). benchmarks/data/sentences_en.txt is the development set: its
errors chose the library and the English repairs in data_prep/sentences.py.
benchmarks/data/sentences_en_heldout.txt was written after those were fixed and was never
used to change them: its precision / recall / F1 are the honest numbers (F1 dev is shown
beside them). Each paragraph's sentences are
joined with one space and given to the splitter; a boundary is the position (counted in
non-space characters, so that a splitter's own whitespace handling does not matter) where
one sentence ends and the next begins. The end of a paragraph is not counted: every
splitter gets it right. Precision, recall and F1 are over all paragraphs' boundaries.

Speed: the sample corpus (data_prep/sample_corpus) cut into blank-line paragraphs and
repeated to --mb megabytes, each paragraph split by its own call, as the corpus front
door does; MB/s is UTF-8 bytes in over wall time in a single process and
thread, the best of --repeats runs (a run stops after --max_seconds). A library that is not installed is one row saying so.

The row marked `*` is data_prep.sentences.SentenceSplitter, the front door's choice.
"""

from __future__ import annotations

import os
import re
import sys
import time

if __package__ in (None, ""):  # run as a script: make `data_prep` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
DEV = os.path.join(DATA, "sentences_en.txt")
HELDOUT = os.path.join(DATA, "sentences_en_heldout.txt")
SAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "data_prep", "sample_corpus")

# The rule data_prep/prepare_corpus.py used before the front door had a library: end
# punctuation, whitespace, then (after an optional quote or bracket) a capital.
_RULE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z])")


def _naive(text):
    parts = text.split(". ")
    return [p + "." for p in parts[:-1]] + parts[-1:]


def _rule(text):
    return _RULE.split(" ".join(text.split()))


def _pysbd():
    import pysbd

    seg = pysbd.Segmenter(language="en", clean=False)
    return seg.segment, "pysbd " + getattr(pysbd, "__version__", "")


def _blingfire():
    import blingfire
    from importlib.metadata import version

    return (lambda text: blingfire.text_to_sentences(text).split("\n"),
            "blingfire " + version("blingfire"))


def _syntok():
    from importlib.metadata import version

    from syntok import segmenter

    def split(text):
        return ["".join(t.spacing + t.value for t in s)
                for p in segmenter.process(text) for s in p]
    return split, "syntok " + version("syntok")


def _sentencex():
    from importlib.metadata import version

    import sentencex

    return (lambda text: list(sentencex.segment("en", text)),
            "sentencex " + version("sentencex"))


def _chosen():
    from data_prep.sentences import SentenceSplitter

    s = SentenceSplitter("en")
    return s.split, f"{s.name} {s.version}"


# (label, factory returning (split, "name version"))
SPLITTERS = [
    ("split on '. '", lambda: (_naive, "str.split")),
    ("regex rule (old prepare_corpus)", lambda: (_rule, "re")),
    ("pysbd", _pysbd),
    ("syntok", _syntok),
    ("blingfire", _blingfire),
    ("sentencex", _sentencex),
    ("SentenceSplitter", _chosen),
]


def read_labelled(path: str) -> list[list[str]]:
    """Paragraphs, each a list of sentences."""
    with open(path, encoding="utf-8") as f:
        blocks = f.read().split("\n\n")
    return [[line.strip() for line in b.splitlines() if line.strip()] for b in blocks
            if b.strip()]


def _ends(sentences) -> set[int]:
    """Sentence-end positions, in non-space characters, the paragraph's end excluded."""
    ends, n = set(), 0
    for s in sentences:
        n += len("".join(s.split()))
        ends.add(n)
    ends.discard(n)
    return ends


def boundary_scores(split, paragraphs) -> tuple[float, float, float]:
    tp = fp = fn = 0
    for sentences in paragraphs:
        gold = _ends(sentences)
        pred = _ends([s for s in split(" ".join(sentences)) if s.strip()])
        tp += len(gold & pred)
        fp += len(pred - gold)
        fn += len(gold - pred)
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def speed_text(mb: float) -> list[str]:
    """Blank-line paragraphs of the sample corpus (lines joined), repeated to `mb` MB."""
    paras = []
    for name in sorted(os.listdir(SAMPLE)):
        if name.endswith(".txt"):
            with open(os.path.join(SAMPLE, name), encoding="utf-8") as f:
                paras += [" ".join(b.split()) for b in f.read().split("\n\n") if b.strip()]
    target = int(mb * 1e6)
    out, total = [], 0
    while total < target:
        for p in paras:
            out.append(p)
            total += len(p.encode("utf-8")) + 1
            if total >= target:
                break
    return out


def throughput(split, paras, repeats: int = 1, max_seconds: float = float("inf")) -> float:
    """MB/s, the best of `repeats` passes; a pass stops after `max_seconds` (slow splitters
    are measured on the paragraphs they got through)."""
    best = 0.0
    for _ in range(repeats):
        nbytes, start = 0, time.perf_counter()
        for p in paras:
            split(p)
            nbytes += len(p.encode("utf-8"))
            if time.perf_counter() - start > max_seconds:
                break
        best = max(best, nbytes / (time.perf_counter() - start) / 1e6)
    return best


FLAGS = flags.FLAGS


def main(argv):
    del argv
    dev, heldout = read_labelled(DEV), read_labelled(HELDOUT)
    paras = speed_text(FLAGS.mb)
    for name, paragraphs in (("held-out", heldout), ("dev", dev)):
        print(f"{name}: {sum(len(p) for p in paragraphs)} sentences, {len(paragraphs)} "
              f"paragraphs, {sum(len(p) - 1 for p in paragraphs)} boundaries")
    print(f"speed: sample corpus paragraphs, {sum(len(p.encode()) for p in paras) / 1e6:.2f} "
          f"MB, single thread, best of {FLAGS.repeats}")
    print(f"  {'splitter':<34}{'library':<20}{'P':>7}{'R':>7}{'F1':>7}{'F1 dev':>8}"
          f"{'MB/s':>8}")
    for label, factory in SPLITTERS:
        mark = "*" if label == "SentenceSplitter" else " "
        try:
            split, lib = factory()
        except ImportError as e:
            print(f"{mark} {label:<34}not installed ({e.name})")
            continue
        p, r, f1 = boundary_scores(split, heldout)
        f1_dev = boundary_scores(split, dev)[2]
        mbs = throughput(split, paras, FLAGS.repeats, FLAGS.max_seconds)
        print(f"{mark} {label:<34}{lib:<20}{p:7.3f}{r:7.3f}{f1:7.3f}{f1_dev:8.3f}{mbs:8.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    flags.DEFINE_float("mb", 4.0, "Megabytes of text for the speed measurement.")
    flags.DEFINE_integer("repeats", 3, "Speed: the best of this many runs.")
    flags.DEFINE_float("max_seconds", 20.0, "Speed: a run stops after this long (for the "
                       "slow splitters).")
    app.run(main)
