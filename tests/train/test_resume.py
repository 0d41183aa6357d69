"""Preemption and crashes: launch/train.py restarted with the same command resumes
exactly; SIGTERM checkpoints the current step and exits 0."""

from __future__ import annotations

import os
import signal
import sys

import jax
import numpy as np
import pytest

from tests.train.common import sigterm_when_logged
from tests.train.conftest import REPO, read_losses, run, subprocess_env

CONFIG = "--config=tests/train/tiny_run_config.py"


def _final_params(workdir, step):
    import orbax.checkpoint as ocp

    with ocp.PyTreeCheckpointer() as ckptr:
        tree = ckptr.restore(os.path.join(workdir, "checkpoints", str(step), "state"))
    return tree


@pytest.mark.slow  # three launches of launch/train.py: ~40 s on two quiet cores
@pytest.mark.filterwarnings("ignore:Sharding info not provided")
def test_kill9_after_checkpoint_then_resume_is_bit_exact(tmp_path, compile_cache):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    train = [REPO / "launch/train.py", CONFIG]
    run([*train, f"--workdir={straight}"], cache=compile_cache)
    killed = run([*train, f"--workdir={crashed}", "--debug_kill_after_step=10"],
                 cache=compile_cache, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert sorted(os.listdir(crashed / "checkpoints")) == ["10"]
    assert max(read_losses(crashed)) == 10
    resumed = run([*train, f"--workdir={crashed}"], cache=compile_cache)
    assert "resumed from" in resumed.stdout

    a, b = read_losses(straight), read_losses(crashed)
    assert sorted(a) == list(range(1, 21)) and sorted(b) == list(range(1, 21))
    for step in range(11, 21):
        assert a[step] == b[step], (step, a[step], b[step])   # bit for bit
    pa, pb = _final_params(straight, 20), _final_params(crashed, 20)
    leaves_a = [np.asarray(x) for x in jax.tree_util.tree_leaves(pa)]
    leaves_b = [np.asarray(x) for x in jax.tree_util.tree_leaves(pb)]
    assert len(leaves_a) == len(leaves_b) > 10
    assert all(np.array_equal(x, y) for x, y in zip(leaves_a, leaves_b))


def test_sigterm_checkpoints_current_step_exits_0_and_resumes(tmp_path, compile_cache):
    workdir = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "launch/train.py"), CONFIG, f"--workdir={workdir}",
           "--config.train.steps=100000", "--config.checkpoint.every=100000"]
    stdout = sigterm_when_logged(cmd, subprocess_env(cache=compile_cache),
                                 workdir / "metrics.jsonl", cwd=REPO)
    assert "preemption: saved step" in stdout
    saved = int(stdout.split("preemption: saved step ")[1].split(";")[0])
    assert sorted(map(int, os.listdir(workdir / "checkpoints"))) == [saved]
    assert max(read_losses(workdir)) == saved >= 3

    run([REPO / "launch/train.py", CONFIG, f"--workdir={workdir}",
         f"--config.train.steps={saved + 3}", "--config.checkpoint.every=100000"],
        cache=compile_cache)
    losses = read_losses(workdir)
    assert sorted(losses) == list(range(1, saved + 4))
    # The resumed run is the same run: one more identical command without SIGTERM would
    # have logged the same losses (checked bit-exactly in the kill -9 test).
    assert sorted(map(int, os.listdir(workdir / "checkpoints"))) == [saved, saved + 3]
