"""Workdirs on Cloud Storage (`--workdir=gs://bucket/run`, the usual choice on a TPU VM or
pod): paths stay URIs end to end and every file goes through etils.epath. Checked against
a fake gs:// (etils' own epath mock, mapped onto a local folder): nothing is written to a
local ./gs:/... folder, which is what os.path.abspath on a URI would give."""

from __future__ import annotations

import contextlib
import json
import os
from unittest import mock

import pytest
from etils.epath import gpath
from etils.epath import testing as epath_testing

from bert_jax import paths


@contextlib.contextmanager
def fake_gcs(root):
    """gs://X -> root/X for every epath operation (TensorFlow's gfile backend bypassed)."""

    def local(path):
        path = os.fspath(path)
        return os.path.join(root, path[len("gs://"):]) if path.startswith("gs://") else path

    def redirect(original, path, *args, **kwargs):  # the target of rename / replace as well
        args = [local(a) if isinstance(a, (str, os.PathLike)) else a for a in args]
        return original(local(path), *args, **kwargs)

    def redirect_glob(original, pattern, *args, **kwargs):  # matches named as in the bucket
        found = original(local(pattern), *args, **kwargs)
        if not os.fspath(pattern).startswith("gs://"):
            return found
        return ["gs://" + os.path.relpath(os.fspath(p), root) for p in found]

    names = ("exists", "isdir", "listdir", "makedirs", "mkdir", "open", "remove",
             "rename", "replace", "rmtree", "stat", "walk")
    with epath_testing.mock_epath(glob=redirect_glob, **{n: redirect for n in names}), \
            mock.patch.object(gpath, "_is_tf_installed", lambda: False):
        yield


@pytest.fixture
def gcs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a stray local ./gs:/ folder would land here
    root = tmp_path / "bucket_root"
    root.mkdir()
    with fake_gcs(str(root)):
        yield root
    assert not (tmp_path / "gs:").exists(), "a URI was treated as a local path"


def test_resolve_keeps_uris_and_makes_local_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert paths.resolve("gs://bucket/run/") == "gs://bucket/run"
    assert paths.join("gs://bucket/run", "checkpoints") == "gs://bucket/run/checkpoints"
    assert paths.resolve("run") == str(tmp_path / "run")
    assert os.path.abspath("gs://bucket/run") == str(tmp_path / "gs:" / "bucket" / "run")


def test_metrics_append_to_a_bucket(gcs):
    from bert_jax.train.metrics import MetricWriter, read_jsonl

    for step in (1, 2):  # a restart appends to the same file
        writer = MetricWriter("gs://b/run", tensorboard=False)
        writer.write(step, {"train/loss": 10.0 - step})
        writer.close()
    rows = [json.loads(x) for x in (gcs / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "train/loss": 9.0}, {"step": 2, "train/loss": 8.0}]
    assert read_jsonl("gs://b/run/metrics.jsonl") == rows


def test_checkpoints_of_a_bucket_workdir_are_found_by_uri(gcs):
    # (Checkpointer's directory is paths.join(workdir, "checkpoints"), tested above; orbax's
    # manager itself queries the bucket through google-cloud-storage, which no fake covers.)
    from bert_jax.convert.sources import locate, pick_step

    for step in (100, 200):
        (gcs / "b" / "run" / "checkpoints" / str(step) / "state").mkdir(parents=True)
    (gcs / "b" / "run" / "checkpoints" / "300").mkdir()  # no state/: not a checkpoint
    assert locate("gs://b/run") == ("gs://b/run", None)
    assert locate("gs://b/run/checkpoints/") == ("gs://b/run", None)
    assert locate("gs://b/run/checkpoints/100") == ("gs://b/run", 100)
    assert locate("gs://b/elsewhere") is None
    directory = "gs://b/run/checkpoints"
    assert pick_step(directory, [100, 200, 300], None, "x") == 200
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at step 300 in "
                                                r"gs://b/run/checkpoints; saved steps: \[100, 200\]"):
        pick_step(directory, [100, 200, 300], 300, "x")


def test_model_directory_config_in_a_bucket(gcs):
    from bert_jax.convert import model_dir
    from bert_jax.models.config import BertConfig

    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=37)
    (gcs / "b" / "m" / "params").mkdir(parents=True)
    config.to_json_file(str(gcs / "b" / "m" / "bert_config.json"))
    assert model_dir.is_model_dir("gs://b/m")
    assert not model_dir.is_model_dir("gs://b/other")
    assert BertConfig.from_json_file("gs://b/m/bert_config.json") == config


def test_vocabularies_read_from_a_bucket(gcs):
    from bert_jax.tokenization import load_tokenizer
    from tests.conftest import REPO

    vocab = REPO / "data_prep" / "bert_uncased_vocab.txt"
    (gcs / "b" / "m").mkdir(parents=True)
    (gcs / "b" / "m" / "vocab.txt").write_bytes(vocab.read_bytes())
    here, there = (load_tokenizer(vocab_file=v) for v in (str(vocab), "gs://b/m/vocab.txt"))
    assert there.vocab_size == 30522
    assert there.encode("Is this a dagger?") == here.encode("Is this a dagger?")

    from data_prep import build_vocab

    corpus = gcs / "corpus.txt"
    corpus.write_text((REPO / "data_prep" / "sample_corpus" / "shakespeare.txt").read_text(
        encoding="utf-8")[:50_000], encoding="utf-8")
    local = build_vocab.train_sentencepiece([str(corpus)], 300, str(gcs / "b" / "sp.model"))
    sp = load_tokenizer(spm_model_file="gs://b/sp.model")
    assert sp.vocab_size == 300
    assert sp.encode("To be, or not to be") == load_tokenizer(
        spm_model_file=local).encode("To be, or not to be")


def test_a_profile_of_a_bucket_run_lands_in_the_bucket(gcs):
    import jax
    import jax.numpy as jnp

    from bert_jax.train.profile import Profiler

    profiler = Profiler("gs://b/run/profile", start=0, skip=0, count=1, is_main=True)
    profiler.before(0)
    with jax.profiler.StepTraceAnnotation("train", step_num=1):
        x = jax.jit(lambda a: a @ a)(jnp.ones((64, 64)))
    profiler.after(1, x)
    traces = list((gcs / "b" / "run" / "profile").glob("plugins/profile/*/*.xplane.pb"))
    assert len(traces) == 1 and traces[0].stat().st_size > 0
    assert not os.path.exists(profiler.local)  # the local staging copy is removed


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_write_atomic_keeps_the_old_file_when_writing_fails(gcs, tmp_path, where):
    path = str(tmp_path / "out" / "p.tsv") if where == "local" else "gs://b/out/p.tsv"
    on_disk = tmp_path / "out" / "p.tsv" if where == "local" else gcs / "b" / "out" / "p.tsv"
    with paths.write_atomic(path) as f:  # parents made
        f.write("index\tprediction\n0\t1\n")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with paths.write_atomic(path) as f:
            f.write("index\tprediction\n")
            raise RuntimeError("disk on fire")
    assert on_disk.read_text() == "index\tprediction\n0\t1\n"
    assert sorted(os.listdir(on_disk.parent)) == ["p.tsv"]  # no .tmp left behind
    with paths.open_text(path, newline="") as f:
        assert f.read() == "index\tprediction\n0\t1\n"
