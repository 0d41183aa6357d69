"""--format=sample: the raw sample corpus (Gutenberg plays and poems, Britannica OCR) made
into data_prep/sample_corpus, the input format's documents: page markers and editor's notes
go, a play loses its preamble, stage directions and speaker names, a poem or an article its
title lines; a document per scene (plays) or per few paragraphs (prose). Sentences are cut
by a rule of their own (split_sentences), not by data_prep/sentences.py."""

from __future__ import annotations

import re

# Page markers (`### START: ...`, `p.772:0`, possibly followed by an editor's note) and
# editor's notes on their own line (`[[ed: reformatted from the original]]`).
_PAGE_MARKER = re.compile(r"^(#.*|p\.\d+:\d+.*|\[\[ed:.*\]\])\s*$")
_INLINE_NOTE = re.compile(r"\s*\[\[ed:[^\]]*\]\]")
_HEADING = re.compile(r"^(ACT|SCENE|Scene|PROLOGUE|EPILOGUE|Prologue|Epilogue|INDUCTION)\b")
_NUMERAL = re.compile(r"^[IVXLC]+\.?$")
_SPEAKER = re.compile(r"^[A-Z][A-Za-z'&\- ]{0,40}\.$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z])")


def _paragraphs(text: str) -> list[list[str]]:
    paras, cur = [], []
    for line in text.splitlines():
        line = line.rstrip()
        if _PAGE_MARKER.match(line):
            continue
        line = _INLINE_NOTE.sub("", line)
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(cur)
            cur = []
    if cur:
        paras.append(cur)
    return paras


def _is_title(p: list[str]) -> bool:
    """A one-line paragraph like "THE SONNETS" or "by William Shakespeare"."""
    line = p[0]
    return len(p) == 1 and (line.startswith("by ") or
                            (len(line) < 60 and not line.endswith((".", "!", "?", ":"))))


def split_sentences(text: str) -> list[str]:
    """Sentences of a paragraph: a break after . ! or ? before a capital (or a quote or
    bracket and a capital)."""
    text = re.sub(r"\s+", " ", text).strip()
    return [s for s in _SENTENCE_END.split(text) if s]


def convert_text(text: str, paragraphs_per_doc: int = 4) -> list[list[str]]:
    """Raw text of one source file -> documents, each a list of sentences."""
    paras = _paragraphs(text)
    is_play = any(_HEADING.match(p[0]) and p[0].startswith("ACT") for p in paras)
    if is_play:  # drop the preamble (title, author, cast list) before the first act
        first = next(i for i, p in enumerate(paras) if p[0].startswith("ACT"))
        paras = paras[first:]
    else:  # drop the title and "by ..." lines of a poem or an article
        paras = [p for i, p in enumerate(paras) if not (i < 3 and _is_title(p))]
    docs: list[list[str]] = []
    cur: list[str] = []
    n_paras = 0
    for p in paras:
        heading = _HEADING.match(p[0]) or (_NUMERAL.match(p[0]) and len(p) == 1)
        if heading or (not is_play and paragraphs_per_doc and n_paras >= paragraphs_per_doc
                       and not _NUMERAL.match(p[0])):
            if cur:
                docs.append(cur)
            cur, n_paras = [], 0
            if heading:
                continue
        if p[0].startswith("[") and p[-1].endswith("]"):
            continue  # a stage direction
        lines = p[1:] if (len(p) > 1 and _SPEAKER.match(p[0])) else p
        cur.extend(split_sentences(" ".join(lines)))
        n_paras += 1
    if cur:
        docs.append(cur)
    return [d for d in docs if d]


def format_documents(docs: list[list[str]]) -> str:
    """Documents in the input format: a sentence per line, a blank line after each."""
    return "".join("\n".join(d) + "\n\n" for d in docs)
