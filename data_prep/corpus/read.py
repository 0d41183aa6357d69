"""Reading the corpus front door's inputs: the format of a file or folder (from its name,
or --format), the input list (comma lists, globs, folders, `datasets` folders), and a reader
per format that streams a file's documents unparsed (RawDoc): MediaWiki pages
(data_prep/corpus/wiki.py), JSON lines, text (a document per file or per blank-line block),
a parquet or arrow column in record batches. .bz2 / .gz / .zst are decompressed as they are
read. Cheap: bytes are split, nothing is parsed (data_prep/corpus/clean.py does that)."""

from __future__ import annotations

import glob
import io
import json
import os
from typing import Iterator

from data_prep.corpus.types import FORMATS, Options, PrepareError, RawDoc, short_error
from data_prep.corpus.wiki import split_pages

_COMPRESSION = (".bz2", ".gz", ".zst")
_BY_EXTENSION = {".xml": "wiki", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
                 ".parquet": "parquet", ".arrow": "arrow", ".txt": "text"}


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


class Progress:
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


def _open(path: str, progress: Progress):
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
        yield RawDoc("bad", f"not a readable {fmt} file ({short_error(e)})", path, "")
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
                   progress: Progress | None = None) -> Iterator[RawDoc]:
    """One input file's documents, unparsed, in order; a file that cannot be read to its
    end gives a "bad" item after what it did give."""
    progress = progress or Progress()
    if fmt in ("parquet", "arrow"):
        yield from _columns(path, fmt, options.text_key)
        return
    try:
        stream = _open(path, progress)
    except OSError as e:
        yield RawDoc("bad", f"cannot be read ({short_error(e)})", path, "")
        return
    with stream:
        try:
            if fmt == "wiki":
                yield from split_pages(stream, path)
            elif fmt == "jsonl":
                yield from _lines(stream, path, "json")
            elif options.doc_split == "blank_line":
                yield from _blocks(stream, path)
            else:
                yield RawDoc("text", stream.read(), path, "")
        except _stream_errors() as e:
            yield RawDoc("bad", f"truncated or corrupt ({short_error(e)}); what was read before "
                         f"is kept", path, "")
