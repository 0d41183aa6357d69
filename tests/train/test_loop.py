"""The loop's pieces in process: metrics and a skipped non-finite step, the stop message,
exact evaluation with the majority baseline, warm starts, and data errors before compile."""

from __future__ import annotations

import json
import os

import flax
import jax
import numpy as np
import pytest

from bert_jax.convert.model_dir import save_model_dir
from bert_jax.convert.sources import open_source
from bert_jax.models.config import ConfigError, from_config_dict
from bert_jax.data import device as data_device
from bert_jax.data.features import DataCheckError
from bert_jax.tasks.pretraining.loss import pretraining_loss
from bert_jax.tasks import pretraining
from bert_jax.train import loop
from bert_jax.train import state as state_lib
from bert_jax.train import step as step_lib
from bert_jax.train import warm_start
from tests.train.common import (MemorySource, memory_data, memory_eval_data, random_batch,
                                tiny_config, tiny_state, traced_steps)


class NaNAtStep3(MemorySource):
    def __next__(self):
        batch = super().__next__()
        if self.index == 3:
            batch["masked_lm_weights"] = batch["masked_lm_weights"].copy()
            batch["masked_lm_weights"][0, 0] = np.nan
        return batch


def test_skip_nonfinite_logs_and_continues(tmp_path):
    config = tiny_config(steps=5)
    config.train.skip_nonfinite = True
    config.train.tensorboard = False
    summary = pretraining.run(config, str(tmp_path), make_train_data=lambda c, w: NaNAtStep3(8),
                         make_eval_data=lambda c, w: None)
    assert summary["step"] == 5 and summary["nonfinite_skipped"] == 1
    # The run's summary records the attention path of its steps (XLA on CPU under auto).
    assert summary["kernels"] == ("attention xla (train), xla (eval) [model.attention=auto]; "
                                  "remat none"), summary["kernels"]
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["train/nonfinite"] for r in records] == [0, 0, 1, 0, 0]
    expected = {"train/loss", "train/mlm_loss", "train/mlm_acc", "train/nsp_loss",
                "train/nsp_acc", "train/lr", "train/grad_norm", "train/param_norm"}
    assert expected <= set(records[0])
    assert {"perf/step_time", "perf/seq_per_s", "perf/tokens_per_s", "perf/mfu"} <= set(records[1])
    # Real (non-padding) tokens: the padding of each step's batch, and their rate.
    pads = [1 - random_batch(1000 + i, 8)["input_mask"].mean() for i in range(5)]
    assert [r["data/padding_fraction"] for r in records] == pytest.approx(pads)
    assert all(r["data/sequences_per_row"] == 1.0 for r in records)
    assert not any(k.startswith("input/") for r in records for k in r)
    r = records[1]
    assert r["perf/real_tokens_per_s"] == pytest.approx(
        r["perf/tokens_per_s"] * (1 - r["data/padding_fraction"]))
    assert 0 < r["perf/real_mfu"] < r["perf/mfu"]
    assert all(np.isfinite(r["train/param_norm"]) for r in records)
    assert (tmp_path / "checkpoints" / "5").is_dir()


def test_nonfinite_stop_saves_nothing_from_that_step(tmp_path):
    # The default stops the run: the step runs without the old-versus-new select, so the
    # loop must read step 3's flag before the step-3 checkpoint (every step here) is written.
    import orbax.checkpoint as ocp

    config = tiny_config(steps=5, checkpoint=dict(every=1, keep=10))
    config.train.tensorboard = False
    config.train.log_every = 10   # no log step before 10: the save itself reads the flag
    with pytest.raises(loop.NonFiniteError, match="at step 3 .*stopped before saving"):
        pretraining.run(config, str(tmp_path), make_train_data=lambda c, w: NaNAtStep3(8),
                   make_eval_data=lambda c, w: None)
    ckpt = tmp_path / "checkpoints"
    assert sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) == [1, 2]
    restored = ocp.PyTreeCheckpointer().restore(str(ckpt / "2" / "state"))
    leaves = jax.tree_util.tree_leaves(restored)
    assert leaves and all(np.all(np.isfinite(np.asarray(x))) for x in leaves
                          if np.issubdtype(np.asarray(x).dtype, np.floating))


def test_nonfinite_stops_naming_the_step():
    config = tiny_config()
    metrics = {"train/nonfinite": np.float32(1), "train/loss": np.float32(np.nan),
               "train/grad_norm": np.float32(np.inf)}
    with pytest.raises(loop.NonFiniteError, match="at step 17 .*skip_nonfinite"):
        loop.count_nonfinite(metrics, 17, config)
    config.train.skip_nonfinite = True
    assert loop.count_nonfinite(metrics, 17, config) == 1


def test_running_a_finished_run_again_reports_its_eval_without_a_second_row(tmp_path):
    """The same command after a run finished: nothing to train, its final evaluation read
    back from metrics.jsonl, not appended again. A run stopped after its last checkpoint
    but before that evaluation still gets it."""
    config = tiny_config(steps=3, train=dict(eval_every=0, tensorboard=False))
    run = lambda: pretraining.run(config, str(tmp_path), make_train_data=memory_data,  # noqa: E731
                             make_eval_data=memory_eval_data)
    first = run()
    path = tmp_path / "metrics.jsonl"
    lines = path.read_text().splitlines()
    assert [("eval/mlm_acc" in x) for x in lines] == [False] * (len(lines) - 1) + [True]
    again = run()
    assert path.read_text().splitlines() == lines
    assert again["step"] == 3 and again["eval/mlm_acc"] == first["eval/mlm_acc"]
    assert again["eval/mlm_acc_majority"] == first["eval/mlm_acc_majority"]
    path.write_text("\n".join(lines[:-1]) + "\n")  # killed before the final evaluation
    run()
    assert path.read_text().splitlines() == lines


@pytest.fixture(scope="module")
def tiny():
    return tiny_state()


def test_evaluate_is_exact_over_batches_and_ignores_filler(tiny):
    bsh = data_device.batch_sharding(tiny["mesh"], tiny["rules"])
    eval_fn = step_lib.jit_eval_step(tiny["task"], tiny["shardings"].params, bsh, tiny["rules"])
    batches = [random_batch(20 + i, 8) for i in range(3)]
    for b in batches:
        b["example_weights"] = np.ones(8, np.float32)
    batches[-1]["example_weights"][5:] = 0.0       # the padded tail of the eval set
    out = pretraining.evaluate(
        lambda b: jax.device_get(eval_fn(tiny["state"].params, data_device.to_global(b, bsh))),
        iter(batches))

    real = {k: np.concatenate([b[k] if i < 2 else b[k][:5] for i, b in enumerate(batches)])
            for k in batches[0] if k != "example_weights"}
    params = jax.device_get(tiny["state"].params)
    mlm_logits, nsp_logits = jax.jit(tiny["model"].apply)(
        {"params": params}, real["input_ids"], real["input_mask"], real["segment_ids"],
        real["masked_lm_positions"])
    loss, m = pretraining_loss(mlm_logits, nsp_logits, real)
    np.testing.assert_allclose(out["eval/loss"], float(loss), rtol=1e-5)
    np.testing.assert_allclose(out["eval/mlm_acc"], float(m["mlm_acc"]), rtol=1e-6)
    np.testing.assert_allclose(out["eval/nsp_acc"], float(m["nsp_acc"]), rtol=1e-6)
    labels = real["masked_lm_ids"][real["masked_lm_weights"] > 0]
    assert out["eval/masked_tokens"] == labels.size
    assert out["eval/mlm_acc_majority"] == pytest.approx(
        np.bincount(labels).max() / labels.size, abs=1e-12)


def test_warm_start_from_a_model_dir(tiny, tmp_path):
    model_cfg = from_config_dict(tiny["config"].model)
    other = tiny["model"].init(jax.random.key(42), **state_lib.dummy_inputs(16, 4))["params"]
    other = jax.tree_util.tree_map(np.asarray, flax.linen.meta.unbox(other))
    saved = {"bert": other["bert"], "mlm": other["mlm"]}   # no NSP head: stays fresh
    save_model_dir(str(tmp_path / "model"), saved, model_cfg)
    config = tiny_config()
    config.train.init_checkpoint = str(tmp_path / "model")
    fresh = jax.tree_util.tree_map(np.asarray, jax.device_get(tiny["state"]))
    source = pretraining.PretrainingTask(config, str(tmp_path / "run")).init_source
    warm_start.check_shapes(source, tiny["abstract"].params, None)
    state, _ = warm_start.warm_start(source, tiny["state"], None, tiny["abstract"],
                                     tiny["shardings"], tiny["tx"], None)
    got = jax.tree_util.tree_map(np.asarray, jax.device_get(state))
    for a, b in zip(jax.tree_util.tree_leaves(got.params["bert"]),
                    jax.tree_util.tree_leaves(other["bert"])):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree_util.tree_leaves(got.params["nsp"]),
                    jax.tree_util.tree_leaves(fresh.params["nsp"])):
        np.testing.assert_array_equal(a, b)
    mu = got.opt_state[1][0].mu
    assert all(not np.any(x) for x in jax.tree_util.tree_leaves(mu))

    config.model.hidden_size = 64
    config.model.intermediate_size = 128
    with pytest.raises(warm_start.ArchitectureError, match="hidden_size"):
        pretraining.PretrainingTask(config, str(tmp_path / "run"))


def _write_records(path, length, predictions, max_id):
    import tensorflow as tf

    rs = np.random.RandomState(0)

    def ints(v):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=list(map(int, v))))

    with tf.io.TFRecordWriter(str(path)) as w:
        for _ in range(4):
            feats = {
                "input_ids": ints(rs.randint(5, max_id + 1, size=length)),
                "input_mask": ints(np.ones(length)), "segment_ids": ints(np.zeros(length)),
                "masked_lm_positions": ints(np.arange(1, predictions + 1)),
                "masked_lm_ids": ints(np.full(predictions, max_id)),
                "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(
                    value=[1.0] * predictions)),
                "next_sentence_labels": ints([0])}
            w.write(tf.train.Example(features=tf.train.Features(feature=feats))
                    .SerializeToString())


@pytest.mark.parametrize("case", ["length", "vocab"])
def test_bad_records_fail_before_compile(case, tmp_path, monkeypatch):
    path = tmp_path / f"bad-{case}.tfrecord"
    if case == "length":
        _write_records(path, length=32, predictions=4, max_id=100)    # config: length 16
    else:
        _write_records(path, length=16, predictions=4, max_id=500)    # config: vocab 128
    config = tiny_config(steps=2)
    config.data.source = "tfrecord"
    config.data.train_files = str(path)
    config.train.tensorboard = False

    def compiled(*a, **k):
        raise AssertionError("the step was compiled before the data were checked")
    monkeypatch.setattr(state_lib, "init_state", compiled)
    monkeypatch.setattr(step_lib, "jit_train_step", compiled)
    with pytest.raises(DataCheckError) as err:
        pretraining.run(config, str(tmp_path / "run"))
    msg = str(err.value)
    assert str(path) in msg
    if case == "length":
        assert "16" in msg and "32" in msg
    else:
        assert "128" in msg and "500" in msg


def test_warm_start_from_a_run_params_or_full_state(tiny, tmp_path):
    import jax.numpy as jnp

    from bert_jax.train import checkpoint as ckpt_lib

    src = tiny["state"]
    # A "phase 1" run at step 7 with non-zero optimizer moments.
    moved = src.replace(step=jnp.asarray(7, jnp.int32),
                        opt_state=jax.tree_util.tree_map(lambda x: x + 1, src.opt_state))
    saver = ckpt_lib.Checkpointer(str(tmp_path / "phase1"), every=1)
    rng = jax.random.key(3)
    # A run saves its config beside the state; the warm start reads its model section.
    saver.save(moved, rng, MemorySource(8), loop.config_to_dict(tiny["config"]), force=True)
    saver.wait()
    saver.close()
    expected = jax.tree_util.tree_map(np.asarray, jax.device_get(moved))

    source = open_source(str(tmp_path / "phase1"))
    fresh = tiny["state"]
    state, new_rng = warm_start.warm_start(source, fresh, jax.random.key(0), tiny["abstract"],
                                           tiny["shardings"], tiny["tx"], None, full=True)
    got = jax.tree_util.tree_map(np.asarray, jax.device_get(state))
    assert int(got.step) == 7
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(jax.random.key_data(new_rng), jax.random.key_data(rng))

    state, _ = warm_start.warm_start(source, fresh, None, tiny["abstract"], tiny["shardings"],
                                     tiny["tx"], None)
    got = jax.tree_util.tree_map(np.asarray, jax.device_get(state))
    assert int(got.step) == 0
    for a, b in zip(jax.tree_util.tree_leaves(got.params),
                    jax.tree_util.tree_leaves(expected.params)):
        np.testing.assert_array_equal(a, b)
    assert all(not np.any(x) for x in jax.tree_util.tree_leaves(got.opt_state[1][0].mu))


def test_warm_start_from_a_chosen_step(tiny, tmp_path):
    """init_checkpoint=WORKDIR/checkpoints/<step> takes that step, not the latest; a step
    that was not saved is an error listing the saved ones."""
    import jax.numpy as jnp

    from bert_jax.train import checkpoint as ckpt_lib

    src = tiny["state"]
    saver = ckpt_lib.Checkpointer(str(tmp_path / "phase1"), every=1)
    saved = {}
    for step, shift in ((7, 1.0), (9, 2.0)):
        moved = src.replace(step=jnp.asarray(step, jnp.int32),
                            params=jax.tree_util.tree_map(lambda x, s=shift: x + s, src.params))
        saver.save(moved, jax.random.key(step), MemorySource(8),
                   loop.config_to_dict(tiny["config"]), force=True)
        saved[step] = jax.tree_util.tree_map(np.asarray, jax.device_get(moved.params))
    saver.wait()
    saver.close()

    for path, want in (("phase1", 9), ("phase1/checkpoints", 9), ("phase1/checkpoints/7", 7)):
        source = open_source(str(tmp_path / path))
        for mode in ("full", "params"):
            state, _ = warm_start.warm_start(source, tiny["state"], jax.random.key(0),
                                             tiny["abstract"], tiny["shardings"], tiny["tx"],
                                             None, full=mode == "full")
            got = jax.tree_util.tree_map(np.asarray, jax.device_get(state))
            assert int(got.step) == (want if mode == "full" else 0), (path, mode)
            for a, b in zip(jax.tree_util.tree_leaves(got.params),
                            jax.tree_util.tree_leaves(saved[want])):
                np.testing.assert_array_equal(a, b, err_msg=f"{path} {mode}")
    missing = str(tmp_path / "phase1" / "checkpoints" / "8")
    os.makedirs(missing)  # a directory, but not a saved step
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at step 8 in .*phase1/"
                                                r"checkpoints; saved steps: \[7, 9\]"):
        open_source(missing)


def test_profile_traces_the_configured_steps(tmp_path, capsys):
    """train.profile_steps=2, profile_start=1: one jax.profiler trace under WORKDIR/profile
    whose step markers are exactly steps 2 and 3 (the run goes on to step 4 untraced)."""
    config = tiny_config(steps=4)
    config.train.tensorboard = False
    config.train.profile_start, config.train.profile_steps = 1, 2
    pretraining.run(config, str(tmp_path), make_train_data=lambda c, w: MemorySource(8),
                    make_eval_data=lambda c, w: None)
    assert traced_steps(tmp_path / "profile") == [2, 3]
    assert "profile of steps 2..3 in" in capsys.readouterr().out


def test_attention_that_cannot_run_here_fails_before_any_data_or_compile(tmp_path):
    from bert_jax.models.kernels.attention import AttentionConfigError

    config = tiny_config(steps=2)
    config.model.attention = "cudnn"

    def no_data(c, w):
        raise AssertionError("the data was read before the attention check")

    with pytest.raises(AttentionConfigError, match="model.attention=cudnn needs a GPU"):
        pretraining.run(config, str(tmp_path), make_train_data=no_data, make_eval_data=no_data)


def test_resuming_with_another_seed_is_one_error_before_any_step(tmp_path):
    """A workdir continues its own run: its checkpoints resumed under another train.seed
    (a sweep's run_<i> with the wrong seed, a mistyped override) would mix two runs."""
    config = tiny_config(steps=2, train=dict(tensorboard=False))
    pretraining.run(config, str(tmp_path), make_train_data=memory_data,
                    make_eval_data=lambda c, w: None)
    lines = (tmp_path / "metrics.jsonl").read_text()
    config = tiny_config(steps=4, train=dict(tensorboard=False, seed=1))
    with pytest.raises(ConfigError, match=r"checkpoints: saved by a run with train.seed=0, "
                                          r"not 1; use a new workdir$"):
        pretraining.run(config, str(tmp_path), make_train_data=memory_data,
                        make_eval_data=lambda c, w: None)
    assert (tmp_path / "metrics.jsonl").read_text() == lines   # nothing trained or logged
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2"]


@pytest.mark.parametrize("overrides, message", [
    (dict(steps=0), r"config.train.steps=0 and train.epochs=0.0: set train.steps > 0 "
                    r"\(pre-training reads an endless stream: epochs do not apply\)"),
    (dict(do_train=False), r"config.train.do_train / random_init apply to fine-tuning"),
    (dict(init_state="everything"), r"config.train.init_state='everything'; expected "
                                     r"'params' or 'full'")])
def test_train_keys_a_pretraining_run_cannot_use_are_errors_before_any_data(
        overrides, message, tmp_path):
    config = tiny_config(train=overrides)

    def no_data(c, w):
        raise AssertionError("the data was read before the config was checked")
    with pytest.raises(ConfigError, match=message):
        pretraining.run(config, str(tmp_path), make_train_data=no_data,
                        make_eval_data=no_data)
