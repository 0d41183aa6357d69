"""Faults end to end, in real processes (slow): the fault drill (kill -9 at random moments
and during saves, resume, compare with an uninterrupted run), a disk that fills up under a
running pre-training, and a damaged latest checkpoint at restart. stderr carries the one
error and nothing of orbax's background threads (the in-process tests in
test_checkpoint_faults.py cannot see that: pytest captures those hooks and logs)."""

from __future__ import annotations

import os
import re

import pytest

from tests.train.conftest import REPO, run

CONFIG = "--config=tests/train/tiny_run_config.py"


@pytest.mark.slow  # a reference run and 4 launches of launch/train.py: ~60 s here
def test_fault_drill_kills_lose_nothing_beyond_one_interval(tmp_path):
    out = run([REPO / "benchmarks/fault_drill.py", CONFIG, "--kills=3", "--during_saves=1",
               "--every=10", f"--workdir={tmp_path}"], timeout=900).stdout
    lines = out.splitlines()
    summary = next(x for x in lines if " kills, " in x)
    assert summary == "3 kills, 0 lost beyond one interval, 0 failed resumes", out
    assert "final state equal to the uninterrupted run: yes" in out, out
    assert "temporary folders left: 0" in out, out


@pytest.mark.slow  # one tiny run in a subprocess: ~15 s here
def test_disk_filling_up_ends_in_one_error_and_keeps_the_last_checkpoint(tmp_path):
    result = run([REPO / "tests/train/fault_worker.py", tmp_path], check=False)
    assert result.returncode == 1, result.stderr[-3000:]
    err = result.stderr
    assert err.count("Traceback") == 1, err[-6000:]     # the interpreter's, of our error
    for noise in ("Event loop is closed", "sys.meta_path", "never retrieved", "orbax"):
        assert noise not in err.split("Traceback")[0], err[-6000:]
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"bert_jax\.train\.checkpoint_faults\.CheckpointSaveError: checkpoint at step 20 "
        r"failed: file too large \(\S+/checkpoints/20\.orbax-checkpoint-tmp, removed\); "
        r"last good checkpoint: 10; free the space \(or fix the cause\) and run the same "
        r"command again to resume from it", last), last
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["10"]


@pytest.mark.slow  # two launches of launch/train.py: ~30 s here
def test_damaged_latest_checkpoint_at_restart_is_one_line(tmp_path):
    run([REPO / "launch/train.py", CONFIG, f"--workdir={tmp_path}"])      # saves 10 and 20
    files = sorted((tmp_path / "checkpoints" / "20" / "state").rglob("d/*"),
                   key=lambda p: p.stat().st_size)
    os.truncate(files[-1], 100)
    result = run([REPO / "launch/train.py", CONFIG, f"--workdir={tmp_path}",
                  "--config.train.steps=30"])
    assert "Traceback" not in result.stderr and "orbax" not in result.stderr, \
        result.stderr[-6000:]
    skipped = [x for x in result.stdout.splitlines() if "skipped" in x]
    assert len(skipped) == 1 and skipped[0].startswith(
        "checkpoint at step 20 skipped: OUT_OF_RANGE: Error reading"), result.stdout
    assert skipped[0].endswith(f"; kept as {tmp_path}/checkpoints/20.damaged")
    assert f"resumed from {tmp_path}/checkpoints/10" in result.stdout
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["10", "20", "20.damaged", "30"]
