"""Sentence splitting for the corpus front door.

    splitter = SentenceSplitter("en")
    splitter.split('Dr. Smith paid $2.50. "Stop." he said.')
    # ['Dr. Smith paid $2.50.', '"Stop." he said.']

`split(text)` takes a paragraph or a whole document and returns its sentences, stripped,
non-empty, with every run of whitespace (newlines included) made one space. The result
depends only on the text and the language.

The library: sentencex (Wikimedia's rule-based segmenter, compiled Rust). It keeps the
cases pre-training text is full of (titles and other abbreviations, decimals and prices,
initials, quotes, ellipses) and is fast enough to be a small part of the front door's
time; the pure-Python segmenters (pysbd, syntok) are as good or better on hard cases but
far too slow for corpora of many gigabytes. It has rules for many languages;
`SentenceSplitter.languages` lists the codes accepted here.
"""

from __future__ import annotations

from importlib import metadata

import sentencex

# Languages with their own rules in sentencex (abbreviations, sentence-final marks).
LANGUAGES = ("am", "ar", "bg", "bn", "ca", "da", "de", "el", "en", "es", "fi", "fr", "gu",
             "hi", "hy", "it", "ja", "kk", "kn", "ml", "mr", "my", "nl", "pa", "pl", "pt",
             "ru", "sk", "ta", "te", "uk")


class SentenceSplitter:
    """Splits text into sentences for one language."""

    name = "sentencex"
    version = metadata.version("sentencex")
    languages = LANGUAGES

    def __init__(self, language: str = "en"):
        if language not in LANGUAGES:
            raise ValueError(f"sentence splitting: language {language!r} is not supported "
                             f"by {self.name}; supported: {', '.join(LANGUAGES)}")
        self.language = language

    def split(self, text: str) -> list[str]:
        out = []
        for sentence in sentencex.segment(self.language, text):
            sentence = " ".join(sentence.split())
            if sentence:
                out.append(sentence)
        return out
