"""What the corpus front door's stages hand each other: a run's Options (the command line's
flags) and their check, a document before parsing (RawDoc) and after cleaning (Cleaned),
the formats, the drop reasons, and PrepareError."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from bert_jax.errors import UserError
from data_prep.paths import BEAM_OPTIONS_HELP, RUNNER_HELP
from data_prep.sentences import splitter

FORMATS = ("auto", "wiki", "jsonl", "text", "parquet", "arrow", "hf", "sample")
DROP_REASONS = ("non-article", "redirect", "disambiguation", "too short", "exact duplicate",
                "near duplicate", "bad input")


class PrepareError(UserError, ValueError):
    """Bad flags, no input, or input with nothing usable (nothing is written then)."""


def _opt(default, help_text: str):
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class Options:
    """One run's settings: the command line's flags, the same names, defaults and help."""
    input: str | None = _opt(
        None, "Input files or folders: comma-separated, each may be a glob; a folder is read "
        "recursively (or is a Hugging Face datasets folder).")
    output: str | None = _opt(
        None, "Output: a file name (one shard), a folder (ending in / or existing: "
        "corpus-00000-of-0000N.txt in it) or a prefix (PREFIX-00000-of-0000N.txt).")
    format: str = _opt("auto", "Input format: " + ", ".join(FORMATS) + ". auto: from the "
                       "name (.xml wiki, .jsonl/.json/.ndjson jsonl, .parquet, .arrow, a "
                       "datasets folder hf, anything else text; .bz2/.gz/.zst stripped "
                       "first).")
    text_key: str = _opt("text", "jsonl / parquet / arrow / hf: the field holding the text.")
    split: str = _opt("train", "hf: the split of a DatasetDict folder.")
    doc_split: str = _opt("file", "text: a document per 'file' or per 'blank_line' block.")
    join_lines: bool = _opt(
        False, "Text is hard-wrapped: a blank line ends a paragraph, single line breaks are "
        "spaces (default: every line is a paragraph). Not for wiki.")
    language: str = _opt("en", "Sentence splitting rules (data_prep/sentences.py).")
    fix_text: bool = _opt(True, "Repair mojibake, entities and control characters (ftfy).")
    min_doc_chars: int = _opt(200, "Drop documents with fewer characters of sentences.")
    min_sentences: int = _opt(1, "Drop documents with fewer sentences.")
    dedup: bool = _opt(True, "Drop exact and near-duplicate documents (data_prep/dedup.py).")
    dedup_threshold: float = _opt(0.8, "Near duplicates: estimated Jaccard similarity of word "
                                  "5-grams at or above this.")
    num_output_shards: int = _opt(1, "Output files; documents go round-robin.")
    num_workers: int | None = _opt(None, "Worker processes (default: all cores).")
    chunk_size_mb: float = _opt(1.0, "Input handed to a worker at a time (MB).")
    paragraphs_per_doc: int = _opt(4, "sample: paragraphs per document for prose.")
    progress: bool = _opt(True, "Show a progress bar.")
    runner: str = _opt("local", RUNNER_HELP.format(what="output"))
    beam_options: str = _opt("", BEAM_OPTIONS_HELP)


def check_options(o: Options) -> None:
    """PrepareError for a bad setting (before any input is read)."""
    if o.doc_split not in ("file", "blank_line"):
        raise PrepareError(f"--doc_split={o.doc_split}: expected file or blank_line")
    if o.min_sentences < 0 or o.min_doc_chars < 0 or o.chunk_size_mb <= 0:
        raise PrepareError("--min_sentences and --min_doc_chars must be >= 0, "
                           "--chunk_size_mb > 0")
    try:
        splitter(o.language)
    except ValueError as e:
        raise PrepareError(f"--language={o.language}: {e}") from None


class RawDoc(NamedTuple):
    """One input document before any parsing. kind: "wiki" (a <page> element's XML, bytes),
    "json" (a JSON line, bytes), "text" (bytes or str), or "bad" (data: what is wrong with
    the file; counted as bad input). where: "page 12", "line 3", "row 7", "" (whole file)."""
    kind: str
    data: bytes | str
    source: str
    where: str


class Cleaned(NamedTuple):
    """clean_document's answer: the sentences, or None and the drop reason (DROP_REASONS);
    note: for bad input, "file: where: what"."""
    sentences: list[str] | None
    reason: str | None = None
    note: str = ""


def bad_input(raw: RawDoc, what: str) -> Cleaned:
    """`raw` dropped as bad input, the note naming its file, its place and `what`."""
    where = f"{raw.source}: {raw.where}" if raw.where else raw.source
    return Cleaned(None, "bad input", f"{where}: {what}")


def short_error(e: BaseException) -> str:
    """An exception's message on one line of at most 200 characters, for a note."""
    return " ".join(str(e).split())[:200] or type(e).__name__
