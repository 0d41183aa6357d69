"""Cleaning one document, and its fingerprint for deduplication: the per-document work of
the corpus front door, pure (the answer depends only on the arguments), so that any
process or engine may run it.

`clean_document(raw, options)`: parse (JSON, UTF-8, a MediaWiki page), fix the text (ftfy:
mojibake, HTML entities, control characters; NFC), split it into sentences
(data_prep/sentences.py), drop it if shorter than --min_doc_chars / --min_sentences.
`fingerprint(sentences, options)`: the expensive half of deduplication (data_prep/dedup.py),
done beside the cleaning; `check_fingerprint` is the stateful half, and
`minhasher(options).band_keys` with data_prep.dedup.greedy decide the same over keys
grouped elsewhere (data_prep/beam/corpus.py)."""

from __future__ import annotations

import json
import re
import unicodedata

from data_prep.corpus.types import Cleaned, Options, RawDoc, bad_input, short_error
from data_prep.corpus.wiki import page_paragraphs
from data_prep.dedup import Deduplicator, DiskDeduplicator, digest, normalize
from data_prep.sentences import splitter

# Where ftfy has something to fix: a Latin-1 / Windows-1252 reading of UTF-8 (mojibake: a
# lead byte as one of Â..ô followed by a continuation byte as a C1 or Latin-1 symbol or a
# Windows-1252 punctuation mark), C1 controls, an HTML entity, ftfy's control characters,
# line separators, surrogates. Elsewhere ftfy would only normalize (NFC), which is done
# without it: its full check for mojibake reads slower than the rest of the cleaning.
_MOJIBAKE = ("[\u00c2-\u00f4][\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d"
             "\u017e\u0192\u02c6\u02dc\u2013\u2014\u2018-\u201e\u2020-\u2022\u2026"
             "\u2030\u2039\u203a\u20ac\u2122]")
_NEEDS_FTFY = re.compile(
    _MOJIBAKE + "|[\u0080-\u009f\x00-\x08\x0b-\x1f\x7f\u2028\u2029\u206a-\u206f"
    "\ufeff\ufff9-\ufffc\ud800-\udfff]|&(?:#?\\w+);")
_FTFY: dict = {}


def fix_text(text: str) -> str:
    """Mojibake, HTML entities and control characters repaired (ftfy), NFC. Typography is
    kept: curly quotes, ligatures and full-width forms are text, not damage."""
    if _NEEDS_FTFY.search(text) is None:
        return text if text.isascii() else unicodedata.normalize("NFC", text)
    if not _FTFY:
        import ftfy
        _FTFY["fix"] = ftfy.fix_text
        _FTFY["config"] = ftfy.TextFixerConfig(
            uncurl_quotes=False, fix_latin_ligatures=False, fix_character_width=False,
            explain=False)
    return _FTFY["fix"](text, _FTFY["config"])


def _decode(raw: RawDoc, data) -> str | Cleaned:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return bad_input(raw, f"not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})")


def clean_document(raw: RawDoc, options: Options) -> Cleaned:
    """One document -> its sentences, or None and why it is dropped. Pure: the answer
    depends only on the arguments."""
    if raw.kind == "bad":
        return bad_input(raw, raw.data)
    if raw.kind == "wiki":
        paragraphs = page_paragraphs(raw)
        if isinstance(paragraphs, Cleaned):
            return paragraphs
    else:
        if raw.data is None:
            return bad_input(raw, "no text (null)")
        if raw.kind == "json":
            try:
                obj = json.loads(raw.data)
            except ValueError as e:
                return bad_input(raw, f"not JSON ({short_error(e)})")
            if not isinstance(obj, dict) or options.text_key not in obj:
                return bad_input(raw, f"no key {options.text_key!r}")
            text = obj[options.text_key]
            if not isinstance(text, str):
                return bad_input(raw, f"{options.text_key!r} is not a string")
        else:
            text = _decode(raw, raw.data)
            if isinstance(text, Cleaned):
                return text
        paragraphs = text_paragraphs(text, options.join_lines)
    return finish(paragraphs, options)


def text_paragraphs(text: str, join_lines: bool = False) -> list[str]:
    if not join_lines:
        return text.splitlines()
    return [" ".join(block.split()) for block in re.split(r"\n\s*\n", text)]


def finish(paragraphs: list[str], options: Options) -> Cleaned:
    """Fixed, split into sentences, checked against the minimum lengths."""
    split = splitter(options.language).split
    sentences = []
    for p in paragraphs:
        if options.fix_text:
            p = fix_text(p)
        if p and not p.isspace():
            sentences += split(p)
    if (not sentences or len(sentences) < options.min_sentences
            or sum(map(len, sentences)) < options.min_doc_chars):
        return Cleaned(None, "too short")
    return Cleaned(sentences)


def dedup_text(sentences: list[str]) -> str:
    """What the deduplicator compares: the document's sentences, one per line."""
    return "\n".join(sentences)


def deduplicator(options: Options, folder: str | None = None):
    """The in-memory Deduplicator, or with a folder the DiskDeduplicator spooling to it."""
    if folder is None:
        return Deduplicator(threshold=options.dedup_threshold)
    return DiskDeduplicator(folder, threshold=options.dedup_threshold)


_MINHASHERS: dict = {}


def minhasher(options: Options):
    """The signatures' and LSH band keys' parameters of --dedup_threshold (one per process)."""
    key = options.dedup_threshold
    if key not in _MINHASHERS:
        _MINHASHERS[key] = deduplicator(options)
    return _MINHASHERS[key]


def fingerprint(sentences: list[str], options: Options) -> tuple:
    """The expensive half of deduplication, computed where the document is cleaned: the
    exact-duplicate digest of its normalized text and its MinHash signature
    (data_prep.dedup.digest, Deduplicator.signature)."""
    norm = normalize(dedup_text(sentences))
    return digest(norm), minhasher(options).signature(norm)


def check_fingerprint(dedup, text_digest: int, signature) -> str | None:
    """Deduplicator.check of a document from its `fingerprint` (Deduplicator.check_digest):
    the same answers and state (tests/data_prep/test_corpus_door.py compares the two)."""
    return dedup.check_digest(text_digest, signature)


def clean_chunk(docs: list[RawDoc], options: Options) -> list[tuple[Cleaned, tuple | None]]:
    """A worker's job: each document cleaned, and fingerprinted when kept and --dedup."""
    out = []
    for d in docs:
        c = clean_document(d, options)
        out.append((c, fingerprint(c.sentences, options)
                    if options.dedup and c.sentences else None))
    return out
