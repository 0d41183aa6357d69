"""The quick start's numbers are pinned: its first 50 steps give the losses and the
evaluation that the code before the one-loop refactor gave (tests/goldens/
quick_start_losses.json, made by that code with the command it names, on one x86-64 CPU).

The golden crosses machines, so it is compared to a tolerance, not bit for bit: XLA:CPU
splits its reductions by the host's vector width and thread count, and a float32 sum in
another order rounds differently. The loss at step k may differ from the golden's by k
float32 ulps of its value (one ulp per step: each step's update carries the previous
rounding differences forward). Measured against this golden (steps 1-50, the run's eval):
an AVX-512 host with 1 or 2 cores, and the same host limited to AVX2 or SSE4.2 by
--xla_cpu_max_isa, differ by at most 2 ulps, at most 0.23 ulps per step. A learning rate
changed by 0.01% differs by 4.6 ulps per step, a new seed, dropout on, or other masks by
thousands: all fail. The evaluation after the 50 steps: losses within 50 ulps, accuracies
within one prediction, counts exact. Comparisons inside one machine (resume against an
uninterrupted run, packed against unpacked, kernels against their reference) stay bit for
bit in their own tests.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert_jax.tasks import pretraining
from bert_jax.train.config import load_config
from tests.conftest import GOLDENS

STEPS = 50
COUNTS = ("eval/examples", "eval/masked_tokens")
ACCURACIES = {"eval/mlm_acc": "eval/masked_tokens",  # accuracy: its count
              "eval/mlm_acc_majority": "eval/masked_tokens", "eval/nsp_acc": "eval/examples"}


def _ulps(value, golden) -> np.ndarray:
    """|value - golden| in float32 ulps of the golden."""
    golden = np.asarray(golden, np.float32)
    return np.abs(np.asarray(value, np.float64) - golden) / np.spacing(np.abs(golden))


def differences(losses: list[float], evals: dict, golden: dict) -> list[str]:
    """What falls outside the module's tolerance, one line each (empty: within it)."""
    out = []
    if len(losses) != len(golden["losses"]):
        return [f"{len(losses)} losses, the golden has {len(golden['losses'])}"]
    ulps = _ulps(losses, golden["losses"])
    for step, u in enumerate(ulps, 1):
        if u > step:
            out.append(f"step {step}: loss {losses[step - 1]!r} is {u:.0f} ulps from "
                       f"{golden['losses'][step - 1]!r} (at most {step})")
    for key, want in golden["eval"].items():
        got = evals[key]
        if key in COUNTS:
            ok = got == want
        elif key in ACCURACIES:
            ok = abs(got - want) * golden["eval"][ACCURACIES[key]] <= 1 + 1e-9
        else:
            ok = _ulps(got, want) <= STEPS
        if not ok:
            out.append(f"{key}: {got!r}, the golden {want!r}")
    return out


def _run(tmp_path, **overrides) -> tuple[list[float], dict]:
    # The quick start's schedule (2,400 steps) cut after its first 50 steps.
    config = load_config("configs/bert_tiny.py", {
        "train.steps": STEPS, "train.log_every": 1, "schedule.total_steps": 2400,
        "checkpoint.every": 0, "train.tensorboard": False, **overrides})
    summary = pretraining.run(config, str(tmp_path), progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in records if "train/loss" in r], summary


@pytest.fixture(scope="module")
def golden():
    return json.loads((GOLDENS / "quick_start_losses.json").read_text())


def test_first_50_quick_start_losses_equal_the_pinned_ones(tmp_path, golden):
    losses, summary = _run(tmp_path)
    assert differences(losses, summary, golden) == []


def test_the_tolerance_takes_rounding_and_refuses_a_change(golden):
    """k ulps at step k pass; one more at any step, or one count or two predictions off,
    fail."""
    g = np.asarray(golden["losses"], np.float32)
    steps = np.arange(1, STEPS + 1)
    up = (g + steps * np.spacing(g)).tolist()
    assert differences(up, golden["eval"], golden) == []
    for step in (1, 20, 50):
        bad = list(up)
        bad[step - 1] = float(np.nextafter(np.float32(bad[step - 1]), np.float32(np.inf)))
        assert [d.split(":")[0] for d in differences(bad, golden["eval"], golden)] == [
            f"step {step}"]
    ev = dict(golden["eval"])
    ev["eval/mlm_acc"] += 1 / ev["eval/masked_tokens"]  # one prediction: rounding may do it
    assert differences(golden["losses"], ev, golden) == []
    ev["eval/mlm_acc"] += 1 / ev["eval/masked_tokens"]
    ev["eval/masked_tokens"] += 1
    assert [d.split(":")[0] for d in differences(golden["losses"], ev, golden)] == [
        "eval/mlm_acc", "eval/masked_tokens"]


@pytest.mark.slow  # 50 more steps of the quick start: ~25 s on 2 cores
def test_a_learning_rate_changed_by_a_ten_thousandth_fails_the_pin(tmp_path, golden):
    losses, summary = _run(tmp_path, **{"schedule.lr": 0.0015 * 1.0001})
    assert len(differences(losses, summary, golden)) >= 10
