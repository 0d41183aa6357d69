"""Fine-tuning on a device mesh gives the single-device numbers: the tiny pair fine-tune in
a subprocess with 8 simulated CPU devices, against the same run on one device."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.tasks.conftest import REPO
from tests.tasks.finetune_common import losses


def _run_meshes(tmp_path, meshes: list[str]) -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, str(REPO / "tests/tasks/finetune_mesh_worker.py"), str(tmp_path),
         *meshes], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-6000:]
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _check(out: dict, reference_run) -> None:
    run_dir = reference_run[0] / "run_0"
    ref_loss, ref_gnorm = losses(run_dir), losses(run_dir, "train/grad_norm")
    ref_loss = [ref_loss[s] for s in range(1, 5)]
    ref_gnorm = [ref_gnorm[s] for s in range(1, 5)]
    # The updates must move the loss well beyond the tolerance, or the match says little.
    assert max(ref_loss) - min(ref_loss) > 1e-2, ref_loss
    with open(reference_run[0] / "metrics.jsonl") as f:
        ref_dev = [json.loads(line) for line in f][0]["dev/accuracy"]
    for mesh, got in out.items():
        np.testing.assert_allclose(got["loss"], ref_loss, rtol=1e-4, err_msg=mesh)
        np.testing.assert_allclose(got["grad_norm"], ref_gnorm, rtol=1e-4, err_msg=mesh)
        # Same predictions up to a near-tie or two among the 200 dev pairs.
        assert abs(got["dev"] - ref_dev) <= 0.01, (mesh, got["dev"], ref_dev)


def test_mesh_data_fsdp_tensor_matches_one_device(tmp_path, reference_run):
    """One mesh using all three axes (2 x 2 x 2): ~30 s of compiles in the subprocess."""
    out = _run_meshes(tmp_path, ["2.2.2"])
    _check(out, reference_run)
    # intermediate kernel [embed 32, mlp 64]: embed over fsdp=2, mlp over tensor=2; the
    # 30,522-row vocabulary splits evenly over tensor=2.
    assert out["2.2.2"]["intermediate"] == [16, 32]
    assert out["2.2.2"]["word_embeddings"] == "P('tensor', 'fsdp')"


@pytest.mark.slow  # three meshes, each compiling init, train and eval steps: ~1-2 min
def test_meshes_match_one_device(tmp_path, reference_run):
    out = _run_meshes(tmp_path, ["8.1.1", "2.4.1", "2.1.4"])
    _check(out, reference_run)
    assert out["2.4.1"]["intermediate"] == [8, 64]
    assert out["2.1.4"]["intermediate"] == [32, 16]
    # 30,522 rows do not split over tensor=4: that dimension stays whole (sharding.fit_sharding).
    assert out["2.1.4"]["word_embeddings"] == "P(None, 'fsdp')"
