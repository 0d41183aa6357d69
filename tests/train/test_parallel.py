"""Sharded training gives the single-device numbers: 8 simulated CPU devices on three
meshes, two OS processes joined by jax.distributed, and a checkpoint moved across meshes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.train.common import free_port
from tests.train.conftest import REPO, read_losses, run, subprocess_env


def test_meshes_match_one_device_and_checkpoint_moves_between_meshes(reference_losses, tmp_path):
    result = run([REPO / "tests/train/mesh_worker.py", tmp_path], devices=8)
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    assert set(out["losses"]) == {"data8", "data2_fsdp4", "data2_tensor4"}
    for mesh, losses in out["losses"].items():
        assert len(losses) == 5, mesh
        np.testing.assert_allclose(losses, reference_losses, rtol=1e-4, err_msg=mesh)
    # The loss must actually move, or the comparison above says little.
    assert abs(reference_losses[0] - reference_losses[2]) > 1e-3

    restore = out["restore"]
    for name in ("data2_fsdp4", "one_device", "data8"):
        assert restore[name]["step"] == 5
        assert restore[name]["equal_to_first"], name      # bit-identical values
        assert restore[name]["on_target_shardings"], name
    # intermediate kernel [embed=32, mlp=64]: FSDP splits embed over 4 devices.
    assert restore["data2_fsdp4"]["kernel_shard_shape"] == [8, 64]
    assert restore["one_device"]["kernel_devices"] == 1
    assert restore["one_device"]["kernel_shard_shape"] == [32, 64]


@pytest.mark.slow  # two processes, each importing and compiling: ~40 s on a quiet machine
def test_two_processes_match_single_process(reference_losses, tmp_path):
    address = f"localhost:{free_port()}"
    worker = str(REPO / "tests/train/process_worker.py")
    procs = [subprocess.Popen([sys.executable, worker, str(i), "2", address, str(tmp_path)],
                              cwd=REPO, env=subprocess_env(devices=2), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (stdout, stderr) in zip(procs, outputs):
        assert p.returncode == 0, stderr[-6000:]
        assert "done" in stdout
    losses = read_losses(tmp_path)
    np.testing.assert_allclose([losses[i] for i in range(1, 6)], reference_losses, rtol=1e-4)
    # Each process saved its own input-iterator state next to the shared arrays.
    data_dir = tmp_path / "checkpoints" / "5" / "data"
    assert sorted(p.name for p in data_dir.iterdir() if p.suffix == ".npz") == [
        "process_0-of-2.npz", "process_1-of-2.npz"]
