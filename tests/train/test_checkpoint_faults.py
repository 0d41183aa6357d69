"""Faults around checkpoints end in one line with nothing lost: a full disk during an
asynchronous save, a damaged latest checkpoint, a warm start from a run of another size,
and checkpoint.every=0.

The loop runs here with a stand-in train step (`stand_in_step`: cheap to compile, yet a
function of params, optimizer state, step, RNG and batch, so a resume that restores any of
them wrongly ends with other params); the real step's resume is pinned bit for bit by
tests/train/test_resume.py. Checkpoints, orbax and the input iterator are the real ones."""

from __future__ import annotations

import errno
import json
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax.errors import FaultError, UserError
from bert_jax.convert import sources as runs_lib
from bert_jax.train import checkpoint as ckpt_lib
from bert_jax.tasks import pretraining
from bert_jax.train import loop
from bert_jax.models.config import from_config_dict
from bert_jax.tasks.pretraining import PretrainingTask
from bert_jax.train import state as state_lib
from bert_jax.train import step as step_lib
from bert_jax.train.checkpoint_faults import CheckpointSaveError
from tests.train.common import MemorySource, memory_data, tiny_config

pytestmark = pytest.mark.filterwarnings("ignore:Sharding info not provided")


def stand_in_step(task, tx, schedule, shardings, batch_sharding, rules, **_):
    """A jitted (state, batch, rng) -> (state, metrics) with the train step's signature:
    params move by an amount set by the batch, the step and the step's RNG; every
    optimizer-state leaf counts up. Loss: a digest of the new params."""
    rep = jax.sharding.NamedSharding(batch_sharding.mesh, jax.sharding.PartitionSpec())

    def step(state, batch, rng):
        noise = jax.random.uniform(jax.random.fold_in(rng, state.step))
        shift = 1e-3 * (jnp.mean(batch["input_ids"].astype(jnp.float32)) + noise)
        params = jax.tree_util.tree_map(lambda p: p * 0.99 + shift, state.params)
        opt_state = jax.tree_util.tree_map(lambda o: o + 1, state.opt_state)
        digest = sum(jnp.sum(p) for p in jax.tree_util.tree_leaves(params))
        zero = jnp.zeros((), jnp.float32)
        metrics = {"train/loss": digest.astype(jnp.float32), "train/grad_norm": zero,
                   "train/nonfinite": zero}
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return jax.jit(step, in_shardings=(shardings, batch_sharding, rep),
                   out_shardings=(shardings, rep), donate_argnums=(0,))


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(step_lib, "jit_train_step", stand_in_step)


def _train(config, workdir, data=memory_data):
    return pretraining.run(config, str(workdir), make_train_data=data,
                      make_eval_data=lambda c, w: None)


def _config(steps, every, keep=10):
    config = tiny_config(steps=steps, checkpoint=dict(every=every, keep=keep))
    config.train.tensorboard = False
    return config


def _logged(workdir) -> list[tuple[int, float]]:
    return [(r["step"], r["train/loss"]) for r in map(json.loads,
            (workdir / "metrics.jsonl").read_text().splitlines()) if "train/loss" in r]


def _saved_params(workdir, step):
    with ocp.PyTreeCheckpointer() as ckptr:
        tree = ckptr.restore(str(workdir / "checkpoints" / str(step) / "state"))
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree["params"])]


# --- 1. a full disk during an asynchronous save -----------------------------------------

class SlowAfter(MemorySource):
    """The memory stream, 0.5 s per batch from batch `after` on: the steps after the failed
    save leave the background writer time to fail (on any machine load) before the next
    scheduled save, which would report it anyway."""

    def __init__(self, batch_size, after):
        super().__init__(batch_size)
        self.after = after

    def __next__(self):
        if self.index >= self.after:
            import time

            time.sleep(0.5)
        return super().__next__()


def test_disk_full_during_async_save_stops_at_the_next_steps_in_one_line(
        tmp_path, monkeypatch, stand_in):
    """The array writer of the save of step 8 raises ENOSPC in orbax's background commit
    (as tensorstore does on a full disk). The run stops before the next save (12) with one
    line naming the step, the cause, the removed temp folder and the last good step (4);
    checkpoint 4 is kept. (stderr in a real process: test_faults_end_to_end.py.)"""
    from orbax.checkpoint._src.serialization import serialization

    real = serialization.async_serialize_from_host
    failed = []

    async def full_disk(rslices, tspec, **kwargs):
        where = json.dumps(tspec, default=str)
        if f"{os.sep}8.orbax-checkpoint-tmp" in where:
            failed.append(where)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return await real(rslices, tspec, **kwargs)

    monkeypatch.setattr(serialization, "async_serialize_from_host", full_disk)
    with pytest.raises(CheckpointSaveError) as err:
        _train(_config(steps=16, every=4), tmp_path, lambda c, w: SlowAfter(8, after=8))
    directory = tmp_path / "checkpoints"
    assert failed, "the stand-in writer was never called for step 8"
    assert str(err.value) == (
        f"checkpoint at step 8 failed: no space left on device ({directory}/8.orbax-"
        f"checkpoint-tmp, removed); last good checkpoint: 4; free the space (or fix the "
        f"cause) and run the same command again to resume from it")
    assert isinstance(err.value, FaultError) and err.value.exit_code == 1
    assert "\n" not in str(err.value)
    steps = [s for s, _ in _logged(tmp_path)]
    # Noticed by the check right after step 8 (when the background write fails that fast, as
    # on a loaded machine) or at the steps after it, never as late as the next save (12).
    assert 8 <= max(steps) < 12, steps
    assert sorted(os.listdir(directory)) == ["4"]   # temp folder gone, step 4 kept
    assert len(_saved_params(tmp_path, 4)) > 10


# --- 2. a damaged latest checkpoint -----------------------------------------------------

def test_damaged_latest_checkpoint_resumes_from_the_previous_one_exactly(
        tmp_path, stand_in, capsys):
    """Checkpoints 4 and 8 of a run; a data file of 8 truncated. The same command resumes
    from 4 (one line says 8 was skipped and why), trains 5..8 to the params and losses of
    the uninterrupted run bit for bit, saves 8 again, and keeps the damaged folder."""
    config = _config(steps=8, every=4)
    _train(config, tmp_path)
    straight = _logged(tmp_path)
    want = _saved_params(tmp_path, 8)
    data_files = sorted((tmp_path / "checkpoints" / "8" / "state").rglob("d/*"),
                        key=lambda p: p.stat().st_size)
    victim = data_files[-1]
    os.truncate(victim, 100)
    capsys.readouterr()

    summary = _train(config, tmp_path)
    out = capsys.readouterr().out
    assert summary["step"] == 8
    assert "checkpoint at step 8 skipped: OUT_OF_RANGE" in out, out
    assert f"kept as {tmp_path}/checkpoints/8.damaged" in out
    assert f"resumed from {tmp_path}/checkpoints/4" in out
    logged = _logged(tmp_path)
    assert logged[:8] == straight and logged[8:] == straight[4:]     # steps 5..8 again
    got = _saved_params(tmp_path, 8)
    assert len(got) == len(want) > 10
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["4", "8", "8.damaged"]
    moved = tmp_path / "checkpoints" / "8.damaged" / victim.relative_to(
        tmp_path / "checkpoints" / "8")
    assert moved.stat().st_size == 100                         # kept as it was found


def test_no_checkpoint_restores_is_one_line_and_moves_nothing(tmp_path):
    """Every step damaged: a FaultError naming each step and its cause; nothing renamed."""
    from bert_jax.train.checkpoint_faults import DamagedCheckpointError
    from tests.train.common import tiny_state

    tiny = tiny_state()
    saver = ckpt_lib.Checkpointer(str(tmp_path), every=1)
    for step in (3, 6):
        saver.save(tiny["state"].replace(step=jnp.asarray(step, jnp.int32)),
                   jax.random.key(0), MemorySource(8), {}, force=True)
    saver.wait()
    for step in (3, 6):
        os.remove(tmp_path / "checkpoints" / str(step) / "state" / "manifest.ocdbt")
    with pytest.raises(DamagedCheckpointError) as err:
        saver.restore(tiny["abstract"], MemorySource(8))
    saver.close()
    msg = str(err.value)
    assert msg.startswith(f"no checkpoint under {tmp_path}/checkpoints can be restored "
                          f"(step 6: NOT_FOUND"), msg
    assert "; step 3: NOT_FOUND" in msg and "\n" not in msg
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3", "6"]


# --- 3. a warm start from a run of another size -----------------------------------------

def _no_tensor_reads(monkeypatch):
    """Every way a warm start reads tensors (or builds the model) fails the test if taken."""
    from bert_jax.convert import hf_files, model_dir

    def read(*args, **kwargs):
        raise AssertionError("a tensor was read (or the model built) before the check")
    for owner, name in ((ckpt_lib.Checkpointer, "restore"),
                        (ckpt_lib.Checkpointer, "restore_params"),
                        (runs_lib.SavedRun, "read_params"), (model_dir, "load_model_dir"),
                        (hf_files, "read_hf_dir"), (state_lib, "init_state")):
        monkeypatch.setattr(owner, name, read)


@pytest.mark.parametrize("source", ["workdir", "step", "model_dir", "hf_dir"])
def test_warm_start_of_another_size_fails_before_any_tensor_is_read(
        source, tmp_path, monkeypatch):
    """configs/bert_tiny.py's weights (H=128, 2 layers) into configs/bert_base.py: one
    ArchitectureError naming each differing key, raised before the training data, the
    model's init or any tensor read, from a WORKDIR, a checkpoints/<step>, a model
    directory and a Hugging Face directory alike."""
    from bert_jax.convert.hf_files import write_hf_dir
    from bert_jax.convert.model_dir import save_model_dir
    from bert_jax.train.config import load_config
    from bert_jax.train.warm_start import ArchitectureError

    tiny = load_config("configs/bert_tiny.py")
    model = PretrainingTask(tiny, "").model
    shapes = flax.linen.meta.unbox(jax.eval_shape(
        lambda: model.init(jax.random.key(0), **state_lib.dummy_inputs(8, 2))["params"]))
    params = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes)
    path = tmp_path / "source"
    if source in ("workdir", "step"):
        saver = ckpt_lib.Checkpointer(str(path), every=1)
        state = state_lib.TrainState(step=jnp.asarray(5, jnp.int32), params=params,
                                     opt_state={})
        saver.save(state, jax.random.key(0), MemorySource(8), loop.config_to_dict(tiny),
                   force=True)
        saver.close()
        path = path / "checkpoints" / "5" if source == "step" else path
    elif source == "model_dir":
        save_model_dir(str(path), params, from_config_dict(tiny.model))
    else:
        write_hf_dir(str(path), params, from_config_dict(tiny.model))

    base = load_config("configs/bert_base.py", {"train.init_checkpoint": str(path)})
    _no_tensor_reads(monkeypatch)

    def data(config, workdir):
        raise AssertionError("the training data were read before the check")
    with pytest.raises(ArchitectureError) as err:
        pretraining.run(base, str(tmp_path / "run"), make_train_data=data)
    msg = str(err.value)
    assert isinstance(err.value, UserError) and err.value.exit_code == 2 and "\n" not in msg
    assert msg.startswith(f"config.train.init_checkpoint={path}: architecture differs from "
                          f"config.model (checkpoint, config): {{'hidden_size': (128, 768), "
                          f"'num_hidden_layers': (2, 12), 'num_attention_heads': (2, 12), "
                          f"'intermediate_size': (512, 3072)}}"), msg


def test_a_workdir_of_the_other_layer_layout_names_scan_layers(tmp_path, stand_in):
    """A run saved with one tree per layer (configs/bert_base.py before it scanned its
    layers), resumed or warm-started with stacked layers: one line naming the setting."""
    from bert_jax.train.checkpoint_faults import CheckpointMismatchError
    from bert_jax.train.warm_start import InitCheckpointError

    _train(_config(steps=1, every=1), tmp_path / "old")
    scanned = _config(steps=2, every=1)
    scanned.model.scan_layers = True
    with pytest.raises(CheckpointMismatchError) as err:
        _train(scanned, tmp_path / "old")
    msg = str(err.value)
    assert "\n" not in msg and msg.endswith(
        "(its layers are saved with model.scan_layers=False: set "
        "--config.model.scan_layers=false)"), msg
    scanned.train.init_checkpoint = str(tmp_path / "old")
    with pytest.raises(InitCheckpointError) as err:
        _train(scanned, tmp_path / "new")
    msg = str(err.value)
    assert "\n" not in msg and "tensors missing: bert/encoder/layers/" in msg, msg
    assert "its layers are saved with model.scan_layers=False and a training workdir " \
           "restores only into that layout: set --config.model.scan_layers=false" in msg, msg
    assert not (tmp_path / "new" / "checkpoints").exists()


# --- 6. checkpoint.every=0 --------------------------------------------------------------

def test_checkpoint_every_0_saves_at_the_end_only(tmp_path, stand_in):
    """every=0 means what eval_every=0 means: at the end only (it saved every step)."""
    _train(_config(steps=3, every=0), tmp_path)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]


def test_checkpoint_every_negative_is_refused_before_anything_runs(tmp_path, monkeypatch):
    from bert_jax.models.config import ConfigError

    _no_tensor_reads(monkeypatch)
    with pytest.raises(ConfigError, match=r"^config.checkpoint.every=-1: expected N > 0 "
                                          r"\(save every N steps and at the end\) or 0 "
                                          r"\(save at the end only\)$"):
        _train(_config(steps=3, every=-1), tmp_path)
    assert not (tmp_path / "checkpoints").exists()


def test_asyncio_reports_of_orbax_futures_are_quiet_and_others_are_not():
    """asyncio's 'exception was never retrieved' for a bare future names no coroutine; the
    filter then goes by the frames of the exception's traceback (one stray orbax traceback
    in 19 restarts from a damaged checkpoint came this way)."""
    import logging

    from bert_jax.train.checkpoint_faults import orbax_async_garbage

    def raised_in(filename):
        namespace = {}
        exec(compile("def f():\n    raise ValueError('OUT_OF_RANGE: byte range')\n",
                     filename, "exec"), namespace)
        try:
            namespace["f"]()
        except ValueError as e:
            return e

    def record(exc):
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1,
                                 "Future exception was never retrieved\nfuture: <Future "
                                 "finished exception=Exception('Encountered error')>", None,
                                 (type(exc), exc, exc.__traceback__))

    orbax_file = os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "serialization.py")
    assert orbax_async_garbage(record(raised_in(orbax_file)))
    assert not orbax_async_garbage(record(raised_in(os.path.join(os.sep, "mine", "app.py"))))
