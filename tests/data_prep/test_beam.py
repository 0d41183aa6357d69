"""create_pretraining_data and prepare_corpus on Apache Beam (data_prep/beam/): the same bytes
as the local path. Beam is the `[beam]` extra (the `[test]` extra has it too, so CI runs these);
they skip where it is absent. The ones at the end check the local path's side of --runner."""

from __future__ import annotations

import json
import os

import pytest

from data_prep import create_pretraining_data as cpd
from data_prep import prepare_corpus as pc
from data_prep.corpus.types import Options, PrepareError
from data_prep.paths import InputError
from tests.data_prep.helpers import SAMPLE, VOCAB, mixed_corpus

try:
    import apache_beam  # noqa: F401
    HAVE_BEAM = True
except ImportError:
    HAVE_BEAM = False

needs_beam = pytest.mark.skipif(
    not HAVE_BEAM, reason="apache_beam is not installed (pip install '.[beam]')")


def _create(inputs, output, runner, **kw):
    options = dict(input_file=",".join(map(str, inputs)), output_file=str(output),
                   vocab_file=VOCAB, max_seq_length=64, max_predictions_per_seq=10,
                   dupe_factor=2, random_seed=7, num_workers=1, progress=False)
    options.update(kw)
    return cpd.create(cpd.Options(runner=runner, **options))


def _same_files(tmp_path, inputs, beam_options="", **kw):
    local = _create(inputs, tmp_path / "local" / "o", "local", **kw)
    beam = _create(inputs, tmp_path / "beam" / "o", "DirectRunner", beam_options=beam_options,
                   **kw)
    assert [os.path.basename(p) for p in local.outputs] == \
        [os.path.basename(p) for p in beam.outputs]
    for a, b in zip(local.outputs, beam.outputs):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            data = fa.read()
            assert data == fb.read(), f"{b} differs from the local path's {a}"
    # Temporary names are gone: only the final files are left.
    assert sorted(os.listdir(tmp_path / "beam")) == sorted(os.listdir(tmp_path / "local"))
    local.stats.seconds = beam.stats.seconds = 0.0
    assert beam.stats == local.stats
    assert local.stats.instances > 0
    return local


@needs_beam
def test_direct_runner_writes_the_local_paths_bytes(tmp_path):
    """Chunks of 40 kB cross the boundary between the two files; records are dealt
    round-robin into 3 shards: both must come out as the local path makes them."""
    local = _same_files(tmp_path, SAMPLE, chunk_size_mb=0.04, num_output_shards=3)
    assert len(local.outputs) == 3 and local.stats.documents > 100


@needs_beam
def test_direct_runner_odd_inputs(tmp_path):
    """A blank file between two, a document longer than a chunk (cut as the local path
    cuts it), a file ending without a newline, invalid UTF-8 (counted as replaced)."""
    with open(SAMPLE[1], encoding="utf-8") as f:
        text = f.read()[:120_000]
    (tmp_path / "in").mkdir()
    long_doc = tmp_path / "in" / "a.txt"
    long_doc.write_text(text.replace("\n\n", "\n"), encoding="utf-8")
    (tmp_path / "in" / "b.txt").write_text("\n \n")
    (tmp_path / "in" / "c.txt").write_bytes(
        text[:30_000].encode() + b"\n\nbad \xff\xfe bytes here\nand a last line")
    inputs = sorted((tmp_path / "in").iterdir())
    local = _same_files(tmp_path, inputs, chunk_size_mb=0.05, num_output_shards=2, pack=True)
    assert local.stats.replaced_bytes == 2


@needs_beam
def test_chunk_plan_matches_iter_chunks(tmp_path):
    """plan_chunks, from per-file document sizes, puts every document in the chunk that
    pipeline.iter_chunks (one reader over all files) puts it in: chunks that cross files,
    an empty file, a file that ends exactly where a chunk does, documents cut at the
    chunk size."""
    import random

    from data_prep import pipeline
    from data_prep.beam import records

    rng = random.Random(0)
    files = []
    for i, n_docs in enumerate([7, 0, 1, 30, 3]):
        docs = ["\n".join("w" * rng.randint(1, 40) for _ in range(rng.randint(1, 6)))
                for _ in range(n_docs)]
        path = tmp_path / f"{i}.txt"
        path.write_text("\n\n".join(docs) + ("\n" if docs else ""))
        files.append(str(path))
    for chunk_chars in (1, 50, 97, 200, 10_000):
        expected = []
        for k, docs, _ in pipeline.iter_chunks(files, pipeline.Stats(), chunk_chars):
            expected += [k] * len(docs)
        sizes = [records.doc_sizes((i, f), chunk_chars) for i, f in enumerate(files)]
        plan = records.plan_chunks(sizes[::-1], chunk_chars)  # any arrival order
        got = []
        for i, s in sizes:
            first, starts = plan[i]
            got += [first + sum(j >= b for b in starts) for j in range(len(s))]
        assert got == expected, chunk_chars


@pytest.mark.slow
@needs_beam
@pytest.mark.parametrize("kw", [dict(no_nsp=True), dict(pack=True, do_whole_word_mask=True)])
def test_direct_runner_in_worker_processes(tmp_path, kw):
    """Beam's DirectRunner in 2 worker processes (as a cluster runs the stages apart)."""
    _same_files(tmp_path, SAMPLE, chunk_size_mb=0.1, num_output_shards=2,
                beam_options="--direct_num_workers=2 --direct_running_mode=multi_processing",
                **kw)


@needs_beam
def test_text_without_a_token_writes_nothing(tmp_path):
    bad = tmp_path / "controls.txt"
    bad.write_text("\x01\x02\n\x03\n", encoding="utf-8")
    out = tmp_path / "out" / "o.tfrecord"
    with pytest.raises(InputError, match="no training instances"):
        _create([bad], out, "DirectRunner")
    assert not out.parent.exists() or os.listdir(out.parent) == []


def test_beam_options_need_a_beam_runner(tmp_path):
    with pytest.raises(InputError, match="--beam_options needs a Beam --runner"):
        _create(SAMPLE[:1], tmp_path / "o", "local", beam_options="--project=p")
    assert not (tmp_path / "o").exists()


def test_a_beam_runner_without_beam_says_how_to_install_it(tmp_path, monkeypatch):
    # Beam absent, whether or not it is installed (or already imported by the tests
    # above): its modules import as missing, and the package forgets its submodules.
    import data_prep.beam

    modules = ("options", "files", "records", "corpus")
    for name in ("apache_beam",) + tuple(f"data_prep.beam.{m}" for m in modules):
        monkeypatch.setitem(__import__("sys").modules, name, None)
    for m in modules:
        monkeypatch.delattr(data_prep.beam, m, raising=False)
    with pytest.raises(InputError, match=r"needs Apache Beam.*pip install \.\[beam\]"):
        _create(SAMPLE[:1], tmp_path / "o", "DirectRunner")
    assert not (tmp_path / "o").exists()
    with pytest.raises(PrepareError, match=r"needs Apache Beam.*pip install \.\[beam\]"):
        _prepare(SAMPLE[0], tmp_path / "t.txt", "DirectRunner")
    with pytest.raises(PrepareError, match="--beam_options needs a Beam --runner"):
        _prepare(SAMPLE[0], tmp_path / "t.txt", "local", beam_options="--project=p")
    assert not (tmp_path / "t.txt").exists()


# ----------------------------------------------------------------------------- prepare_corpus

def _corpus_inputs(tmp_path):
    """A MediaWiki export (redirect, disambiguation, talk page, stub, an exact copy, a
    malformed page) and JSON lines with an exact copy, a near duplicate (two words
    changed), an exact copy of that near duplicate, a line that is not JSON."""
    from tests.data_prep.test_corpus_door import FOOTER, HEADER, PAGES

    d = tmp_path / "in"
    d.mkdir()
    (d / "a-pages.xml").write_text(HEADER + "".join(PAGES) + FOOTER, encoding="utf-8")
    with open(SAMPLE[0], encoding="utf-8") as f:
        paragraphs = [p.replace("\n", " ") for p in f.read().split("\n\n") if len(p) > 400]
    base = paragraphs[3]
    words = base.split()
    near = " ".join(words[:20] + ["quite", "different"] + words[22:])
    texts = [base, paragraphs[10], base, near, paragraphs[20], near]
    lines = [json.dumps({"text": t}) for t in texts]
    lines.insert(2, "{not json")
    (d / "b-docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def _prepare(inputs, output, runner, **kw):
    return pc.prepare(Options(input=str(inputs), output=str(output), runner=runner,
                              progress=False, num_workers=1, min_doc_chars=40, **kw))


@needs_beam
def test_both_stages_on_direct_runner_give_the_local_records(tmp_path):
    """prepare_corpus then create_pretraining_data, each on DirectRunner and locally: the
    same text, the same summary (drops by reason, near duplicates included), then the same
    TFRecords."""
    inputs = _corpus_inputs(tmp_path)
    local = _prepare(f"{inputs}/*", tmp_path / "local" / "text", "local",
                     num_output_shards=3)
    beam = _prepare(f"{inputs}/*", tmp_path / "beam" / "text", "DirectRunner",
                    num_output_shards=3)
    assert [os.path.basename(p) for p in beam.outputs] == \
        [os.path.basename(p) for p in local.outputs]
    for a, b in zip(local.outputs, beam.outputs):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read(), f"{b} differs from the local path's {a}"
    assert sorted(os.listdir(tmp_path / "beam")) == sorted(os.listdir(tmp_path / "local"))
    assert (beam.documents, beam.kept, dict(beam.dropped), beam.bad, beam.sentences,
            beam.bytes_in, beam.bytes_out) == \
        (local.documents, local.kept, dict(local.dropped), local.bad, local.sentences,
         local.bytes_in, local.bytes_out)
    # What the inputs hold: 8 pages + 7 lines; of the lines the copy of the first, the
    # near duplicate and its own copy (a near duplicate too: its twin was not kept) go.
    assert local.documents == 15 and local.kept == 5
    assert local.dropped["exact duplicate"] == 2 and local.dropped["near duplicate"] == 2
    assert local.dropped["bad input"] == 2
    # The second stage: the Beam text on DirectRunner, the local text locally.
    records = [_create(text.outputs, tmp_path / f"{runner}-records" / "o", runner,
                       num_output_shards=2).outputs
               for text, runner in ((local, "local"), (beam, "DirectRunner"))]
    for a, b in zip(*records):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            data = fa.read()
            assert len(data) > 10_000 and data == fb.read(), f"{b} differs from {a}"


@needs_beam
def test_prepare_corpus_without_dedup_and_nothing_usable(tmp_path):
    inputs = _corpus_inputs(tmp_path)
    local = _prepare(f"{inputs}/*.jsonl", tmp_path / "l.txt", "local", dedup=False)
    beam = _prepare(f"{inputs}/*.jsonl", tmp_path / "b.txt", "DirectRunner", dedup=False)
    assert (tmp_path / "l.txt").read_bytes() == (tmp_path / "b.txt").read_bytes()
    assert beam.kept == local.kept == 6
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\nnot json\n')
    with pytest.raises(PrepareError, match="nothing usable: 2 document"):
        _prepare(tmp_path / "bad.jsonl", tmp_path / "out" / "o.txt", "DirectRunner")
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []


@needs_beam
def test_an_unknown_runner_or_bad_options_stop_both_tools_before_any_work(tmp_path):
    with pytest.raises(InputError, match=r"--runner=Bogus: not a Beam runner"):
        _create(SAMPLE[:1], tmp_path / "o", "Bogus")
    with pytest.raises(InputError, match=r"--beam_options=.*No closing quotation"):
        _create(SAMPLE[:1], tmp_path / "o", "DirectRunner", beam_options="--project='p")
    with pytest.raises(PrepareError, match=r"--runner=Bogus: not a Beam runner"):
        _prepare(SAMPLE[0], tmp_path / "t.txt", "Bogus")
    assert not list(tmp_path.iterdir())


@needs_beam
def test_prepare_corpus_dedup_on_direct_runner_as_locally_on_a_mixed_corpus(tmp_path):
    """Clusters near the threshold, few-word edits and exact copies: the Beam pipeline's
    grouping of shared LSH keys drops the same documents as the local path."""
    docs = [d for d in mixed_corpus(2) if len(d) > 100]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    local = _prepare(tmp_path / "in.jsonl", tmp_path / "l.txt", "local")
    beam = _prepare(tmp_path / "in.jsonl", tmp_path / "b.txt", "DirectRunner")
    assert (tmp_path / "l.txt").read_bytes() == (tmp_path / "b.txt").read_bytes()
    assert dict(beam.dropped) == dict(local.dropped)
    assert local.dropped["exact duplicate"] > 50 and local.dropped["near duplicate"] > 100
