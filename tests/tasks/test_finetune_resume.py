"""Preemption and resume of a fine-tuning sweep: SIGTERM saves the current run and returns;
the same call again skips finished runs and continues the interrupted one bit for bit."""

from __future__ import annotations

import json
import os
import signal

from bert_jax.tasks import finetune
from tests.tasks.finetune_common import losses, tiny_pairs_config


def test_sigterm_mid_sweep_then_resume_is_bit_exact(tmp_path, reference_run):
    ref_dir, ref_summary = reference_run
    work = tmp_path / "work"
    steps_seen = []

    def after_step(step):
        steps_seen.append(step)
        if len(steps_seen) == 4 + 3:  # run 1 (the second restart), step 3 of 4
            os.kill(os.getpid(), signal.SIGTERM)

    config = tiny_pairs_config(restarts=2)
    out = finetune.run(config, str(work), progress=False, after_step=after_step)
    assert out == {"preempted": True, "runs_done": 1, "runs": 2}
    # checkpoint.every=2, then the SIGTERM save of step 3; nothing recorded for run 1 yet.
    assert sorted(map(int, os.listdir(work / "run_1" / "checkpoints"))) == [2, 3]
    records = [json.loads(line) for line in open(work / "metrics.jsonl")]
    assert [r["run"] for r in records] == [0]
    run0_log = (work / "run_0" / "metrics.jsonl").read_text()

    steps_seen.clear()
    summary = finetune.run(config, str(work), progress=False, after_step=steps_seen.append)
    assert steps_seen == [4]                    # run 0 not redone; run 1 resumed after step 3
    assert (work / "run_0" / "metrics.jsonl").read_text() == run0_log
    for run in ("run_0", "run_1"):
        got, want = losses(work / run), losses(ref_dir / run)
        assert sorted(got) == sorted(want) == [1, 2, 3, 4]
        assert got == want, run                 # float32 on CPU: bit for bit
    assert summary == ref_summary
    records = [json.loads(line) for line in open(work / "metrics.jsonl")]
    ref_records = [json.loads(line) for line in open(ref_dir / "metrics.jsonl")]
    strip = lambda r: {k: v for k, v in r.items() if k != "train/seconds"}  # noqa: E731
    assert [strip(r) for r in records] == [strip(r) for r in ref_records]

    # A third call has nothing left to do: no training, no second summary line.
    steps_seen.clear()
    assert finetune.run(config, str(work), progress=False, after_step=steps_seen.append) \
        == ref_summary
    assert steps_seen == [] and len(open(work / "metrics.jsonl").readlines()) == 3


def test_finished_runs_are_read_back_and_must_match_the_sweep(tmp_path):
    import pytest

    lines = [{"run": 0, "seed": 0, "lr": 5e-5, "dev/accuracy": 0.75, "dev/f1": 0.5,
              "train/steps": 9, "train/seconds": 1.5},
             {"run": 1, "seed": 1, "lr": 5e-5, "dev/accuracy": 0.25, "dev/f1": 0.0,
              "train/steps": 9, "train/seconds": 1.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    plan = [(5e-5, 0), (5e-5, 1), (3e-5, 0)]
    done = finetune.finished_runs(str(tmp_path), plan)
    assert done == [
        {"run": 0, "seed": 0, "lr": 5e-5, "results": {
            "dev": {"accuracy": 0.75, "f1": 0.5}, "train": {"steps": 9, "seconds": 1.5}}},
        {"run": 1, "seed": 1, "lr": 5e-5, "results": {
            "dev": {"accuracy": 0.25, "f1": 0.0}, "train": {"steps": 9, "seconds": 1.25}}}]
    assert finetune.summarize(done, ["dev"], "accuracy")["dev/accuracy_mean"] == 0.5
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 2: run 1 \(lr 5e-05, seed 1\) "
                                         r"is not run 1 of this config's sweep"):
        finetune.finished_runs(str(tmp_path), [(5e-5, 0), (5e-5, 7)])
    assert finetune.finished_runs(str(tmp_path / "nothing"), plan) == []


def test_damaged_checkpoint_of_a_preempted_run_resumes_from_the_one_before(
        tmp_path, reference_run, capsys):
    """Fine-tuning restores through the same Checkpointer as pre-training: a run preempted
    after step 3 (checkpoints 2 and 3) whose step-3 checkpoint is then truncated resumes
    from step 2, says so in one line, keeps the damaged folder, and ends with the losses
    and metrics of the uninterrupted reference run bit for bit."""
    ref_dir, _ = reference_run
    work = tmp_path / "work"

    def after_step(step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    config = tiny_pairs_config(restarts=1)
    assert finetune.run(config, str(work), progress=False, after_step=after_step)["preempted"]
    checkpoints = work / "run_0" / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["2", "3"]
    files = sorted((checkpoints / "3" / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
    os.truncate(files[-1], 100)
    capsys.readouterr()

    steps_seen = []
    finetune.run(config, str(work), progress=False, after_step=steps_seen.append)
    out = capsys.readouterr().out
    assert steps_seen == [3, 4]                           # resumed after step 2
    assert "checkpoint at step 3 skipped: OUT_OF_RANGE" in out, out
    assert f"kept as {checkpoints}/3.damaged" in out and "resumed from " + f"{checkpoints}/2" in out
    got, want = losses(work / "run_0"), losses(ref_dir / "run_0")
    assert sorted(got) == [1, 2, 3, 4] and got == want    # float32 on CPU: bit for bit
    assert "3.damaged" in os.listdir(checkpoints)
