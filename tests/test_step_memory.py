"""The compiled step's memory, pinned for a small config on CPU, so that a change in what
the backward pass keeps fails here (benchmarks/step_memory.py prints the same figures for
any config, and for an H100 target without a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

from bert_jax.train.config import load_config
from tests.conftest import REPO, load_script

# The benchmark script's analysis, imported as a module (its flags are defined only when it
# runs as a program).
step_memory = load_script("benchmarks/step_memory.py")
# configs/bert_tiny.py (H=128, A=2, F=512) with 4 scanned layers and a 512-token vocabulary,
# so that activations, not the vocabulary, dominate: batch 16 x 128, 20 MLM slots, float32.
OVERRIDES = {"model.vocab_size": 512, "model.num_hidden_layers": 4, "model.scan_layers": True}
ARGS = ["--config.model.vocab_size=512", "--config.model.num_hidden_layers=4",
        "--config.model.scan_layers=True"]
# Temp bytes measured with jax 0.10.2's XLA:CPU (2026-11-24). They move a little with XLA's
# buffer assignment across versions; re-measure with the command in test_script_* and
# re-pin if a jax upgrade moves them, but never to hide a policy keeping more.
PINNED = {"none": 171_580_456, "minimal": 69_769_864}


def _temp(remat: str) -> int:
    config = load_config("configs/bert_tiny.py", {**OVERRIDES, "model.remat": remat})
    return step_memory.analyze(config, 16, 128, 20, jax.devices("cpu")[:1])["temp"]


def test_minimal_remat_keeps_less_than_half_of_no_remat():
    none = _temp("none")
    assert none == pytest.approx(PINNED["none"], rel=0.1)
    # "minimal" keeps 7 H float32 values per token per layer: 4 x 16 x 128 x 7 x 128 x 4 B
    # = 7.3 MB of the 69.8 MB; the rest is gradients, optimizer temporaries and one layer's
    # recomputation.
    assert PINNED["minimal"] < 0.45 * none


def test_script_prints_the_temp_figure_last():
    out = subprocess.run(
        [sys.executable, "benchmarks/step_memory.py", "--config=configs/bert_tiny.py",
         "--batch=16", "--seq=128", "--predictions=20", "--dtype=float32", "--target=cpu",
         "--config.model.remat=minimal", *ARGS],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert "remat minimal" in out.stdout and "attention xla" in out.stdout
    last = lines[-1]
    assert last.startswith("temp: ") and last.endswith(" GiB"), last
    gib = float(last.split()[1])
    assert gib == pytest.approx(PINNED["minimal"] / 2**30, abs=0.1 * PINNED["minimal"] / 2**30)
