"""A run saved by 2 jax.distributed processes resumes with 1 process, and that one's
checkpoint resumes with 2 again: step, params, optimizer state and RNG restore bit for bit
each time, the data continues at the consumed position (with the warning that it is not
exact in general; the in-memory source used here is layout-independent, so it is), and
the losses of steps 1..5 are those of an uninterrupted single-process run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.train.common import free_port
from tests.train.conftest import REPO, read_losses, subprocess_env

WORKER = str(REPO / "tests/train/layout_worker.py")


def _launch(workdir, processes: int, steps: int) -> list[dict]:
    """Runs the worker in `processes` processes (2 CPU devices each when several, 1 device
    alone: the mesh changes with the process count); returns their RESULT objects."""
    address = f"localhost:{free_port()}" if processes > 1 else "-"
    devices = 2 if processes > 1 else 1
    procs = [subprocess.Popen([sys.executable, WORKER, str(i), str(processes), address,
                               str(workdir), str(steps)],
                              cwd=REPO, env=subprocess_env(devices=devices),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(processes)]
    outputs = [p.communicate(timeout=600) for p in procs]
    results = []
    for p, (stdout, stderr) in zip(procs, outputs):
        assert p.returncode == 0, stderr[-6000:]
        line = [x for x in stdout.splitlines() if x.startswith("RESULT ")][-1]
        results.append(json.loads(line[len("RESULT "):]) | {"stdout": stdout, "stderr": stderr})
    return results


@pytest.mark.slow  # three launches (2 + 1 + 2 processes), each compiling: ~60 s here
def test_two_processes_to_one_and_back(reference_losses, tmp_path):
    first = _launch(tmp_path, 2, 2)
    assert [r["final_step"] for r in first] == [2, 2]
    assert all(r["processes"] == 2 and r["devices"] == 4 and "restored" not in r
               for r in first)

    # 2 -> 1 process (4 devices -> 1).
    (one,) = _launch(tmp_path, 1, 4)
    restored = one["restored"]
    assert restored["step"] == 2 and restored["equal"], restored
    assert restored["exact"] is False and restored["position"] == 2
    assert restored["next_batch"] == 2           # batch 3 of the global stream is next
    assert "saved by 2 process(es)" in one["stderr"]
    assert "NOT an exact resume" in one["stderr"]
    assert "the input data was NOT resumed exactly" in one["stdout"]   # the loop says it too
    assert one["final_step"] == 4

    # 1 -> 2 processes.
    second = _launch(tmp_path, 2, 5)
    for r in second:
        assert r["restored"]["step"] == 4 and r["restored"]["equal"], r["restored"]
        assert r["restored"]["exact"] is False and r["restored"]["position"] == 4
        assert r["restored"]["next_batch"] == 4
    assert "restored by 2" in second[0]["stderr"]
    assert "NOT an exact resume" not in second[1]["stderr"]             # process 0 logs
    assert [r["final_step"] for r in second] == [5, 5]

    # Each launch trained on: steps 1-2 (2 processes), 3-4 (1), 5 (2) give the single-
    # process run's losses, as the 2-process test does for a whole run.
    losses = read_losses(tmp_path)
    assert sorted(losses) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose([losses[i] for i in range(1, 6)], reference_losses, rtol=1e-4)
