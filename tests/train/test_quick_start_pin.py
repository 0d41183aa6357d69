"""The quick start's numbers are pinned: its first 50 steps give, bit for bit on CPU, the
losses and the evaluation that the code before the one-loop refactor gave
(tests/goldens/quick_start_losses.json, made by that code with the command it names)."""

from __future__ import annotations

import json

from bert_jax.tasks import pretraining
from bert_jax.train.config import load_config
from tests.conftest import GOLDENS


def test_first_50_quick_start_losses_equal_the_pinned_ones(tmp_path):
    golden = json.loads((GOLDENS / "quick_start_losses.json").read_text())
    # The quick start's schedule (2,400 steps) cut after its first 50 steps.
    config = load_config("configs/bert_tiny.py", {
        "train.steps": 50, "train.log_every": 1, "schedule.total_steps": 2400,
        "checkpoint.every": 0, "train.tensorboard": False})
    summary = pretraining.run(config, str(tmp_path), progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    assert len(losses) == 50 and losses == golden["losses"]
    assert {k: summary[k] for k in golden["eval"]} == golden["eval"]
