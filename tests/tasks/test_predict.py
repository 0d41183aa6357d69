"""`train.do_train=False`: predicting with a fine-tuned model (its task head included)
reproduces the fine-tuning run's own dev predictions exactly, reads no training data, and
refuses checkpoints without this task's head before compiling anything."""

import json
import shutil

import pytest

from bert_jax.models.config import BertConfig
from bert_jax.convert.sources import InitSource
from bert_jax.tasks import finetune, predict
from bert_jax.train.checked import require_task_checkpoint
from tests.tasks.conftest import DATA
from tests.tasks.finetune_common import tiny_pairs_config


def _predict_config(init_checkpoint, data_dir, **task):
    c = tiny_pairs_config()
    c.train.do_train = False
    c.train.init_checkpoint = str(init_checkpoint)
    c.task.data_dir = str(data_dir)
    c.task.update(task)
    return c


def test_best_model_predicts_what_its_run_predicted(reference_run, tmp_path):
    """best_model/ of the 2-restart tiny pair fine-tune, on a copy of the data without
    train.tsv: the dev predictions file is byte for byte the best run's, the accuracy the
    one recorded for that run, and test.tsv gets a submission file."""
    work, summary = reference_run
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(DATA / "pairs" / "dev.tsv", data / "dev.tsv")
    rows = (DATA / "pairs" / "dev.tsv").read_text().splitlines()
    (data / "test.tsv").write_text("\n".join(
        ["index\tsentence1\tsentence2"]
        + ["\t".join(r.split("\t")[:3]) for r in rows[1:11]]) + "\n")
    out = tmp_path / "predict"
    result = predict.run(_predict_config(work / "best_model", data, eval_test=True),
                          str(out))
    best = summary["best_run"]
    assert (out / "dev_predictions-dev.tsv").read_bytes() == \
        (work / f"run_{best}" / "dev_predictions-dev.tsv").read_bytes()
    recorded = [json.loads(l) for l in open(work / "metrics.jsonl")][best]
    assert result["predict"] and result["dev/accuracy"] == pytest.approx(recorded["dev/accuracy"])
    logged = [json.loads(l) for l in open(out / "metrics.jsonl")]
    assert logged == [{"step": 0, **{k: v for k, v in result.items() if k.startswith("dev/")}}]
    submission = (out / "predictions.tsv").read_text().splitlines()
    assert submission[0] == "index\tprediction" and len(submission) == 11
    assert not (out / "run_0").exists() and not (out / "best_model").exists()


def test_checkpoints_without_this_head_are_refused(reference_run, tmp_path, minilm_dir):
    work, _ = reference_run
    # A 3-label task cannot use the 2-label head: named shapes, before any compile.
    with pytest.raises(ValueError, match=r"classifier/dense/bias has shape \(2,\) in the "
                                         r"checkpoint, the model expects \(3,\) "
                                         r"\(another number of labels\?\)"):
        predict.run(_predict_config(work / "best_model", DATA / "pairs",
                                     labels=("0", "1", "2")), str(tmp_path / "a"))
    # A pre-trained encoder without any task head (the MiniLM HF directory); refused before
    # any eval data is read (the data directory does not even exist).
    c = _predict_config(minilm_dir, tmp_path / "no_data")
    c.model.update(_base_model())  # the architecture comes from the checkpoint
    with pytest.raises(ValueError, match=r"has no 'classifier' head .*pass a model "
                                         r"fine-tuned on this task"):
        predict.run(c, str(tmp_path / "b"))
    assert not (tmp_path / "b" / "metrics.jsonl").exists()
    # No checkpoint at all, and a pre-training run (its encoder has no task head).
    c = _predict_config("", DATA / "pairs")
    c.model.update(_base_model())
    with pytest.raises(ValueError, match=r"train.do_train=False predicts with a fine-tuned "
                                         r"model: set train.init_checkpoint"):
        predict.run(c, str(tmp_path / "c"))
    run = InitSource("/runs/pretrain", "workdir", BertConfig())
    with pytest.raises(ValueError, match=r"/runs/pretrain is a pre-training run: it has no "
                                         r"task.kind=glue head"):
        require_task_checkpoint(run, "task.kind=glue")


def _base_model():
    from bert_jax.tasks.registry import base_config

    return dict(base_config().model)


def test_the_sweep_leaves_predicting_to_its_own_driver(tmp_path):
    """finetune.run trains; a config with train.do_train=False is refused there in one line
    naming predict.run (which launch/train.py picks), before anything is written."""
    from bert_jax.models.config import ConfigError

    with pytest.raises(ConfigError, match=r"^train.do_train=False predicts with a fine-tuned "
                                          r"model: bert_jax.tasks.predict.run "):
        finetune.run(_predict_config(tmp_path / "best_model", DATA / "pairs"),
                     str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()


def test_predicting_builds_no_optimizer_and_no_train_step(reference_run, tmp_path,
                                                          monkeypatch):
    """The eval step alone (loop.build_eval): neither the optimizer nor the training
    programs are built, and the predictions are the best run's all the same."""
    from bert_jax import optim
    from bert_jax.train import loop, step

    def refused(*args, **kwargs):
        raise AssertionError("built for prediction")

    for module, name in ((loop, "build"), (optim, "make_optimizer"),
                         (step, "jit_train_step")):
        monkeypatch.setattr(module, name, refused)
    work, summary = reference_run
    out = tmp_path / "predict"
    result = predict.run(_predict_config(work / "best_model", DATA / "pairs"), str(out))
    recorded = [json.loads(l) for l in open(work / "metrics.jsonl")][summary["best_run"]]
    assert result["dev/accuracy"] == pytest.approx(recorded["dev/accuracy"])


def test_the_eval_build_is_the_training_build_less_its_optimizer():
    """loop.build_eval's params (shapes, dtypes, shardings) are those of loop.build's
    state, and its eval step computes what the training build's does, bit for bit."""
    import jax
    import numpy as np

    from bert_jax.data import device
    from bert_jax.tasks.inputs import eval_batches
    from bert_jax.train import loop
    from bert_jax.train import state as state_lib
    from tests.tasks.finetune_common import prepared, tiny_pairs_config

    task, checked, programs = prepared(tiny_pairs_config())
    ev = loop.build_eval(task, checked)
    assert not hasattr(ev, "tx") and not hasattr(ev, "train_fn")
    assert ev.abstract_params == programs.abstract.params
    assert ev.param_shardings == programs.shardings.params
    params = state_lib.init_state(task.model, programs.tx, checked.mesh, checked.rules,
                                  jax.random.key(3), task.init_inputs(),
                                  programs.shardings).params
    batch = next(eval_batches(task.eval_data[0].features, task.eval_batch_size))
    placed = device.to_global(batch, checked.batch_sharding)
    got = jax.device_get(ev.eval_fn(params, placed))
    want = jax.device_get(programs.eval_fn(params, placed))
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(a, b)

