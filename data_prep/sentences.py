"""Sentence splitting for the corpus front door.

    splitter = SentenceSplitter("en")
    splitter.split('Dr. Smith paid $2.50 on p. 4. "Stop." he said.')
    # ['Dr. Smith paid $2.50 on p. 4.', '"Stop." he said.']

`split(text)` takes a paragraph or a whole document and returns its sentences, stripped,
non-empty, with every run of whitespace (newlines included) made one space. A blank line
always ends a sentence (a heading without a full stop stays a sentence of its own). The
result depends only on the text and the language.

The library: sentencex (Wikimedia's rule-based segmenter, compiled Rust). Measured by
benchmarks/sentence_split.py on labelled English full of hard cases:
- pysbd and syntok are as good or a little better on hard cases, but pure Python and one
  to two orders of magnitude slower: at their speed sentence splitting alone would take
  longer than the whole front door may;
- blingfire is as good and as fast, but it is one model for all languages, a 40 MB
  wheel with an x86-64 binary only (it does not load on ARM hosts), and unmaintained;
- sentencex has rules per language (`LANGUAGES`), wheels for every platform, and keeps
  what matters in encyclopaedic and book text (titles, initials, decimals and prices,
  quotes followed by "he said", ellipses).
For English, a short pass after it repairs the splits it gets wrong most often: a numbered
list's marker ("1.") made a sentence of its own, and a break after an abbreviation missing
from its English list (approx., vol., ed., hrs., Ms., ...) when what follows cannot start a
sentence (a lowercase word, a digit, a comma).
"""

from __future__ import annotations

import functools
import re
from importlib import metadata

# Languages with their own rules in sentencex (abbreviations, sentence-final marks).
LANGUAGES = ("am", "ar", "bg", "bn", "ca", "da", "de", "el", "en", "es", "fi", "fr", "gu",
             "hi", "hy", "it", "ja", "kk", "kn", "ml", "mr", "my", "nl", "pa", "pl", "pt",
             "ru", "sk", "ta", "te", "uk")

# A numbered list's marker alone ("1.", "(2)", "3)"): belongs to the sentence after it.
_LIST_MARKER = re.compile(r"\(?\d{1,3}[.)]")
# Titles that never end a sentence.
_TITLES = ("Ms.", "Mx.", "Messrs.")
# Abbreviations sentencex's English rules split after; joined to what follows only when
# that cannot start a sentence (_CONTINUES), since most of them can also end one.
_ABBREVIATIONS = frozenset(
    w + "." for w in ("approx vol vols ed eds est ft hrs ch sq no nos p pp mon tue tues "
                      "wed thu thur thurs fri sat sun").split())
_CONTINUES = frozenset("abcdefghijklmnopqrstuvwxyz0123456789$€£%,;:)]–")
# What cannot start a sentence after any break.
_PUNCT_START = frozenset(",;:)]–")


def _join_en(pieces: list[str]) -> list[str]:
    """English repairs over sentencex's stripped pieces of one paragraph. The common case
    (the previous piece ends in ".", "!" or "?" and the next starts with a capital) costs a
    few character tests."""
    out = [pieces[0]]
    for piece in pieces[1:]:
        prev = out[-1]
        first = piece[0]
        if first in _PUNCT_START:
            join = True
        elif len(prev) <= 5 and _LIST_MARKER.fullmatch(prev):
            join = True
        elif prev[-1] != ".":
            join = False
        elif first in _CONTINUES:
            last = prev[prev.rfind(" ") + 1:].lstrip("(")
            join = last.lower() in _ABBREVIATIONS or last in _TITLES
        else:
            join = (prev.endswith(_TITLES)
                    and prev[prev.rfind(" ") + 1:].lstrip("(") in _TITLES)
        if join:
            out[-1] = prev + " " + piece
        else:
            out.append(piece)
    return out


class SentenceSplitter:
    """Splits text into sentences for one language."""

    name = "sentencex"
    languages = LANGUAGES

    def __init__(self, language: str = "en"):
        if language not in LANGUAGES:
            raise ValueError(f"sentence splitting: language {language!r} is not supported "
                             f"by {self.name}; supported: {', '.join(LANGUAGES)}")
        self.language = language
        # sentencex is imported where text is split, not with this module, which the
        # pre-training task imports (through data_prep): a machine that only builds and
        # times models (gpu_suite on a GPU image without sentencex) then needs none of it.
        self.version = metadata.version("sentencex")

    def split(self, text: str) -> list[str]:
        out: list[str] = []
        paragraph: list[str] = []
        import sentencex  # see __init__

        for piece in sentencex.segment(self.language, text):
            piece = " ".join(piece.split())
            if piece:
                paragraph.append(piece)
            elif paragraph:  # a paragraph break: no repair joins across it
                out += _join_en(paragraph) if self.language == "en" else paragraph
                paragraph = []
        if paragraph:
            out += _join_en(paragraph) if self.language == "en" else paragraph
        return out


@functools.lru_cache(maxsize=None)
def splitter(language: str) -> SentenceSplitter:
    """The SentenceSplitter of `language`, made once per process (a worker cleans many
    documents with it); ValueError for a language without rules, as SentenceSplitter's."""
    return SentenceSplitter(language)
