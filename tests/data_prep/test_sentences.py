"""data_prep/sentences.py: the front door's sentence splitter, and the benchmark that chose it."""

import re
import subprocess
import sys

import pytest

from data_prep.sentences import LANGUAGES, SentenceSplitter
from tests.conftest import REPO


@pytest.fixture(scope="module")
def en():
    return SentenceSplitter("en")


@pytest.mark.parametrize("text, sentences", [
    ("Mr. Hale arrived at nine. Dr. Okafor was waiting for him on St. Anne's Road.",
     ["Mr. Hale arrived at nine.", "Dr. Okafor was waiting for him on St. Anne's Road."]),
    ("The ticket cost $2.50 in 1998. Pi is about 3.14159. It is known to trillions of digits.",
     ["The ticket cost $2.50 in 1998.", "Pi is about 3.14159.",
      "It is known to trillions of digits."]),
    ("J. R. R. Tolkien taught at Oxford. The U.S. Senate has 100 members.",
     ["J. R. R. Tolkien taught at Oxford.", "The U.S. Senate has 100 members."]),
    ('"Stop." he said. She did not stop. "Why should I?" she asked.',
     ['"Stop." he said.', "She did not stop.", '"Why should I?" she asked.']),
    ("I waited... and waited. Nobody came. Some words are hard, e.g. \"necessary\", "
     "i.e. they mislead. Bring a map, water, etc. if you go.",
     ["I waited... and waited.", "Nobody came.",
      "Some words are hard, e.g. \"necessary\", i.e. they mislead.",
      "Bring a map, water, etc. if you go."]),
    ("The committee met (its first meeting since March). Three members were absent.",
     ["The committee met (its first meeting since March).", "Three members were absent."]),
    # The English repairs: a list marker joins its item; abbreviations sentencex splits after.
    ("The steps are simple. 1. Remove the cover. 2. Disconnect the battery.",
     ["The steps are simple.", "1. Remove the cover.", "2. Disconnect the battery."]),
    ("The chair, Ms. Rivera, spoke. It costs approx. $12,000 (see Vol. 2 of the report).",
     ["The chair, Ms. Rivera, spoke.", "It costs approx. $12,000 (see Vol. 2 of the report)."]),
    # ... but an abbreviation that ends a sentence stays its end.
    ("We were delayed by 3 hrs. because of fog. The walk takes 6 hrs. There is no shop.",
     ["We were delayed by 3 hrs. because of fog.", "The walk takes 6 hrs.",
      "There is no shop."]),
    ("Mail help.desk@example.org or see https://www.example.com/a/b.html for it. Thanks.",
     ["Mail help.desk@example.org or see https://www.example.com/a/b.html for it.",
      "Thanks."]),
])
def test_english_cases(en, text, sentences):
    assert en.split(text) == sentences


def test_whitespace_paragraphs_and_empty(en):
    text = "A Heading\n\nThe first line\nwraps here.   Then\tanother.\n\n\n  \n"
    assert en.split(text) == ["A Heading", "The first line wraps here.", "Then another."]
    assert en.split("") == [] and en.split(" \n\n \t") == []
    # A repair never joins across a blank line.
    assert en.split("Read Vol.\n\n2 pages later it ends.") == ["Read Vol.",
                                                                "2 pages later it ends."]


def test_deterministic_and_named(en):
    text = (REPO / "benchmarks" / "data" / "sentences_en_heldout.txt").read_text()
    first = en.split(text)
    assert first == SentenceSplitter("en").split(text) == en.split(text)
    assert all(s == s.strip() and "\n" not in s and s for s in first)
    assert en.name == "sentencex" and re.fullmatch(r"\d+\.\d+\.\d+", en.version)


def test_other_languages_and_an_unsupported_one():
    assert "de" in LANGUAGES
    assert SentenceSplitter("de").split("Das ist z.B. ein Test. Wie geht es dir?") == [
        "Das ist z.B. ein Test.", "Wie geht es dir?"]
    with pytest.raises(ValueError, match=r"language 'xx' is not supported by sentencex; "
                                         r"supported: am, ar, .*\ben\b.*, uk$"):
        SentenceSplitter("xx")


def test_benchmark_table():
    """The benchmark at a tiny size: one row per splitter; the chosen one marked and well
    ahead of splitting on '. ' on the held-out text."""
    out = subprocess.run([sys.executable, "benchmarks/sentence_split.py", "--mb=0.02",
                          "--repeats=1"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["splitter"])
    assert lines[header].split()[-6:] == ["P", "R", "F1", "F1", "dev", "MB/s"]
    rows = {}
    for line in lines[header + 1:]:
        label = line[2:36].strip()
        rows[label] = (line[0], line[36:].split())
    assert list(rows) == ["split on '. '", "regex rule (old prepare_corpus)", "pysbd", "syntok",
                          "blingfire", "sentencex", "SentenceSplitter"]
    assert [mark for mark, _ in rows.values()] == [" "] * 6 + ["*"]
    numbers = {}
    for label, (_, cells) in rows.items():
        if cells[:2] == ["not", "installed"]:
            assert label not in ("split on '. '", "regex rule (old prepare_corpus)",
                                 "SentenceSplitter", "sentencex")
            continue
        values = [float(c) for c in cells[-5:]]
        assert all(0 <= v <= 1 for v in values[:4]) and values[4] > 0, (label, values)
        numbers[label] = values
    chosen, naive = numbers["SentenceSplitter"], numbers["split on '. '"]
    assert chosen[2] >= naive[2] + 0.05  # held-out F1
    assert chosen[3] >= naive[3] + 0.05  # dev F1
