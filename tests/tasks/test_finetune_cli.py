"""launch/train.py with a fine-tuning config, as a user runs it: SIGTERM mid-run saves and
exits 0; the same command resumes and finishes the sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.tasks.conftest import REPO, VOCAB
from tests.train.common import sigterm_when_logged

ARGS = ["--config=configs/glue.py:tsv", "--config.task.data_dir=tests/tasks/data/pairs",
        f"--config.tokenizer.vocab_file={VOCAB}", "--config.model.hidden_size=32",
        "--config.model.num_hidden_layers=1", "--config.model.num_attention_heads=2",
        "--config.model.intermediate_size=64", "--config.task.max_seq_length=32",
        "--config.train.batch_size=8", "--config.train.eval_batch_size=40",
        "--config.train.log_every=1", "--config.train.tensorboard=False",
        "--config.checkpoint.every=100000"]


def _env():
    return dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
                PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.mark.slow  # two launches, each importing and compiling: ~40 s on a quiet machine
def test_sigterm_saves_exits_0_and_the_same_command_finishes(tmp_path):
    workdir = tmp_path / "mrpc_like"
    cmd = [sys.executable, str(REPO / "launch/train.py"), *ARGS, f"--workdir={workdir}",
           "--config.train.steps=100000"]
    log = workdir / "run_0" / "metrics.jsonl"
    stdout = sigterm_when_logged(cmd, _env(), log, cwd=REPO)
    saved = int(stdout.split("preemption: saved step ")[1].split(";")[0])
    assert sorted(map(int, os.listdir(workdir / "run_0" / "checkpoints"))) == [saved]
    assert not (workdir / "metrics.jsonl").exists()  # no run finished yet

    # The same command, now bounded: resumes at `saved`, trains 2 more steps, evaluates.
    cmd[-1] = f"--config.train.steps={saved + 2}"
    done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"checkpoints/{saved}" in done.stdout and "resumed from" in done.stdout
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps[-3:] == [saved + 1, saved + 2, saved + 2]  # two train logs, then the eval
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["run"] == 0 and records[0]["train/steps"] == saved + 2
    assert records[-1]["summary"] and 0.0 <= records[-1]["dev/accuracy_mean"] <= 1.0
    assert (workdir / "best_model" / "bert_config.json").exists()
    assert (workdir / "run_0" / "dev_predictions-dev.tsv").exists()


@pytest.mark.slow  # one launch: import + compile, ~40 s
def test_swag_config_runs_the_multiple_choice_task(tmp_path):
    """configs/swag.py through launch/train.py fine-tunes (not pre-trains): dev accuracy in
    the sweep's metrics.jsonl, choice predictions in the run."""
    workdir = tmp_path / "swag"
    cmd = [sys.executable, str(REPO / "launch/train.py"), "--config=configs/swag.py",
           "--config.task.train_file=tests/tasks/data/choice/train.csv",
           "--config.task.dev_file=tests/tasks/data/choice/val.csv",
           "--config.task.max_seq_length=32", *ARGS[2:7], "--config.train.steps=3",
           "--config.train.eval_batch_size=40", "--config.train.tensorboard=False",
           f"--workdir={workdir}"]
    subprocess.run(cmd, env=_env(), cwd=REPO, check=True, capture_output=True, timeout=600)
    records = [json.loads(l) for l in open(workdir / "metrics.jsonl")]
    assert records[0]["train/steps"] == 3 and 0 <= records[0]["dev/accuracy"] <= 1
    assert records[-1]["summary"] and records[-1]["selected_on"] == "dev"
    assert (workdir / "run_0" / "choice_predictions-dev.tsv").exists()
