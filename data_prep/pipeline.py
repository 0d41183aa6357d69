"""Streaming corpus -> TFRecords: read, chunk, tokenize + sample + mask + serialize in worker
processes, merge in order, write round-robin into the output files.

Memory is bounded by the chunk size (default 1 MB of text per chunk, at most
2 * num_workers chunks in flight), not by the corpus: the random B of NSP is drawn from
another document of the same chunk, and instances are shuffled within the chunk (the
input pipeline shuffles across files/chunks with its own buffer). A document longer than a
chunk is cut into chunk-sized documents.

Deterministic: chunk boundaries depend only on the text, and chunk k draws from random
streams seeded by (random_seed, k), so the output is byte-identical for any num_workers.
"""

from __future__ import annotations

import codecs
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
import dataclasses
import multiprocessing as mp
import os
import pickle
import random
import shutil
import sys
import tempfile
import time
from typing import Iterator, Sequence

import numpy as np
from etils import epath

from bert_jax import paths as bert_paths
from bert_jax.data import features as features_lib
from data_prep import instances as inst
from data_prep import packing
from data_prep import paths as dp_paths
from data_prep import tfrecord
from data_prep import workers
from bert_jax.data.features import files_named
from bert_jax.tokenization import load_tokenizer

_BATCH = 4096  # instances assembled + serialized at once (bounds the numpy temporaries)
_READ_BLOCK = 1 << 20


@dataclasses.dataclass
class Stats:
    input_bytes: int = 0
    replaced_bytes: int = 0
    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    unk_tokens: int = 0
    instances: int = 0
    is_next: int = 0
    instance_tokens: int = 0      # real tokens in instances, [CLS]/[SEP] included
    candidates: int = 0           # maskable tokens (not [CLS]/[SEP]/padding)
    masked: int = 0
    decisions: list = dataclasses.field(default_factory=lambda: [0, 0, 0])  # mask/keep/random
    rows: int = 0                 # records written: instances, or packed rows (--pack)
    moved: int = 0                # --pack: sequences given a row of their own (MLM slots)
    output_bytes: int = 0
    seconds: float = 0.0

    def add(self, o: "Stats") -> None:
        for f in dataclasses.fields(self):
            if f.name == "decisions":
                self.decisions = [a + b for a, b in zip(self.decisions, o.decisions)]
            elif f.name != "seconds":
                setattr(self, f.name, getattr(self, f.name) + getattr(o, f.name))

    def summary(self, no_nsp: bool = False, max_seq_length: int = 0,
                max_sequences_per_pack: int = 0) -> str:
        def frac(a, b):
            return a / b if b else 0.0
        d = self.decisions
        nd = sum(d)
        rate = self.instances / self.seconds if self.seconds else 0.0
        lines = []
        if max_seq_length:  # padding share of the rows of max_seq_length tokens
            pad = [1 - frac(self.instance_tokens, n * max_seq_length)
                   for n in (self.instances, self.rows)]
            if max_sequences_per_pack:
                lines = [
                    f"packing          {frac(self.instances, self.rows):.3f} sequences per row "
                    f"(was 1; at most {max_sequences_per_pack}, SPFHP): {self.rows:,} rows",
                    f"padding          {pad[0]:.2%} of the tokens before packing, {pad[1]:.2%} "
                    f"after (rows of {max_seq_length})"]
                if self.moved:
                    lines.append(f"moved            {self.moved:,} sequences to rows of their "
                                 f"own (the row's MLM slots were full)")
            else:
                lines = [f"padding          {pad[0]:.2%} of the tokens (rows of "
                         f"{max_seq_length}; --pack removes most of it)"]
        return "\n".join([
            f"documents        {self.documents:,}",
            f"sentences        {self.sentences:,}",
            f"tokens           {self.tokens:,}",
            f"UNK rate         {frac(self.unk_tokens, self.tokens):.4%}",
            f"replaced bytes   {self.replaced_bytes:,} (invalid UTF-8)",
            f"instances        {self.instances:,}",
            ("IsNext fraction  n/a (--no_nsp)" if no_nsp else
             f"IsNext fraction  {frac(self.is_next, self.instances):.2%}"),
            f"masked fraction  {frac(self.masked, self.candidates):.2%} of non-special tokens"
            f" ([MASK] {frac(d[0], nd):.1%} / kept {frac(d[1], nd):.1%} /"
            f" random {frac(d[2], nd):.1%})",
            f"seconds          {self.seconds:.1f}",
            f"instances/s      {rate:,.0f}",
            f"input MB/s       {self.input_bytes / 1e6 / self.seconds if self.seconds else 0:.2f}",
            f"output           {self.output_bytes / 1e6:.1f} MB",
        ] + lines)


# ----------------------------------------------------------------------------- reading

_REPLACED = [0]  # bytes replaced so far by the handler below (this process)


def _count_replace(exc: UnicodeDecodeError):
    """codecs error handler: invalid UTF-8 -> U+FFFD, counting the bytes replaced."""
    _REPLACED[0] += exc.end - exc.start
    return "\ufffd", exc.end


codecs.register_error("data_prep_count_replace", _count_replace)


def iter_lines(path: str, stats: Stats, open_fn=None) -> Iterator[str]:
    """Decoded lines of a file, read in 1 MB blocks (a line may be any length). `open_fn`
    opens the path for reading bytes (default: etils epath, local or gs://)."""

    def decode(raw: bytes) -> list[str]:
        before = _REPLACED[0]
        text = raw.decode("utf-8", "data_prep_count_replace")
        stats.replaced_bytes += _REPLACED[0] - before
        return text.split("\n")

    rest = b""
    with (open_fn(path) if open_fn else epath.Path(path).open("rb")) as f:  # local or gs://
        while True:
            block = f.read(_READ_BLOCK)
            stats.input_bytes += len(block)
            if not block:
                break
            block = rest + block
            cut = block.rfind(b"\n")
            if cut < 0:
                rest = block
                continue
            rest = block[cut + 1:]
            # No UTF-8 sequence contains byte 0x0A, so cutting at a newline is always safe.
            yield from decode(block[:cut])
    if rest:
        yield from decode(rest)


def iter_documents(paths: Sequence[str], stats: Stats, max_doc_chars: int,
                   open_fn=None) -> Iterator[list[str]]:
    """Documents (lists of stripped non-empty lines). A blank or whitespace-only line ends a
    document, and so does the end of a file; a document over max_doc_chars is cut. A file's
    documents do not depend on the files before it (data_prep/beam/records.py reads files
    apart)."""
    for path in paths:
        doc, size = [], 0
        for line in iter_lines(path, stats, open_fn):
            line = line.strip()
            if not line:
                if doc:
                    yield doc
                doc, size = [], 0
                continue
            doc.append(line)
            size += len(line)
            if size >= max_doc_chars:
                yield doc
                doc, size = [], 0
        if doc:
            yield doc


def doc_chars(doc: list[str]) -> int:
    """A document's size for chunking: the characters of its stripped lines."""
    return sum(map(len, doc))


def iter_chunks(paths: Sequence[str], stats: Stats, chunk_chars: int
                ) -> Iterator[tuple[int, list[list[str]], int]]:
    """(chunk_index, documents, input bytes read so far) with ~chunk_chars of text each."""
    chunk, size, k = [], 0, 0
    for doc in iter_documents(paths, stats, chunk_chars):
        chunk.append(doc)
        size += doc_chars(doc)
        if size >= chunk_chars:
            yield k, chunk, stats.input_bytes
            chunk, size, k = [], 0, k + 1
    if chunk:
        yield k, chunk, stats.input_bytes


# ----------------------------------------------------------------------------- workers

@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    vocab_file: str | None
    spm_model_file: str | None
    do_lower_case: bool
    cfg: inst.InstanceConfig
    random_seed: int


_STATE: dict = {}


def init_worker(spec: WorkerSpec) -> None:
    """Loads the tokenizer of `spec` into this process, for chunk_rows and process_chunk."""
    # Our processes are the parallelism; Rust threads inside each would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tok = load_tokenizer(spec.vocab_file, spec.spm_model_file, spec.do_lower_case)
    _STATE.update(spec=spec, tok=tok, vi=inst.VocabInfo.from_tokenizer(tok))


def _tokenize_chunk(tok, docs: list[list[str]], stats: Stats):
    """Flat ids <int32>[tokens] and per document (start, sentence end offsets)."""
    flat, lens = tok.encode_batch_flat([s for d in docs for s in d])
    ends = np.cumsum(lens)
    out, k = [], 0
    for d in docs:
        n = len(d)
        e = ends[k:k + n][lens[k:k + n] > 0]  # sentences with no tokens are dropped
        if len(e):
            out.append((int(ends[k - 1]) if k else 0, e.tolist()))
        k += n
    stats.documents += len(out)
    stats.sentences += int((lens > 0).sum())
    stats.tokens += len(flat)
    stats.unk_tokens += int((flat == tok.unk_id).sum())
    return flat, out


def _packed_stream(flat: np.ndarray, docs: inst.Docs, sep_id: int):
    """--no_nsp: documents back to back with a [SEP] after each; sentence end offsets."""
    pieces, bounds, seps, pos = [], [], set(), 0
    for start, cum in docs:
        pieces.append(flat[start:cum[-1]])
        bounds.extend(c - start + pos for c in cum)
        pos += cum[-1] - start
        # The [SEP] after a document is kept only inside an instance: cut points are
        # sentence ends, and an instance never starts with it.
        pieces.append(np.array([sep_id], dtype=np.int32))
        seps.add(pos)
        pos += 1
    stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    return stream, bounds, seps


def chunk_rows(chunk_index: int, docs: list[list[str]], stats: Stats) -> Iterator[dict]:
    """One chunk -> its rows, in output order: instances.assemble's arrays of at most
    _BATCH instances at a time, or with --pack the packed rows of those instances
    (packing.pack_rows). Counts into `stats`. Needs init_worker's state."""
    spec: WorkerSpec = _STATE["spec"]
    tok, vi, cfg = _STATE["tok"], _STATE["vi"], spec.cfg
    flat, tdocs = _tokenize_chunk(tok, docs, stats)
    # Seeds from (seed, chunk index) only: the same whatever worker runs the chunk.
    py_rng = random.Random(f"bert_jax.data_prep:{spec.random_seed}:{chunk_index}")
    np_rng = np.random.default_rng([spec.random_seed, chunk_index])
    if not tdocs:
        return
    if cfg.no_nsp:
        src, bounds, seps = _packed_stream(flat, tdocs, vi.sep_id)
        specs = inst.packed_instances(len(src), bounds, cfg, py_rng, seps)
    else:
        src = flat
        specs = inst.nsp_instances(tdocs, cfg, py_rng)
    specs = np.asarray(specs, dtype=np.int64).reshape(-1, 5)
    if not len(specs):
        return
    specs = specs[np_rng.permutation(len(specs))]  # shuffle within the chunk
    has_special = bool(((src == vi.sep_id) | (src == vi.cls_id)).any())
    k = cfg.max_sequences_per_pack
    for group, sizes in _groups(specs, cfg, np_rng, stats):
        arr = inst.assemble(src, group, cfg, vi, np_rng, has_special)
        w = arr["masked_lm_weights"]
        stats.instances += len(w)
        stats.is_next += int((arr["next_sentence_labels"] == 0).sum())
        stats.instance_tokens += int(arr["input_mask"].sum())
        stats.candidates += int(arr["n_candidates"].sum())
        stats.masked += int(w.sum())
        dec = arr["decision"]
        stats.decisions = [stats.decisions[i] + int((dec == i).sum()) for i in range(3)]
        if sizes is not None:
            arr = packing.pack_rows(arr, sizes, k, features_lib.predictions_per_pack(
                cfg.max_predictions_per_seq, k))
        stats.rows += len(arr["input_ids"])
        yield arr


def process_chunk(chunk_index: int, docs: list[list[str]]):
    """One chunk -> (chunk_index, framed records, record end offsets, Stats)."""
    cfg, vocab_size = _STATE["spec"].cfg, _STATE["vi"].vocab_size
    stats = Stats()
    max_id = max(vocab_size - 1, cfg.max_seq_length)
    table = features_lib.feature_table(cfg.max_sequences_per_pack)
    blobs, all_ends, base = [], [], 0
    for arr in chunk_rows(chunk_index, docs, stats):
        blob, ends = tfrecord.serialize_examples(arr, max_id, table)
        blobs.append(blob)
        all_ends.append(ends + base)
        base += len(blob)
    if not blobs:
        return chunk_index, b"", np.zeros(0, np.int64), stats
    return chunk_index, b"".join(blobs), np.concatenate(all_ends), stats


def iter_rows(input_paths: Sequence[str], spec: WorkerSpec,
              chunk_chars: int = 1_000_000) -> Iterator[dict]:
    """The rows the tool would write for `input_paths` (chunk_rows' arrays), made in this
    process and kept in memory: for benchmarks. Inputs must be validated."""
    init_worker(spec)
    stats = Stats()
    for k, docs, _ in iter_chunks(input_paths, stats, chunk_chars):
        yield from chunk_rows(k, docs, stats)


def _groups(specs: np.ndarray, cfg: inst.InstanceConfig, rng: np.random.Generator,
            stats: Stats):
    """(specs, sizes) of at most _BATCH instances at a time: sizes is None without --pack,
    else the number of instances of each packed row (data_prep/packing.py); the members
    of a row are consecutive specs."""
    k = cfg.max_sequences_per_pack
    if not k:
        for lo in range(0, len(specs), _BATCH):
            yield specs[lo:lo + _BATCH], None
        return
    lengths = inst.spec_lengths(specs)
    packs, moved = packing.assign(
        lengths, cfg.max_seq_length, k, rng,
        packing.max_predictions(lengths, cfg.max_predictions_per_seq, cfg.masked_lm_prob),
        features_lib.predictions_per_pack(cfg.max_predictions_per_seq, k))
    stats.moved += moved
    per = max(1, _BATCH // k)
    for lo in range(0, len(packs), per):
        group = packs[lo:lo + per]
        yield specs[np.concatenate(group)], [len(p) for p in group]


# ----------------------------------------------------------------------------- driver

def split_records(blob: bytes, ends: np.ndarray, count: int, num_files: int) -> list[bytes]:
    """The framed records `blob` (record end offsets `ends`) cut into each output file's
    part, when `count` records of the run come before them: record i of the whole run goes
    to file i % num_files, as in the original tool."""
    if num_files == 1:
        return [bytes(blob)]
    n = len(ends)
    starts = np.concatenate([[0], ends[:-1]]).tolist()
    ends_l = ends.tolist()
    mv = memoryview(blob)
    return [b"".join(mv[starts[i]:ends_l[i]]
                     for i in range((f - count) % num_files, n, num_files))
            for f in range(num_files)]


class _Outputs:
    """Output files written under temporary names, renamed only when all is done. A URI
    output (gs://...) is staged in a local temporary folder and uploaded by `commit`; an
    object in a bucket appears whole when its upload completes."""

    def __init__(self, paths: Sequence[str]):
        self.paths = list(paths)
        self.staging = (tempfile.mkdtemp(prefix="data_prep-upload-")
                        if any(dp_paths.is_uri(p) for p in self.paths) else None)
        self.tmps = [os.path.join(self.staging, f"{i:05d}.tfrecord") if dp_paths.is_uri(p)
                     else f"{p}.tmp-{os.getpid()}" for i, p in enumerate(self.paths)]
        for p in self.paths:
            if dp_paths.is_uri(p):
                epath.Path(p).parent.mkdir(parents=True, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
        self.files = [open(t, "wb") for t in self.tmps]
        self.count = 0  # records written so far (round-robin position)

    def write(self, blob: bytes, ends: np.ndarray) -> None:
        for f, part in zip(self.files, split_records(blob, ends, self.count, len(self.files))):
            f.write(part)
        self.count += len(ends)

    def commit(self) -> None:
        for f in self.files:
            f.close()
        for t, p in zip(self.tmps, self.paths):
            if dp_paths.is_uri(p):
                bert_paths.copy_file(t, p)
                os.remove(t)
            else:
                os.replace(t, p)
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)

    def abort(self) -> None:
        for f in self.files:
            f.close()
        for t in self.tmps:
            if os.path.exists(t):
                os.remove(t)
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)


def run(input_paths: Sequence[str], output_paths: Sequence[str], spec: WorkerSpec,
        num_workers: int = 1, chunk_chars: int = 1_000_000, progress: bool = True,
        require_instances: bool = False) -> Stats:
    """Write the instances of all input files; returns the run's Stats. Inputs, vocabulary
    and config must already be validated (see create_pretraining_data.py).
    require_instances: text that yields no instance raises data_prep.paths.InputError and
    writes nothing (else empty output files are written)."""
    from tqdm import tqdm

    fork = num_workers > 1 and sys.platform.startswith("linux") and workers.fork_safe()
    t0 = time.time()
    stats = Stats()
    total_bytes = sum(dp_paths.size(p) for p in input_paths)
    chunks = iter_chunks(input_paths, stats, chunk_chars)
    outputs = _Outputs(output_paths)
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, disable=not progress,
               desc="create_pretraining_data", file=sys.stderr)
    pool = spool = None
    try:
        if num_workers <= 1:
            init_worker(spec)
            results = (process_chunk(k, docs) + (nb,) for k, docs, nb in chunks)
        else:
            # Chunks and records travel in files next to the output, not through the
            # pool's pipes: a 10 MB result through a 64 KB pipe is hundreds of process
            # switches, which stall both sides on a busy machine.
            spool = tempfile.mkdtemp(prefix=".data_prep-", dir=(
                None if dp_paths.is_uri(output_paths[0])  # a local temporary folder then
                else os.path.dirname(os.path.abspath(output_paths[0]))))
            if fork:
                # fork: workers inherit the loaded tokenizer (no re-import, no re-load).
                init_worker(spec)
                pool = ProcessPoolExecutor(num_workers, mp_context=mp.get_context("fork"))
            else:
                # A process that has loaded TensorFlow, JAX or torch (a notebook, a test
                # session) cannot fork safely (workers.fork_safe): fresh interpreters.
                pool = ProcessPoolExecutor(num_workers, mp_context=mp.get_context("spawn"),
                                           initializer=init_worker, initargs=(spec,))
            results = _results(pool, chunks, 2 * num_workers, spool)
        done_bytes = 0
        for _, blob, ends, st, nb in results:
            outputs.write(blob, ends)
            stats.add(st)
            stats.output_bytes += len(blob)
            bar.update(nb - done_bytes)
            done_bytes = nb
            bar.set_postfix(instances=f"{stats.instances:,}", refresh=False)
        if pool is not None:
            pool.shutdown(wait=True)
            pool = None
        if require_instances and not stats.instances:
            raise dp_paths.InputError(
                f"no training instances from {files_named(list(input_paths))}: no line of "
                f"their text yields a token (only control characters or invisible "
                f"characters?); expected {dp_paths.TEXT_FORMAT}; nothing written")
        outputs.commit()
    except BaseException:
        outputs.abort()
        raise
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if spool is not None:
            shutil.rmtree(spool, ignore_errors=True)
    stats.seconds = time.time() - t0
    return stats


def process_chunk_to_file(chunk_index: int, docs_path: str, spool: str):
    """process_chunk in a worker, through files in spool both ways: (chunk_index, the
    records' file, record end offsets, Stats)."""
    with open(docs_path, "rb") as f:
        docs = pickle.load(f)
    os.remove(docs_path)
    k, blob, ends, stats = process_chunk(chunk_index, docs)
    path = os.path.join(spool, f"chunk-{k:08d}.bin")
    with open(path, "wb") as f:
        f.write(blob)
    return k, path, ends, stats


def _spooled(chunks, spool: str):
    """iter_chunks' chunks as process_chunk_to_file's jobs: each chunk's documents in a
    file of spool, tagged with the input bytes read so far."""
    for k, docs, nb in chunks:
        docs_path = os.path.join(spool, f"docs-{k:08d}.pkl")
        with open(docs_path, "wb") as f:
            pickle.dump(docs, f, protocol=pickle.HIGHEST_PROTOCOL)
        yield (k, docs_path, spool), nb


def _results(pool, chunks, max_in_flight: int, spool: str):
    """process_chunk's results plus the input bytes read, in chunk order, with at most
    max_in_flight chunks submitted and not yet consumed (workers.ordered)."""
    try:
        for (k, path, ends, stats), nbytes in workers.ordered(
                pool, process_chunk_to_file, _spooled(chunks, spool), max_in_flight):
            with open(path, "rb") as f:
                blob = f.read()
            os.remove(path)
            yield k, blob, ends, stats, nbytes
    except BrokenProcessPool:
        # A worker that cannot start (its traceback is on stderr) ends the run here; a
        # multiprocessing.Pool would start it again and again, for ever.
        raise RuntimeError("a data_prep worker process died (its error is printed "
                           "above); --num_workers=1 runs the work in this process") from None
