"""create_pretraining_data as an Apache Beam pipeline (`run`, `build`): the same records as
its local runner (data_prep/pipeline.py), byte for byte. Imported only when --runner names a
Beam runner (data_prep.beam.load_beam).

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
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import shutil
import tempfile
import time
import uuid
from typing import Sequence

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter

from data_prep import paths as dp_paths
from data_prep import pipeline
from data_prep.beam.files import delete_present, open_raw, swap_in, write_in_order
from data_prep.beam.options import pipeline_options

_NAMESPACE = "data_prep"


def doc_sizes(item, chunk_chars: int):
    """(file index, path) -> (file index, <int64>[documents] sizes)."""
    i, path = item
    sizes = [pipeline.doc_chars(d)
             for d in pipeline.iter_documents([path], pipeline.Stats(), chunk_chars,
                                              open_raw)]
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
                                                        open_raw)):
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
                with open_raw(path) as f:
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
            | "DocumentSizes" >> beam.Map(doc_sizes, chunk_chars)
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
            | "WriteFiles" >> beam.FlatMap(write_in_order, list(tmp_paths)))


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
        swap_in(tmp_paths, output_paths)  # no document at all: empty files, as locally
        committed = True
    finally:
        if not committed:
            delete_present(tmp_paths)
    stats.seconds = time.time() - t0
    return stats
