r"""Raw corpora -> BERT's input format: UTF-8 text, one sentence per line, a blank line
between documents (what create_pretraining_data.py reads).

    python data_prep/prepare_corpus.py --input=enwiki-latest-pages-articles.xml.bz2 \
        --output=/tmp/wiki/ --num_output_shards=64
    python data_prep/prepare_corpus.py --input=crawl.jsonl.zst --text_key=content \
        --output=/tmp/crawl/part
    python data_prep/prepare_corpus.py --input=../shared/corpus --format=sample \
        --output=/tmp/corpus.txt

Sources (--format, else recognised from the name; .bz2 / .gz / .zst are decompressed as
they are read, every source is streamed):
  * wiki: MediaWiki XML exports (Wikipedia's pages-articles dumps, multistream ones too):
    one document per article; talk, user, template, ... pages, redirects and
    disambiguation pages are dropped; the wikitext is stripped with mwparserfromhell
    (templates, tables, references, files and images, categories, interlanguage links,
    comments, math, galleries, headings, lists and the See also / References / External
    links / ... sections go; link labels and the text of bold, italic and HTML tags stay).
  * jsonl: JSON lines, the text under --text_key.
  * text: plain text, a document per file or per blank-line block (--doc_split).
  * parquet, arrow, or a Hugging Face `datasets` folder (made by save_to_disk; --split of
    a DatasetDict): the column --text_key, read with pyarrow in record batches.
  * sample: the raw sample corpus (Gutenberg plays, Britannica OCR; never auto-detected),
    made into data_prep/sample_corpus by `convert_text` below.

Cleaning, per document: ftfy (mojibake, HTML entities, control characters; NFC), sentence
splitting (data_prep/sentences.py), then --min_doc_chars / --min_sentences; exact and
near-duplicate documents are removed (data_prep/dedup.py) in input order. Each drop is
counted by reason, and bad input (a truncated file, a malformed page, a line that is not
JSON, text that is not UTF-8) is counted and named in the summary; with nothing usable
left the run is refused in one line and writes nothing.

The stages, for engines that run them elsewhere (Apache Beam):
  * `read_documents(path, fmt, options, progress)`: a file -> RawDoc items (cheap: splits
    bytes, parses nothing);
  * `clean_document(raw, options) -> Cleaned(sentences | None, drop reason, note)`: pure, the
    per-document work (parse, strip, fix, split, length checks);
  * `fingerprint(sentences, options)`: pure, the expensive half of deduplication (the
    digest and MinHash signature of `dedup_text(sentences)`), done beside the cleaning;
  * `check_fingerprint(deduplicator, digest, signature)`: stateful, Deduplicator.check
    (data_prep/dedup.py) of that fingerprint, in memory; `minhasher(options).band_keys`
    and data_prep.dedup.greedy decide the same over keys grouped elsewhere;
  * `format_document(sentences)`: the output text of one document.
`prepare(options)` runs them locally: chunks of documents cleaned and fingerprinted by
--num_workers processes, results taken in input order by this process. With --dedup they
are spooled to disk (data_prep/dedup.py's DiskDeduplicator: memory that does not grow
with the corpus; beside the output, a copy of the documents' text plus about 0.9 KB per
document) and decided once all are read; the kept ones are written round-robin into
--num_output_shards files, so the output is the same bytes for any worker count. Outputs
are written under temporary names and renamed at the end; the spool is removed.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import io
import json
import multiprocessing as mp
import os
import re
import sys
import time
import unicodedata
from concurrent.futures import ProcessPoolExecutor
from typing import Iterator, NamedTuple

if __package__ in (None, ""):  # run as a script: make `bert_jax` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from bert_jax.data.checks import files_named  # noqa: E402
from bert_jax import paths as bert_paths  # noqa: E402
from bert_jax.errors import UserError  # noqa: E402
from data_prep import paths as dp_paths  # noqa: E402
from data_prep.dedup import Deduplicator, DiskDeduplicator, digest, normalize  # noqa: E402
from data_prep.sentences import SentenceSplitter  # noqa: E402
from data_prep import workers as workers_lib  # noqa: E402

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
    return "".join("\n".join(d) + "\n\n" for d in docs)


# ----------------------------------------------------------------------------- real sources

FORMATS = ("auto", "wiki", "jsonl", "text", "parquet", "arrow", "hf", "sample")
DROP_REASONS = ("non-article", "redirect", "disambiguation", "too short", "exact duplicate",
                "near duplicate", "bad input")
_COMPRESSION = (".bz2", ".gz", ".zst")
_BY_EXTENSION = {".xml": "wiki", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
                 ".parquet": "parquet", ".arrow": "arrow", ".txt": "text"}
# A page bigger than this (a history dump's page with all its revisions) is skipped, named:
# the reader holds one page at a time.
MAX_PAGE_BYTES = 256 << 20


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
    runner: str = _opt("local", dp_paths.RUNNER_HELP.format(what="output"))
    beam_options: str = _opt("", dp_paths.BEAM_OPTIONS_HELP)


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


# ----------------------------------------------------------------------------- reading

def detect_format(path: str) -> str:
    """The format auto-detection picks for a file or folder (see --format)."""
    if os.path.isdir(path):
        return "hf" if _hf_arrow_files(path, "train", probe=True) else "text"
    name = path.lower()
    for ext in _COMPRESSION:
        if name.endswith(ext):
            name = name[:-len(ext)]
    return _BY_EXTENSION.get(os.path.splitext(name)[1], "text")


def needs_conversion(path: str) -> str | None:
    """The format of a file that is not text in the input format yet (a dump, JSON lines,
    compressed, a dataset), or None for a plain text file."""
    fmt = detect_format(path)
    if fmt == "text" and not path.lower().endswith(_COMPRESSION):
        return None
    return fmt


def _hf_arrow_files(folder: str, split: str, probe: bool = False) -> list[str]:
    """The .arrow files of a `datasets` save_to_disk folder, in order (state.json), or of
    its `split` for a DatasetDict folder (dataset_dict.json)."""
    if os.path.isfile(os.path.join(folder, "dataset_dict.json")):
        if probe:
            return [folder]
        with open(os.path.join(folder, "dataset_dict.json")) as f:
            splits = json.load(f).get("splits", [])
        if split not in splits:
            raise PrepareError(f"--input={folder}: a DatasetDict without the split "
                               f"--split={split!r} (splits: {', '.join(splits)})")
        folder = os.path.join(folder, split)
    state = os.path.join(folder, "state.json")
    if not os.path.isfile(state):
        return []
    if probe:
        return [folder]
    with open(state) as f:
        files = [d["filename"] for d in json.load(f).get("_data_files", [])]
    return [os.path.join(folder, name) for name in files]


def expand_inputs(spec: str, fmt: str, split: str = "train") -> list[tuple[str, str]]:
    """(file, format) of every input, in a fixed order: the comma list's order, each glob's
    and folder's files sorted."""
    if fmt not in FORMATS:
        raise PrepareError(f"--format={fmt}: expected one of {', '.join(FORMATS)}")
    out = []
    for part in (p.strip() for p in (spec or "").split(",")):
        if not part:
            continue
        if "://" in part:
            raise PrepareError(f"--input={part}: prepare_corpus reads local files; copy them "
                               f"here first, or run it on Beam (--runner), which reads "
                               f"buckets")
        hits = sorted(glob.glob(part)) if glob.has_magic(part) else [part]
        if not hits or not all(os.path.exists(h) for h in hits):
            raise PrepareError(f"--input={part}: no such file or folder")
        for hit in hits:
            kind = detect_format(hit) if fmt == "auto" else fmt
            if os.path.isdir(hit) and kind == "hf":
                files = _hf_arrow_files(hit, split)
                out += [(f, "arrow") for f in files]
                if not files:
                    raise PrepareError(f"--input={hit}: a datasets folder without data files")
            elif os.path.isdir(hit):
                files = sorted(p for p in glob.glob(os.path.join(hit, "**", "*"),
                                                    recursive=True) if os.path.isfile(p))
                out += [(f, detect_format(f) if fmt == "auto" else fmt) for f in files
                        if not os.path.basename(f).startswith(".")]
            else:
                out.append((hit, "arrow" if kind == "hf" else kind))
    if not out:
        raise PrepareError(f"--input={spec}: no input files")
    return out


class _Progress:
    """Bytes of the input files read so far (compressed bytes for compressed files)."""

    def __init__(self):
        self.done = 0      # bytes of the files finished
        self.file = None   # the raw file being read

    @property
    def position(self) -> int:
        try:
            return self.done + (self.file.tell() if self.file is not None else 0)
        except (OSError, ValueError):
            return self.done


def _open(path: str, progress: _Progress):
    """The decompressed byte stream of a file (line iteration works on it)."""
    raw = open(path, "rb")
    progress.file = raw
    name = path.lower()
    if name.endswith(".bz2"):  # multistream files (several bz2 streams) are read whole
        import bz2
        return bz2.BZ2File(raw)
    if name.endswith(".gz"):
        import gzip
        return gzip.GzipFile(fileobj=raw)
    if name.endswith(".zst"):
        import zstandard
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(
            raw, read_across_frames=True))
    return raw


def _stream_errors():
    errors = [EOFError, OSError]
    try:
        import zstandard
        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


_PAGE_ID = re.compile(rb"<id>\s*(\d+)\s*</id>")


def _page_where(data: bytes) -> str:
    head = data[:data.find(b"<revision")] if b"<revision" in data else data[:4096]
    m = _PAGE_ID.search(head)
    return f"page {int(m.group(1))}" if m else "a page without an id"


# A <page> or </page> tag wherever it stands: exports put `</revision></page>` on one line,
# or a whole page on one line. Inside a page's text `<` is always escaped (`&lt;`), so these
# bytes can only be the tags themselves.
_PAGE_TAG = re.compile(rb"<(/?)page(?:\s[^<>]*)?>")
_WIKI_CHUNK = 1 << 20


def _wiki_pages(stream, path: str) -> Iterator[RawDoc]:
    """<page> elements as bytes, cut at their tags (read in chunks, whatever the line
    layout), so one malformed page is skipped alone. A file that ends inside a page gives
    "bad" for that page only."""
    buf: list[bytes] = []
    size, in_page, pages, too_big = 0, False, 0, False

    def add(data: bytes):
        nonlocal buf, size, too_big
        if not in_page or too_big or not data:
            return None
        size += len(data)
        if size > MAX_PAGE_BYTES:
            where = _page_where(b"".join(buf))
            buf, too_big = [], True
            return RawDoc("bad", f"larger than {MAX_PAGE_BYTES >> 20} MB, skipped", path, where)
        buf.append(data)
        return None

    # read1: what one read of the file gives, so that a compressed file cut short still
    # hands over every page decompressed before the cut.
    read, pending = getattr(stream, "read1", stream.read), b""
    while True:
        chunk = read(_WIKI_CHUNK)
        data, eof = pending + chunk, not chunk
        pos = 0
        for m in _PAGE_TAG.finditer(data):
            if (bad := add(data[pos:m.start()])) is not None:
                yield bad
            pos = m.end()
            if not m.group(1):  # <page>
                if in_page and not too_big:  # no </page>: the parser names what came before
                    yield RawDoc("wiki", b"".join(buf), path, _page_where(b"".join(buf)))
                buf, size, in_page, too_big = [], 0, True, False
                pages += 1
                if (bad := add(m.group(0))) is not None:
                    yield bad
            elif in_page:  # </page>
                if (bad := add(m.group(0))) is None and not too_big:
                    page = b"".join(buf)
                    yield RawDoc("wiki", page, path, _page_where(page))
                elif bad is not None:
                    yield bad
                buf, size, in_page, too_big = [], 0, False, False
        rest = data[pos:]
        # A tag cut by the chunk's end waits for the next chunk.
        cut = rest.rfind(b"<")
        pending = (b"" if eof or cut < 0 or b">" in rest[cut:] or len(rest) - cut > 256
                   else rest[cut:])
        if pending:
            rest = rest[:cut]
        if (bad := add(rest)) is not None:
            yield bad
        if eof:
            break
    if in_page and not too_big:
        yield RawDoc("bad", "the file ends inside this page (truncated); the pages before "
                     "it were read", path, _page_where(b"".join(buf)))
    elif not pages:
        yield RawDoc("bad", "no <page> element: not a MediaWiki XML export", path, "")


def _lines(stream, path: str, kind: str) -> Iterator[RawDoc]:
    for i, line in enumerate(stream, 1):
        if line.strip():
            yield RawDoc(kind, line, path, f"line {i}")


def _blocks(stream, path: str) -> Iterator[RawDoc]:
    buf, start = [], 0
    for i, line in enumerate(stream, 1):
        if line.strip():
            if not buf:
                start = i
            buf.append(line)
        elif buf:
            yield RawDoc("text", b"".join(buf), path, f"line {start}")
            buf = []
    if buf:
        yield RawDoc("text", b"".join(buf), path, f"line {start}")


def _columns(path: str, fmt: str, key: str) -> Iterator[RawDoc]:
    """The `key` column of a parquet or arrow file, a record batch at a time."""
    import pyarrow as pa

    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq
            pf = pq.ParquetFile(path)
            names = pf.schema_arrow.names
            batches = pf.iter_batches(batch_size=1024, columns=[key]) if key in names else None
        else:
            source = pa.memory_map(path)
            try:  # datasets writes the IPC stream format; the file format is read too
                reader = pa.ipc.open_stream(source)
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                reader = (reader.get_batch(i) for i in range(reader.num_record_batches))
                names = None
            else:
                names = reader.schema.names
            batches = reader
            if names is not None and key not in names:
                batches = None
    except (pa.ArrowException, OSError) as e:
        yield RawDoc("bad", f"not a readable {fmt} file ({_short(e)})", path, "")
        return
    if batches is None:
        yield RawDoc("bad", f"no column {key!r} (columns: {', '.join(names)}); set "
                     f"--text_key", path, "")
        return
    row = 0
    for batch in batches:
        if key not in batch.schema.names:
            yield RawDoc("bad", f"no column {key!r} (columns: "
                         f"{', '.join(batch.schema.names)}); set --text_key", path, "")
            return
        for value in batch.column(key).to_pylist():
            row += 1
            yield RawDoc("text", value, path, f"row {row}")


def read_documents(path: str, fmt: str, options: Options,
                   progress: _Progress | None = None) -> Iterator[RawDoc]:
    """One input file's documents, unparsed, in order; a file that cannot be read to its
    end gives a "bad" item after what it did give."""
    progress = progress or _Progress()
    if fmt in ("parquet", "arrow"):
        yield from _columns(path, fmt, options.text_key)
        return
    try:
        stream = _open(path, progress)
    except OSError as e:
        yield RawDoc("bad", f"cannot be read ({_short(e)})", path, "")
        return
    with stream:
        try:
            if fmt == "wiki":
                yield from _wiki_pages(stream, path)
            elif fmt == "jsonl":
                yield from _lines(stream, path, "json")
            elif options.doc_split == "blank_line":
                yield from _blocks(stream, path)
            else:
                yield RawDoc("text", stream.read(), path, "")
        except _stream_errors() as e:
            yield RawDoc("bad", f"truncated or corrupt ({_short(e)}); what was read before "
                         f"is kept", path, "")


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


# ----------------------------------------------------------------------------- cleaning

_STATE: dict = {}


def _splitter(language: str):
    key = ("splitter", language)
    if key not in _STATE:
        _STATE[key] = SentenceSplitter(language)
    return _STATE[key]


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


def _bad(raw: RawDoc, what: str) -> Cleaned:
    where = f"{raw.source}: {raw.where}" if raw.where else raw.source
    return Cleaned(None, "bad input", f"{where}: {what}")


def _decode(raw: RawDoc, data) -> str | Cleaned:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return _bad(raw, f"not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start})")


def clean_document(raw: RawDoc, options: Options) -> Cleaned:
    """One document -> its sentences, or None and why it is dropped. Pure: the answer
    depends only on the arguments."""
    if raw.kind == "bad":
        return _bad(raw, raw.data)
    if raw.kind == "wiki":
        page = _parse_page(raw)
        if isinstance(page, Cleaned):
            return page
        namespace, redirect, title, text = page
        if namespace != 0:
            return Cleaned(None, "non-article")
        if redirect or text.lstrip()[:9].lower() == "#redirect":
            return Cleaned(None, "redirect")
        text, templates = prestrip(text)
        if _is_disambiguation(templates, title):
            return Cleaned(None, "disambiguation")
        import mwparserfromhell
        paragraphs = wiki_paragraphs(mwparserfromhell.parse(text))
    else:
        if raw.data is None:
            return _bad(raw, "no text (null)")
        if raw.kind == "json":
            try:
                obj = json.loads(raw.data)
            except ValueError as e:
                return _bad(raw, f"not JSON ({_short(e)})")
            if not isinstance(obj, dict) or options.text_key not in obj:
                return _bad(raw, f"no key {options.text_key!r}")
            text = obj[options.text_key]
            if not isinstance(text, str):
                return _bad(raw, f"{options.text_key!r} is not a string")
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
    splitter = _splitter(options.language)
    sentences = []
    for p in paragraphs:
        if options.fix_text:
            p = fix_text(p)
        if p and not p.isspace():
            sentences += splitter.split(p)
    if (not sentences or len(sentences) < options.min_sentences
            or sum(map(len, sentences)) < options.min_doc_chars):
        return Cleaned(None, "too short")
    return Cleaned(sentences)


def dedup_text(sentences: list[str]) -> str:
    """What the deduplicator compares: the document's sentences, one per line."""
    return "\n".join(sentences)


def format_document(sentences: list[str]) -> str:
    return "\n".join(sentences) + "\n\n"


# ----------------------------------------------------------------------------- wikitext

def _parse_page(raw: RawDoc):
    """(namespace, redirect target, title, text of the last revision), or bad input."""
    from mwxml.element_iterator import ElementIterator
    from mwxml.iteration.page import Page

    try:
        page = Page.from_element(ElementIterator.from_file(io.BytesIO(raw.data)))
        text = None
        for revision in page:
            text = revision.text
        namespace, redirect, title = page.namespace, page.redirect, page.title or ""
    except Exception as e:  # noqa: BLE001  (expat's, mwxml's and int()'s errors alike)
        return _bad(raw, f"malformed XML ({_short(e)})")
    return namespace, redirect, title, text or ""


# Templates that mark a disambiguation page ({{disambiguation}}, {{dab}}, {{hndis}},
# {{geodis}}, {{hospital disambiguation}}, ...; not {{disambiguation needed}}).
_DAB_TEMPLATES = {"disambiguation", "disambig", "disamb", "dab", "dis", "hndis", "geodis",
                  "numberdis", "mil-unit-dis", "shipindex", "letter-numbercombdisambig"}
# Sections of references and links, not prose.
_SKIP_SECTIONS = {"see also", "references", "external links", "further reading", "notes",
                  "bibliography", "sources", "citations", "footnotes", "notes and references",
                  "works cited", "references and notes", "external links and references"}
_DROP_TAGS = {"ref", "references", "table", "tr", "td", "th", "caption", "gallery", "math",
              "chem", "ce", "timeline", "score", "imagemap", "syntaxhighlight", "source", "pre",
              "code", "graph", "mapframe", "maplink", "templatedata", "templatestyles", "hiero",
              "inputbox", "categorytree", "includeonly", "noinclude", "hr", "indicator"}
_DROP_LINKS = {"file", "image", "category", "media"}
_LANGUAGE_PREFIX = re.compile(r"[a-z]{2,3}(-[a-z]+)*")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_EMPTY_BRACKETS = re.compile(r"\s*\(\s*[,;]?\s*\)")
_TABLE_LINE = ("{|", "|", "!")


def _template_name(template) -> str:
    return " ".join(str(template.name).replace("_", " ").split()).lower()


def _is_disambiguation(templates: list[str], title: str) -> bool:
    if title.endswith("(disambiguation)"):
        return True
    for name in templates:
        name = " ".join(name.replace("_", " ").split()).lower()
        if name in _DAB_TEMPLATES or name.endswith(" disambiguation"):
            return True
    return False


# What prestrip removes whole before parsing: comments, and the elements whose content is
# never prose (references, math, galleries, code, ...), paired or self-closing.
_DROP_ELEMENTS = re.compile(
    r"<!--.*?(?:-->|\Z)"
    r"|<(ref|references|math|chem|ce|gallery|timeline|score|imagemap|syntaxhighlight|source"
    r"|pre|graph|mapframe|templatedata|templatestyles|hiero|inputbox|categorytree|includeonly"
    r"|noinclude|indicator)\b[^>]*?(?:/>|>.*?</\1\s*>)",
    re.IGNORECASE | re.DOTALL)
_BRACES = re.compile(r"\{\{|\}\}|^[ \t]*\{\||^[ \t]*\|\}", re.MULTILINE)


def prestrip(text: str) -> tuple[str, list[str]]:
    """Wikitext without comments, references and the like, templates and tables, and the
    names of its outermost templates. Done with regular expressions and brace matching
    before mwparserfromhell parses the rest: building its node tree for templates and
    references, most of an article's markup, is what makes parsing slow."""
    text = _DROP_ELEMENTS.sub("", text)
    out, names, stack, pos, start = [], [], [], 0, 0
    for m in _BRACES.finditer(text):
        token = m.group().strip()
        if token in ("{{", "{|"):
            if not stack:
                start = m.start()
                if token == "{{":
                    names.append(re.split(r"[|}\n]", text[m.end():m.end() + 200], 1)[0])
            stack.append(token)
        elif stack and stack[-1] == ("{{" if token == "}}" else "{|"):
            stack.pop()
            if not stack:
                out.append(text[pos:start])
                pos = m.end()
    # An unclosed template or table stays as text (mwparserfromhell reads it as such).
    out.append(text[pos:])
    return "".join(out), names


class _Walk:
    def __init__(self):
        self.out: list[str] = []
        self.skip_line = False      # inside a list item
        self.skip_level = 0         # inside a skipped section of this heading level


def wiki_paragraphs(code) -> list[str]:
    """The prose of parsed wikitext, a paragraph per item (BERT's Wikipedia: text
    passages only, no lists, tables or headings)."""
    walk = _Walk()
    _walk(code.nodes, walk)
    text = _MAGIC_WORD.sub("", "".join(walk.out))
    paragraphs = []
    for line in text.split("\n"):
        line = " ".join(line.split())
        if line and not line.startswith(_TABLE_LINE):
            paragraphs.append(_EMPTY_BRACKETS.sub("", line))
    return paragraphs


def _walk(nodes, w: _Walk) -> None:
    from mwparserfromhell import nodes as n

    for node in nodes:
        if isinstance(node, n.Heading):
            level = node.level
            if w.skip_level and level > w.skip_level:
                continue
            title = " ".join(node.title.strip_code().split()).lower()
            w.skip_level = level if title in _SKIP_SECTIONS else 0
            w.skip_line = False
            w.out.append("\n")
            continue
        if w.skip_level:
            continue
        if isinstance(node, n.Text):
            s = node.value
            if w.skip_line:
                cut = s.find("\n")
                if cut < 0:
                    continue
                w.skip_line, s = False, s[cut:]
            w.out.append(s)
        elif w.skip_line:
            continue
        elif isinstance(node, n.Tag):
            tag = str(node.tag).strip().lower()
            if node.wiki_markup and tag in ("li", "dt", "dd"):
                w.skip_line = True
            elif tag == "br":
                w.out.append("\n")
            elif tag not in _DROP_TAGS and node.contents is not None:
                _walk(node.contents.nodes, w)
        elif isinstance(node, n.Wikilink):
            title = str(node.title).strip()
            prefix = title.split(":", 1)[0].strip().lower() if ":" in title else ""
            if prefix in _DROP_LINKS or (node.text is None and _LANGUAGE_PREFIX.fullmatch(prefix)):
                continue
            if node.text is not None:
                _walk(node.text.nodes, w)
            else:
                w.out.append(title.lstrip(":"))
        elif isinstance(node, n.ExternalLink):
            if node.title is not None:
                _walk(node.title.nodes, w)
        elif isinstance(node, n.HTMLEntity):
            w.out.append(node.normalize())
        # Templates, template arguments and comments are dropped.


# ----------------------------------------------------------------------------- the driver

@dataclasses.dataclass
class Summary:
    documents: int = 0
    kept: int = 0
    dropped: dict = dataclasses.field(
        default_factory=lambda: collections.Counter({r: 0 for r in DROP_REASONS}))
    bad: list = dataclasses.field(default_factory=list)   # notes of bad input (first 20)
    sentences: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    outputs: list = dataclasses.field(default_factory=list)

    def text(self) -> str:
        rate = self.bytes_in / 1e6 / self.seconds if self.seconds else 0.0
        lines = [f"documents in     {self.documents:,}",
                 f"kept             {self.kept:,}"]
        lines += [f"dropped, {r + ':':<16} {self.dropped[r]:,}" for r in DROP_REASONS]
        lines += [f"sentences        {self.sentences:,}",
                  f"bytes in         {self.bytes_in:,}",
                  f"bytes out        {self.bytes_out:,}",
                  f"seconds          {self.seconds:.1f}",
                  f"MB/s             {rate:.2f}"]
        n_bad = self.dropped["bad input"]
        lines += [f"bad input: {note}" for note in self.bad]
        if n_bad > len(self.bad):
            lines.append(f"bad input: ... and {n_bad - len(self.bad)} more")
        return "\n".join(lines)


_MAX_NOTES = 20


def output_paths(spec: str, num_shards: int) -> list[str]:
    if not spec:
        raise PrepareError("--output: no output given")
    if "://" in spec:
        raise PrepareError(f"--output={spec}: prepare_corpus reads and writes local files; "
                           f"on Beam (--runner) it writes to buckets")
    if num_shards < 1:
        raise PrepareError(f"--num_output_shards must be >= 1 (got {num_shards})")
    if spec.endswith(os.sep) or os.path.isdir(spec):
        prefix = os.path.join(spec, "corpus")
    elif num_shards == 1:
        prefix = None
    else:
        prefix = spec[:-4] if spec.endswith(".txt") else spec
    outputs = ([spec] if prefix is None else
               [f"{prefix}-{i:05d}-of-{num_shards:05d}.txt" for i in range(num_shards)])
    blocker = bert_paths.file_in_the_way(os.path.dirname(os.path.abspath(outputs[0])))
    if blocker is not None:
        raise PrepareError(f"--output={spec}: {blocker} is a file, so nothing can be written "
                           f"there: pass another path")
    return outputs


def _deduplicator(options: Options, folder: str | None = None):
    """The in-memory Deduplicator, or with a folder the DiskDeduplicator spooling to it."""
    if folder is None:
        return Deduplicator(threshold=options.dedup_threshold)
    return DiskDeduplicator(folder, threshold=options.dedup_threshold)


def minhasher(options: Options):
    """The signatures' and LSH band keys' parameters of --dedup_threshold (one per process)."""
    key = ("dedup", options.dedup_threshold)
    if key not in _STATE:
        _STATE[key] = _deduplicator(options)
    return _STATE[key]


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


def _clean_chunk(docs: list[RawDoc], options: Options) -> list[tuple[Cleaned, tuple | None]]:
    out = []
    for d in docs:
        c = clean_document(d, options)
        out.append((c, fingerprint(c.sentences, options)
                    if options.dedup and c.sentences else None))
    return out


def _chunks(inputs, options: Options, progress: _Progress):
    """(documents, input bytes read so far) in pieces of about --chunk_size_mb."""
    limit = max(1, int(options.chunk_size_mb * 1e6))
    chunk, size = [], 0
    for path, fmt in inputs:
        for doc in read_documents(path, fmt, options, progress):
            chunk.append(doc)
            size += len(doc.data) if doc.data is not None else 0
            if size >= limit:
                yield chunk, progress.position
                chunk, size = [], 0
        progress.file = None
        progress.done += os.path.getsize(path)
    if chunk:
        yield chunk, progress.position


def check_options(o: Options) -> None:
    """PrepareError for a bad setting (before any input is read)."""
    if o.doc_split not in ("file", "blank_line"):
        raise PrepareError(f"--doc_split={o.doc_split}: expected file or blank_line")
    if o.min_sentences < 0 or o.min_doc_chars < 0 or o.chunk_size_mb <= 0:
        raise PrepareError("--min_sentences and --min_doc_chars must be >= 0, "
                           "--chunk_size_mb > 0")
    try:
        _splitter(o.language)
    except ValueError as e:
        raise PrepareError(f"--language={o.language}: {e}") from None


def nothing_usable(o: Options, summary: Summary) -> str:
    """The refusal when no document is kept."""
    dropped = ", ".join(f"{r} {n}" for r, n in summary.dropped.items() if n)
    first = f"; {summary.bad[0]}" if summary.bad else ""
    return (f"--input={o.input}: nothing usable: {summary.documents} document(s) read, "
            f"none kept ({dropped or 'no documents'}){first}; {o.output} not written")


def prepare(options: Options) -> Summary:
    """The command line's work in process: PrepareError for bad settings or input with
    nothing usable (nothing written then, an older output stays); OSError on a write."""
    from tqdm import tqdm

    o = options
    check_options(o)
    if o.runner != "local":
        beam = dp_paths.load_beam(o.runner, o.beam_options, PrepareError)
        return beam.prepare(o, o.runner, o.beam_options)
    if o.beam_options:
        raise PrepareError("--beam_options needs a Beam --runner (e.g. DirectRunner)")
    inputs = expand_inputs(o.input, o.format, o.split)
    outputs = output_paths(o.output, o.num_output_shards)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = o.num_workers or cores or 1
    t0 = time.time()
    summary = Summary(outputs=outputs)
    progress = _Progress()
    total = sum(os.path.getsize(p) for p, _ in inputs)
    bar = tqdm(total=total, unit="B", unit_scale=True, disable=not o.progress,
               desc="prepare_corpus", file=sys.stderr)
    tmps = [f"{p}.tmp-{os.getpid()}" for p in outputs]
    files, pool, spool = [], None, None

    def write(text: bytes, sentences: int) -> None:
        files[summary.kept % len(files)].write(text)
        summary.kept += 1
        summary.sentences += sentences
        summary.bytes_out += len(text)

    try:
        for p in outputs:
            os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
        files = [open(t, "wb") for t in tmps]
        if o.dedup:
            spool = _deduplicator(o, f"{tmps[0]}.dedup")
        chunks = _chunks(inputs, o, progress)
        if workers <= 1:
            results = ((_clean_chunk(c, o), pos) for c, pos in chunks)
        else:
            context = mp.get_context("fork" if workers_lib.fork_safe() else "spawn")
            pool = ProcessPoolExecutor(workers, mp_context=context)
            results = workers_lib.ordered(pool, _clean_chunk,
                                          (((c, o), pos) for c, pos in chunks), 2 * workers)
        done = 0
        for cleaned, position in results:
            for c, fp in cleaned:
                summary.documents += 1
                if c.reason is not None:
                    summary.dropped[c.reason] += 1
                    if c.note and len(summary.bad) < _MAX_NOTES:
                        summary.bad.append(c.note)
                    continue
                text = format_document(c.sentences).encode("utf-8")
                if spool is not None:  # decided at the end, over all documents
                    spool.add(*fp, text, len(c.sentences))
                else:
                    write(text, len(c.sentences))
            bar.update(position - done)
            done = position
        summary.bytes_in = progress.done
        if spool is not None:
            bar.set_description("prepare_corpus: deduplicating")
            spool.finish()
            summary.dropped["exact duplicate"] += spool.exact
            summary.dropped["near duplicate"] += spool.near
            with tqdm(total=spool.kept, unit="doc", desc="prepare_corpus: writing",
                      disable=not o.progress, file=sys.stderr) as wbar:
                for text, sentences in spool.kept_payloads():
                    write(text, sentences)
                    wbar.update()
        if not summary.kept:
            raise PrepareError(nothing_usable(o, summary))
        for f in files:
            f.close()
        for t, p in zip(tmps, outputs):
            os.replace(t, p)
    except BaseException:
        for f in files:
            f.close()
        for t in tmps:
            if os.path.exists(t):
                os.remove(t)
        raise
    finally:
        bar.close()
        if spool is not None:
            spool.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    summary.seconds = time.time() - t0
    return summary


# ----------------------------------------------------------------------------- command line

FLAGS = flags.FLAGS


def _define_flags() -> None:
    define = {"bool": flags.DEFINE_bool, "int": flags.DEFINE_integer,
              "float": flags.DEFINE_float}
    for f in dataclasses.fields(Options):
        kind = str(f.type).split(" ")[0]
        define.get(kind, flags.DEFINE_string)(f.name, f.default, f.metadata["help"])


def _main_sample(o: Options) -> int:
    """--format=sample: the raw sample corpus's converter over a folder of .txt files, into
    one output file."""
    paths = sorted(glob.glob(os.path.join(o.input, "**", "*.txt"), recursive=True))
    if not paths:
        raise app.UsageError(f"no .txt files under {o.input}")
    out, empty = [], []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            docs = convert_text(f.read(), o.paragraphs_per_doc)
        out.append(format_documents(docs))
        if not docs:
            empty.append(path)
    if len(empty) == len(paths):  # before writing: an older output stays
        print(f"prepare_corpus: error: --input={o.input}: no text in its {len(paths)} "
              f".txt file(s) ({files_named(empty)}): empty, blank or only headings; "
              f"{o.output} not written", file=sys.stderr)
        return 2
    if empty:
        print(f"prepare_corpus: warning: {len(empty)} of {len(paths)} files hold no text "
              f"(empty, blank or only headings): {files_named(empty)}", file=sys.stderr)
    tmp = o.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(out))
    os.replace(tmp, o.output)
    print(f"wrote {o.output} from {len(paths)} files")
    return 0


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    o = Options(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(Options)})
    if not o.input or not o.output:
        raise app.UsageError("--input and --output are required")
    for flag in ("input", "output"):
        if "://" in getattr(o, flag) and o.runner == "local":
            raise app.UsageError(f"--{flag}={getattr(o, flag)}: prepare_corpus reads and "
                                 f"writes local files; on Beam (--runner) it reads and "
                                 f"writes buckets")
    if o.format == "sample":
        return _main_sample(o)
    try:
        summary = prepare(o)  # a PrepareError: one line, exit 2 (cli.run)
    except KeyboardInterrupt:
        print("prepare_corpus: interrupted; no output written", file=sys.stderr)
        return 130
    print(summary.text())
    print("wrote " + ", ".join(summary.outputs))
    if summary.dropped["bad input"]:
        print(f"prepare_corpus: warning: {summary.dropped['bad input']} bad input(s) skipped "
              f"(named in the summary)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from bert_jax import cli

    cli.quiet_native_logs()
    _define_flags()
    cli.run(main)
