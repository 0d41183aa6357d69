"""Fine-tuning with its workdir and its data in a bucket (`--workdir=gs://bucket/ft`,
`task.data_dir=gs://bucket/glue/MRPC`: what a TPU pod needs, since every host must see the
same checkpoints and a TPU VM's disk goes with the VM). Run against the fake gs:// of
tests/test_paths.py: every file the run writes must land in the bucket, nothing in a local
./gs:/ folder, and the numbers must be the local reference run's."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from unittest import mock

import orbax.checkpoint as ocp
import pytest

from tests.tasks.conftest import DATA
from tests.tasks.finetune_common import tiny_pairs_config
from tests.test_paths import fake_gcs

TIMING = ("seconds", "perf/")  # wall-clock figures: the only keys allowed to differ


@contextlib.contextmanager
def orbax_on(root):
    """orbax writes arrays through tensorstore's own Cloud Storage driver, which no epath fake
    reaches: hand orbax's two entry points the fake bucket's local folder instead. Everything
    else (metrics, predictions, model directory files, renames) goes through epath's fake."""

    def local(path):
        path = os.fspath(path)
        return os.path.join(root, path[len("gs://"):]) if path.startswith("gs://") else path

    manager_init = ocp.CheckpointManager.__init__
    save, restore = ocp.StandardCheckpointer.save, ocp.StandardCheckpointer.restore
    with mock.patch.object(ocp.CheckpointManager, "__init__",
                           lambda self, directory, *a, **k: manager_init(
                               self, local(directory), *a, **k)), \
            mock.patch.object(ocp.StandardCheckpointer, "save",
                              lambda self, path, *a, **k: save(self, local(path), *a, **k)), \
            mock.patch.object(ocp.StandardCheckpointer, "restore",
                              lambda self, path, *a, **k: restore(self, local(path), *a, **k)):
        yield


def _records(path):
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in rows]


def test_finetuning_with_workdir_and_data_in_a_bucket(tmp_path, monkeypatch, reference_run):
    from bert_jax.convert import model_dir
    from bert_jax.tasks import finetune

    reference, reference_summary = reference_run
    monkeypatch.chdir(tmp_path)  # a stray local ./gs:/ folder would land here
    root = tmp_path / "bucket_root"
    shutil.copytree(DATA / "pairs", root / "b" / "data" / "pairs")
    config = tiny_pairs_config(restarts=2)  # the reference run's config, without the cache
    config.task.data_dir = "gs://b/data/pairs"
    with fake_gcs(str(root)), orbax_on(str(root)):
        summary = finetune.run(config, "gs://b/ft/", progress=False)
        bucket = root / "b" / "ft"
        # The same two runs as the local reference, number for number.
        assert _records(bucket / "metrics.jsonl") == _records(reference / "metrics.jsonl")
        assert {k: v for k, v in summary.items() if not any(t in k for t in TIMING)} == {
            k: v for k, v in reference_summary.items() if not any(t in k for t in TIMING)}
        for run in ("run_0", "run_1"):
            assert (bucket / run / "dev_predictions-dev.tsv").read_bytes() == (
                reference / run / "dev_predictions-dev.tsv").read_bytes()
            assert _records(bucket / run / "metrics.jsonl") == _records(
                reference / run / "metrics.jsonl")
            assert sorted(os.listdir(bucket / run / "checkpoints")) == ["2", "4"]
        assert not list(bucket.glob("**/*.tmp")) and not (bucket / "best_model.new").exists()
        # best_model/ in the bucket is a model directory with the reference's parameters.
        assert model_dir.is_model_dir("gs://b/ft/best_model")
        params, _ = model_dir.load_model_dir("gs://b/ft/best_model")
        expected, _ = model_dir.load_model_dir(str(reference / "best_model"))
        assert (bucket / "best_model" / "vocab.txt").read_bytes() == (
            reference / "best_model" / "vocab.txt").read_bytes()
        import jax
        import numpy as np

        jax.tree_util.tree_map(np.testing.assert_array_equal, params, expected)
        # The same command again: both runs are read back from the bucket, nothing is redone
        # and nothing is appended.
        before = (bucket / "metrics.jsonl").read_bytes()
        again = finetune.run(config, "gs://b/ft", progress=False)
        assert again == summary
        assert (bucket / "metrics.jsonl").read_bytes() == before
    assert not (tmp_path / "gs:").exists(), "a URI was treated as a local path"


def test_a_missing_bucket_data_file_is_named(tmp_path, monkeypatch):
    from bert_jax.tasks import finetune

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "bucket_root"
    (root / "b" / "data").mkdir(parents=True)
    config = tiny_pairs_config()
    config.task.data_dir = "gs://b/data"
    with fake_gcs(str(root)), pytest.raises(FileNotFoundError,
                                            match=r"GLUE file not found: gs://b/data/train.tsv"):
        finetune.run(config, "gs://b/ft", progress=False)


def test_hugging_face_directory_in_a_bucket_is_refused_with_the_remedy(tmp_path, monkeypatch):
    from bert_jax.convert.sources import open_source

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "bucket_root"
    (root / "b" / "hf").mkdir(parents=True)
    (root / "b" / "hf" / "config.json").write_text("{}")
    with fake_gcs(str(root)), pytest.raises(ValueError, match=r"gs://b/hf: a Hugging Face "
                                                              r"directory is read from local"):
        open_source("gs://b/hf")
