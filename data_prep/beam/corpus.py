"""prepare_corpus as an Apache Beam pipeline (`prepare`, `build_corpus`): the same text and
Summary as its local runner (data_prep/prepare_corpus.py). Imported only when --runner names
a Beam runner (data_prep.beam.load_beam).

Documents are read per file (one worker per file: a single dump is read by one worker)
and cleaned and fingerprinted in parallel (data_prep/corpus/clean.py's pure
`clean_document` and `fingerprint`, the expensive part). Each document's digest and LSH
band keys are grouped by key (a GroupByKey, spread over the workers); only the documents of
a key that two or more share, with their signatures, reach one step that applies
data_prep/dedup.py's greedy rule in input order (its answers depend on the order, as
locally). A last step walks every document's small record (a reason and a few integers, no
text or signature) for the summary and each kept document's position, which deals it
round-robin into the output files. The greedy step holds the documents that share a key
(duplicates and false LSH candidates, about 0.6 KB each), not every document; the last step
holds a few integers per document.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import time
import uuid
from typing import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from data_prep import dedup as dedup_lib
from data_prep.beam.files import create_raw, delete_present, open_raw, swap_in, write_in_order
from data_prep.beam.options import pipeline_options
from data_prep.corpus import clean, output, read, types


def _local_copy(path: str, folder: str) -> str:
    """A local file with `path`'s bytes (the sources' readers need one: pyarrow maps it)."""
    if "://" not in path:
        return path
    local = os.path.join(folder, path.rstrip("/").rsplit("/", 1)[-1])
    with open_raw(path) as src, open(local, "wb") as dst:
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
    with create_raw(summary_path) as f:
        f.write(pickle.dumps(summary))
    yield from kept.items()


def _place(item, num_files: int):
    """(key, {texts, kept}) -> (output file, (kept index, its bytes)) for a kept document."""
    _, grouped = item
    if grouped["kept"] and grouped["texts"]:
        k = grouped["kept"][0]
        yield k % num_files, (k, grouped["texts"][0].encode("utf-8"))


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
            | "WriteTexts" >> beam.FlatMap(write_in_order, list(tmp_paths)))


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
        with open_raw(summary_path) as f:
            summary = pickle.loads(f.read())
        summary.outputs = outputs
        if not summary.kept:
            raise types.PrepareError(output.nothing_usable(o, summary))
        swap_in(tmp_paths, outputs)  # fewer kept documents than files: empty ones
    finally:  # after a failure the temporary files; after success the summary's file
        delete_present(tmp_paths + [summary_path])
    summary.seconds = time.time() - t0
    return summary
