"""The GPU images we run on have jax, flax, optax and orbax but no TensorFlow: launch/train.py
on synthetic data must train, log and checkpoint with `import tensorflow` failing."""

from __future__ import annotations

import json
import os

from tests.train.conftest import REPO, read_losses, run

# Runs launch/train.py as __main__ with TensorFlow unimportable (a None entry in sys.modules
# makes every `import tensorflow` raise ImportError), then reports any tensorflow module
# that got loaded anyway.
_WITHOUT_TF = """
import runpy, sys
sys.modules["tensorflow"] = None
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    loaded = [m for m in sys.modules if m.startswith("tensorflow.")]
    print("TF_MODULES", loaded[:5])
"""


def test_pretraining_runs_without_tensorflow(tmp_path, compile_cache):
    workdir = tmp_path / "run"
    out = run(["-c", _WITHOUT_TF, REPO / "launch/train.py",
               "--config=tests/train/tiny_run_config.py", f"--workdir={workdir}",
               "--config.train.steps=4", "--config.train.log_every=1",
               "--config.checkpoint.every=2",
               "--config.train.tensorboard=True"],  # falls back to metrics.jsonl alone
              cache=compile_cache)
    assert "TF_MODULES []" in out.stdout, out.stdout[-2000:]
    losses = read_losses(workdir)
    assert sorted(losses) == [1, 2, 3, 4]
    assert all(0 < v < 20 for v in losses.values()), losses
    assert sorted(map(int, os.listdir(workdir / "checkpoints"))) == [2, 4]
    with open(workdir / "metrics.jsonl") as f:
        keys = set().union(*(json.loads(line) for line in f))
    assert {"perf/step_time", "perf/seq_per_s", "train/grad_norm"} <= keys, sorted(keys)
