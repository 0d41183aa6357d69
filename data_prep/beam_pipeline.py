"""create_pretraining_data and prepare_corpus as Apache Beam pipelines: the same output as
their local paths, byte for byte, on DirectRunner or a cluster (Dataflow, Flink, Spark).
Imported only when --runner names a Beam runner; `pip install .[beam]`.

create_pretraining_data (`run`, `build`):

The local path reads the input files in order, cuts their documents into ~chunk_chars
chunks across file boundaries, seeds chunk k from (random_seed, k), and sends record i of
the run to output file i % num_files. The pipeline computes the same chunks and record
positions without one sequential reader:

  1. per input file, in parallel: the size of each document;
  2. one step: chunk boundaries from those sizes (one integer per document);
  3. per input file, in parallel: each document keyed by its chunk, grouped by chunk
     and put back in input order;
  4. per chunk, in parallel: the local path's own `process_chunk`;
  5. one step: each chunk's first record position (one integer per chunk);
  6. per output file: its records from every chunk, in chunk order, written under a
     temporary name; the names are swapped in when the whole run succeeded.

Steps 2 and 5 see one integer per document or chunk, not text. Step 6 holds one output
file's bytes in a worker's memory: give a large corpus more --num_output_shards.
Files are read and written through Beam's FileSystems (local, gs://, s3://, hdfs://).

prepare_corpus (`prepare`, `build_corpus`): documents are read per file (one worker per
file: a single dump is read by one worker) and cleaned and fingerprinted in parallel
(prepare_corpus's pure `clean_document` and `fingerprint`, the expensive part). Each
document's digest and LSH band keys are grouped by key (a GroupByKey, spread over the
workers); only the documents of a key that two or more share, with their signatures, reach
one step that applies data_prep/dedup.py's greedy rule in input order (its answers depend
on the order, as locally). A last step walks every document's small record (a reason and
a few integers, no text or signature) for the summary and each kept document's position,
which deals it round-robin into the output files. The greedy step holds the documents
that share a key (duplicates and false LSH candidates, about 0.6 KB each), not every
document; the last step holds a few integers per document.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import pickle
import shlex
import shutil
import tempfile
import time
import uuid
from typing import Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from data_prep import paths as dp_paths
from data_prep import pipeline
from data_prep import dedup as dedup_lib
from data_prep.corpus import clean, output, read, types

_NAMESPACE = "data_prep"



def pipeline_options(runner: str, beam_options: str = "") -> PipelineOptions:
    """The PipelineOptions of --runner and --beam_options, checked before any work starts:
    ValueError in one line for a runner Beam does not know or options that do not parse."""
    from apache_beam.runners.runner import create_runner

    try:
        create_runner(runner)
    except ValueError:
        raise ValueError(f"--runner={runner}: not a Beam runner; use local, DirectRunner, "
                         f"DataflowRunner, FlinkRunner, SparkRunner or a PipelineRunner "
                         f"subclass's qualified name") from None
    try:
        return PipelineOptions([f"--runner={runner}"] + shlex.split(beam_options))
    except ValueError as e:
        raise ValueError(f"--beam_options={beam_options!r}: {e}") from None

def _open(path: str):
    # Raw bytes as the local path reads them: no decompression guessed from the name.
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _doc_sizes(item, chunk_chars: int):
    """(file index, path) -> (file index, <int64>[documents] sizes)."""
    i, path = item
    sizes = [pipeline.doc_chars(d)
             for d in pipeline.iter_documents([path], pipeline.Stats(), chunk_chars, _open)]
    return i, np.asarray(sizes, dtype=np.int64)


def plan_chunks(file_sizes: Sequence[tuple[int, np.ndarray]], chunk_chars: int
                ) -> dict[int, tuple[int, list[int]]]:
    """Chunk boundaries as iter_chunks draws them: per file index, (chunk of its first
    document, the indices of its documents that start a later chunk). A chunk ends once
    its documents reach chunk_chars characters; the last one may be shorter."""
    plan, k, size = {}, 0, 0
    for i, sizes in sorted(file_sizes, key=lambda t: t[0]):
        first, starts = k, []
        for j, n in enumerate(sizes.tolist()):
            if len(starts) < k - first:  # document j starts chunk k
                starts.append(j)
            size += n
            if size >= chunk_chars:
                k, size = k + 1, 0
        plan[i] = (first, starts)
    return plan


class _KeyDocuments(beam.DoFn):
    """(file index, path) -> (chunk, ((file index, document index), document))."""

    def __init__(self, chunk_chars: int):
        self.chunk_chars = chunk_chars
        self.input_bytes = Metrics.counter(_NAMESPACE, "input_bytes")
        self.replaced_bytes = Metrics.counter(_NAMESPACE, "replaced_bytes")

    def process(self, item, plan):
        i, path = item
        first, starts = plan[i]
        stats = pipeline.Stats()
        for j, doc in enumerate(pipeline.iter_documents([path], stats, self.chunk_chars,
                                                        _open)):
            yield first + bisect.bisect_right(starts, j), ((i, j), doc)
        self.input_bytes.inc(stats.input_bytes)
        self.replaced_bytes.inc(stats.replaced_bytes)


class _ProcessChunk(beam.DoFn):
    """(chunk, keyed documents) -> (chunk, framed records, record end offsets): the local
    path's process_chunk, seeded by the chunk index alone; its Stats become counters.

    The vocabulary travels inside the step (read where the pipeline is built), so that a
    file on the launching machine serves workers that cannot see it."""

    _FILES = ("vocab_file", "spm_model_file")

    def __init__(self, spec: pipeline.WorkerSpec):
        self.spec = spec
        self.files = {}
        for name in self._FILES:
            path = getattr(spec, name)
            if path:
                with _open(path) as f:
                    self.files[name] = (path.rstrip("/").rsplit("/", 1)[-1], f.read())

    def setup(self):
        self.dir = tempfile.mkdtemp(prefix="data_prep-vocab-")
        local = {}
        for name, (base, data) in self.files.items():
            local[name] = os.path.join(self.dir, base)
            with open(local[name], "wb") as f:
                f.write(data)
        pipeline.init_worker(dataclasses.replace(self.spec, **local))

    def teardown(self):
        if getattr(self, "dir", None):
            shutil.rmtree(self.dir, ignore_errors=True)

    def process(self, element):
        k, keyed = element
        docs = [doc for _, doc in sorted(keyed, key=lambda t: t[0])]
        _, blob, ends, stats = pipeline.process_chunk(k, docs)
        for f in dataclasses.fields(stats):
            value = getattr(stats, f.name)
            if f.name == "decisions":
                for d, v in enumerate(value):
                    Metrics.counter(_NAMESPACE, f"decisions_{d}").inc(v)
            elif f.name not in ("seconds", "input_bytes", "replaced_bytes", "output_bytes"):
                Metrics.counter(_NAMESPACE, f.name).inc(value)
        Metrics.counter(_NAMESPACE, "output_bytes").inc(len(blob))
        yield k, blob, ends


def first_records(counts: Sequence[tuple[int, int]]) -> dict[int, int]:
    """Per chunk, how many records of the run come before its first (chunks in order)."""
    out, total = {}, 0
    for k, n in sorted(counts):
        out[k] = total
        total += n
    return out


def _split(result, first: dict[int, int], num_files: int):
    """(chunk, records, ends) -> (output file, (chunk, its records for that file))."""
    k, blob, ends = result
    for f, part in enumerate(pipeline.split_records(blob, ends, first[k], num_files)):
        yield f, (k, part)


def _write(item, tmp_paths: Sequence[str]):
    f, parts = item
    with FileSystems.create(tmp_paths[f],
                            compression_type=CompressionTypes.UNCOMPRESSED) as out:
        for _, part in sorted(parts, key=lambda t: t[0]):
            out.write(part)
    yield f


def build(p, input_paths: Sequence[str], tmp_paths: Sequence[str],
          spec: pipeline.WorkerSpec, chunk_chars: int):
    """Adds the stages to pipeline `p`; the output files are written under `tmp_paths`
    (none when the input holds no document)."""
    # Reshuffle: a runner may otherwise run the few elements of Create, and every step
    # fused after it, as one bundle on one worker; the files are to be read in parallel.
    files = (p
             | "Inputs" >> beam.Create(list(enumerate(input_paths)))
             | "SpreadInputs" >> beam.Reshuffle())
    plan = (files
            | "DocumentSizes" >> beam.Map(_doc_sizes, chunk_chars)
            | "AllSizes" >> beam.combiners.ToList()
            | "PlanChunks" >> beam.Map(plan_chunks, chunk_chars))
    results = (files
               | "KeyDocuments" >> beam.ParDo(_KeyDocuments(chunk_chars),
                                              beam.pvalue.AsSingleton(plan))
               | "GroupChunks" >> beam.GroupByKey()
               | "ProcessChunks" >> beam.ParDo(_ProcessChunk(spec)))
    first = (results
             | "RecordCounts" >> beam.Map(lambda r: (r[0], len(r[2])))
             | "AllCounts" >> beam.combiners.ToList()
             | "FirstRecords" >> beam.Map(first_records))
    return (results
            | "SplitByFile" >> beam.FlatMap(_split, beam.pvalue.AsSingleton(first),
                                           len(tmp_paths))
            | "GroupByFile" >> beam.GroupByKey()
            | "WriteFiles" >> beam.FlatMap(_write, list(tmp_paths)))


def _counters(result) -> dict[str, int]:
    out = {}
    for c in result.metrics().query(MetricsFilter().with_namespace(_NAMESPACE))["counters"]:
        try:
            value = c.committed
        except Exception:  # a runner that reports attempted values only
            value = None
        if value is None:
            value = c.attempted
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value)
    return out


def run(input_paths: Sequence[str], output_paths: Sequence[str], spec: pipeline.WorkerSpec,
        runner: str, beam_options: str = "", chunk_chars: int = 1_000_000,
        require_instances: bool = False) -> pipeline.Stats:
    """pipeline.run's work on Beam `runner` (DirectRunner, DataflowRunner, ...), with the
    pipeline options of `beam_options` (a command line: "--project=p --region=r ...").
    Waits for the run; returns its Stats (from the pipeline's counters). The outputs
    appear under their final names only when the whole run succeeded."""
    t0 = time.time()
    token = uuid.uuid4().hex[:12]
    tmp_paths = [f"{p}.tmp-beam-{token}" for p in output_paths]
    options = pipeline_options(runner, beam_options)
    committed = False
    try:
        with beam.Pipeline(options=options) as p:
            build(p, input_paths, tmp_paths, spec, chunk_chars)
        result = p.result
        counts = _counters(result)
        stats = pipeline.Stats()
        for f in dataclasses.fields(stats):
            if f.name == "decisions":
                stats.decisions = [counts.get(f"decisions_{d}", 0) for d in range(3)]
            elif f.name != "seconds":
                setattr(stats, f.name, counts.get(f.name, 0))
        if require_instances and not stats.instances:
            raise dp_paths.InputError(
                f"no training instances from {len(input_paths)} input file(s): no line of "
                f"their text yields a token; expected {dp_paths.TEXT_FORMAT}; nothing written")
        for t, final in zip(tmp_paths, output_paths):
            if not FileSystems.exists(t):  # no document at all: empty files, as locally
                FileSystems.create(t, compression_type=CompressionTypes.UNCOMPRESSED).close()
            if FileSystems.exists(final):
                FileSystems.delete([final])
            FileSystems.rename([t], [final])
        committed = True
    finally:
        if not committed:
            stale = [t for t in tmp_paths if FileSystems.exists(t)]
            if stale:
                FileSystems.delete(stale)
    stats.seconds = time.time() - t0
    return stats


# ----------------------------------------------------------------------------- prepare_corpus

def _local_copy(path: str, folder: str) -> str:
    """A local file with `path`'s bytes (the sources' readers need one: pyarrow maps it)."""
    if "://" not in path:
        return path
    local = os.path.join(folder, path.rstrip("/").rsplit("/", 1)[-1])
    with _open(path) as src, open(local, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return local


def _read_file(item, options):
    """(file index, (path, format)) -> ((file index, document index), RawDoc)."""
    i, (path, fmt) = item
    folder = tempfile.mkdtemp(prefix="data_prep-input-")
    try:
        local = _local_copy(path, folder)
        for j, raw in enumerate(read.read_documents(local, fmt, options)):
            # The notes name the file as given, not the worker's copy of it.
            yield (i, j), raw._replace(source=path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _clean(item, options):
    """((i, j), RawDoc) -> ((i, j), the document's text or None, its record for the
    decisions: (reason, note, sentences, bytes out, digest, signature))."""
    key, raw = item
    c = clean.clean_document(raw, options)
    if c.sentences is None:
        return key, None, (c.reason, c.note, 0, 0, None, None)
    text = output.format_document(c.sentences)
    digest, sig = (clean.fingerprint(c.sentences, options) if options.dedup else (None, None))
    return key, text, (None, "", len(c.sentences), len(text.encode("utf-8")), digest, sig)


def _shared_keys(item, options):
    """(key, (digest, signature)) -> (group, key) for its digest and each of its LSH bands:
    the keys of Deduplicator's digest set and band tables."""
    key, (digest, sig) = item
    yield ("digest", digest), key
    for band, k in enumerate(clean.minhasher(options).band_keys(sig).tolist()):
        yield (band, k), key


def _members(item):
    """(group, [keys]) -> (key, group) for every document of a group of two or more: a
    document alone in all its groups is kept and decides nothing about the others."""
    group, keys = item
    keys = list(keys)
    if len(keys) > 1:
        for key in keys:
            yield key, group


def _member(item):
    """(key, {"groups", "signature"}) -> (key, exact group or None, [band groups],
    signature) for a document in some shared group."""
    key, joined = item
    groups = list(joined["groups"])
    if groups:
        exact = next((g for g in groups if g[0] == "digest"), None)
        yield key, exact, [g for g in groups if g[0] != "digest"], joined["signature"][0]


def _near_step(members, options):
    """data_prep.dedup.greedy, in input order, over the documents of shared groups only:
    (key, "exact" | "near") of each one dropped."""
    members = sorted(members, key=lambda t: t[0])
    sigs = {key: sig for key, _, _, sig in members}
    yield from dedup_lib.greedy(((key, exact, bands) for key, exact, bands, _ in members),
                                sigs.__getitem__, clean.minhasher(options).min_equal)


def decide(records, drops: dict, inputs_bytes: int):
    """The local path's decisions in input order over every document's record: drops by
    reason (the duplicates' from `drops`, key -> "exact" | "near"), the kept documents'
    positions. Returns (Summary, {key: kept index})."""
    summary = output.Summary()
    kept = {}
    for key, (reason, note, n, nbytes) in sorted(records, key=lambda t: t[0]):
        summary.documents += 1
        if reason is None and key in drops:
            reason = f"{drops[key]} duplicate"
        if reason is not None:
            summary.drop(reason, note)
            continue
        kept[key] = summary.kept
        summary.keep(n, nbytes)
    summary.bytes_in = inputs_bytes
    return summary, kept


def _decide_step(records, drops, inputs_bytes, summary_path):
    summary, kept = decide(records, drops, inputs_bytes)
    with FileSystems.create(summary_path,
                            compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(pickle.dumps(summary))
    yield from kept.items()


def _place(item, num_files: int):
    """(key, {texts, kept}) -> (output file, (kept index, text)) for a kept document."""
    _, grouped = item
    if grouped["kept"] and grouped["texts"]:
        k = grouped["kept"][0]
        yield k % num_files, (k, grouped["texts"][0])


def _write_texts(item, tmp_paths: Sequence[str]):
    f, docs = item
    with FileSystems.create(tmp_paths[f],
                            compression_type=CompressionTypes.UNCOMPRESSED) as out:
        for _, text in sorted(docs, key=lambda t: t[0]):
            out.write(text.encode("utf-8"))
    yield f


def build_corpus(p, inputs: Sequence[tuple[str, str]], tmp_paths: Sequence[str], options,
                 inputs_bytes: int, summary_path: str):
    """prepare_corpus's stages on pipeline `p`: read per file, clean per document (in
    parallel after a reshuffle: one big dump is read by one worker, cleaned by all),
    digests and LSH band keys grouped by key, the greedy rule (data_prep/dedup.py is
    order-dependent) over the documents of shared keys only, then one step over every
    document's small record in input order for the kept positions, then each output
    file's kept documents in order."""
    cleaned = (p
               | "CorpusInputs" >> beam.Create(list(enumerate(inputs)))
               | "SpreadCorpusInputs" >> beam.Reshuffle()
               | "ReadDocuments" >> beam.FlatMap(_read_file, options)
               | "SpreadDocuments" >> beam.Reshuffle()
               | "CleanDocuments" >> beam.Map(_clean, options))
    texts = (cleaned
             | "KeptTexts" >> beam.Filter(lambda t: t[1] is not None)
             | "KeyTexts" >> beam.Map(lambda t: (t[0], t[1])))
    records = cleaned | "Records" >> beam.Map(lambda t: (t[0], t[2][:4]))
    if options.dedup:
        fingerprints = (cleaned
                        | "Fingerprinted" >> beam.Filter(lambda t: t[2][4] is not None)
                        | "Fingerprints" >> beam.Map(lambda t: (t[0], t[2][4:])))
        groups = (fingerprints
                  | "SharedKeys" >> beam.FlatMap(_shared_keys, options)
                  | "GroupKeys" >> beam.GroupByKey()
                  | "SharedGroups" >> beam.FlatMap(_members))
        signatures = fingerprints | "Signatures" >> beam.Map(lambda t: (t[0], t[1][1]))
        drops = ({"groups": groups, "signature": signatures}
                 | "JoinGroups" >> beam.CoGroupByKey()
                 | "Members" >> beam.FlatMap(_member)
                 | "AllMembers" >> beam.combiners.ToList()
                 | "Duplicates" >> beam.FlatMap(_near_step, options))
    else:
        drops = p | "NoDuplicates" >> beam.Create([])
    kept = (records
            | "InOrder" >> beam.combiners.ToList()
            | "Decide" >> beam.FlatMap(_decide_step, beam.pvalue.AsDict(drops),
                                       inputs_bytes, summary_path))
    return ({"texts": texts, "kept": kept}
            | "JoinKept" >> beam.CoGroupByKey()
            | "PlaceInFiles" >> beam.FlatMap(_place, len(tmp_paths))
            | "GroupTextsByFile" >> beam.GroupByKey()
            | "WriteTexts" >> beam.FlatMap(_write_texts, list(tmp_paths)))


def corpus_inputs(spec: str, fmt: str, split: str) -> list[tuple[str, str]]:
    """prepare_corpus's (file, format) list, bucket URIs (gs://...) included: a URI is a
    file or a glob of files (a datasets folder must be local)."""
    out = []
    for part in (p.strip() for p in (spec or "").split(",")):
        if not part:
            continue
        if "://" not in part:
            out += read.expand_inputs(part, fmt, split)
            continue
        if fmt not in types.FORMATS:
            raise types.PrepareError(f"--format={fmt}: expected one of {', '.join(types.FORMATS)}")
        found = sorted(m.path for r in FileSystems.match([part]) for m in r.metadata_list)
        if not found:
            raise types.PrepareError(f"--input={part}: no such file")
        out += [(f, read.detect_format(f) if fmt == "auto" else fmt) for f in found]
    if not out:
        raise types.PrepareError(f"--input={spec}: no input files")
    return out


def corpus_outputs(spec: str, num_shards: int) -> list[str]:
    """prepare_corpus's output names, a bucket prefix (gs://b/wiki/) included."""
    if spec and "://" in spec and num_shards >= 1:
        if spec.endswith("/"):
            prefix = spec + "corpus"
        elif num_shards == 1:
            return [spec]
        else:
            prefix = spec[:-4] if spec.endswith(".txt") else spec
        return [f"{prefix}-{i:05d}-of-{num_shards:05d}.txt" for i in range(num_shards)]
    return output.output_paths(spec, num_shards)


def prepare(options, runner: str, beam_options: str = ""):
    """prepare_corpus.prepare's work on Beam `runner`: the same output bytes and Summary.
    Inputs and outputs may be in a bucket. PrepareError when nothing usable is left
    (nothing written then)."""
    o = options
    t0 = time.time()
    types.check_options(o)
    inputs = corpus_inputs(o.input, o.format, o.split)
    outputs = corpus_outputs(o.output, o.num_output_shards)
    inputs_bytes = sum(m.size_in_bytes for r in FileSystems.match([p for p, _ in inputs])
                       for m in r.metadata_list)
    token = uuid.uuid4().hex[:12]
    tmp_paths = [f"{p}.tmp-beam-{token}" for p in outputs]
    summary_path = f"{outputs[0]}.summary-beam-{token}"
    try:
        with beam.Pipeline(options=pipeline_options(runner, beam_options)) as p:
            build_corpus(p, inputs, tmp_paths, o, inputs_bytes, summary_path)
        with _open(summary_path) as f:
            summary = pickle.loads(f.read())
        summary.outputs = outputs
        if not summary.kept:
            raise types.PrepareError(output.nothing_usable(o, summary))
        for t, final in zip(tmp_paths, outputs):
            if not FileSystems.exists(t):  # fewer kept documents than files: empty ones
                FileSystems.create(t, compression_type=CompressionTypes.UNCOMPRESSED).close()
            if FileSystems.exists(final):
                FileSystems.delete([final])
            FileSystems.rename([t], [final])
    finally:  # after a failure the temporary files; after success the summary's file
        stale = [t for t in tmp_paths + [summary_path] if FileSystems.exists(t)]
        if stale:
            FileSystems.delete(stale)
    summary.seconds = time.time() - t0
    return summary
