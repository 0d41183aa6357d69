"""Faults of a run of two processes of launch/train.py (slow): a SIGTERM to one of them, a
kill -9 of process 0 (which hosts jax's coordination service), a save that fails on one.
Each ends both processes at the same step with one line each (no traceback, no native log
line or stack on the terminal), and the same command resumes to the losses of an
uninterrupted run, bit for bit. Before, the first hung both processes, the second ended the
survivor in a C++ check failure and its stack after ~80 s, the third left the other process
waiting at orbax's commit barrier for 20 minutes."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.train.conftest import REPO, read_losses, subprocess_env

STEPS, EVERY = 30, 10
NOISE = re.compile(r"Traceback|Check failure|Fatal Python error|^[IWEF]\d{4} \d\d:\d\d", re.M)


def _start(workdir, cache, extra=None) -> list:
    """Both processes of launch/train.py on the tiny config: [(Popen, stdout, stderr)]."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    procs = []
    for i in range(2):
        out, err = (open(workdir.parent / f"{workdir.name}_p{i}.{k}", "w+")
                    for k in ("out", "err"))
        cmd = [sys.executable, "launch/train.py", "--config=tests/train/tiny_run_config.py",
               f"--workdir={workdir}", f"--config.train.steps={STEPS}",
               f"--config.checkpoint.every={EVERY}", "--config.mesh.data=-1",
               f"--coordinator_address=localhost:{port}", "--num_processes=2",
               f"--process_id={i}"] + (extra or {}).get(i, [])
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(1, cache),
                                       stdout=out, stderr=err), out, err))
    return procs


def _finish(procs, timeout: float = 600) -> list[tuple[int, str, str, float]]:
    """(exit code, stdout, stderr, when it ended) of each process; fails on a hang."""
    deadline, ended = time.time() + timeout, {}
    while len(ended) < len(procs) and time.time() < deadline:
        for i, (p, _, _) in enumerate(procs):
            if i not in ended and p.poll() is not None:
                ended[i] = time.time()
        time.sleep(0.05)
    for p, _, _ in procs:
        if p.poll() is None:
            p.kill()
    assert len(ended) == len(procs), "a process hung"
    out = []
    for i, (p, o, e) in enumerate(procs):
        o.seek(0)
        e.seek(0)
        out.append((p.returncode, o.read(), e.read(), ended[i]))
    return out


def _wait(condition, procs, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline and all(p.poll() is None for p, _, _ in procs), \
            "the run ended before the fault"
        time.sleep(0.05)


def _logged(workdir) -> int:
    try:
        return max(read_losses(workdir), default=0)
    except (OSError, ValueError):  # not written yet, or a line being written
        return 0


def _resumes_exactly(workdir, reference, cache, start: int) -> None:
    """The same command again: from `start`, to the end, the reference's losses."""
    ended = _finish(_start(workdir, cache))
    assert [code for code, *_ in ended] == [0, 0], ended[0][2][-3000:] + ended[1][2][-3000:]
    assert f"resumed from {workdir}/checkpoints/{start}" in ended[0][1]
    want, got = read_losses(reference), read_losses(workdir)
    assert sorted(got) == list(range(1, STEPS + 1))
    np.testing.assert_array_equal([got[s] for s in got], [want[s] for s in got])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, compile_cache):
    workdir = tmp_path_factory.mktemp("pod") / "reference"
    ended = _finish(_start(workdir, compile_cache))
    assert [code for code, *_ in ended] == [0, 0], ended[0][2][-3000:] + ended[1][2][-3000:]
    return workdir


@pytest.mark.slow  # three launches of two processes: ~3 min on a quiet machine
def test_sigterm_to_one_process_saves_the_same_step_on_both(tmp_path, reference,
                                                             compile_cache):
    workdir = tmp_path / "run"
    procs = _start(workdir, compile_cache)
    _wait(lambda: _logged(workdir) >= 3, procs)
    procs[1][0].send_signal(signal.SIGTERM)
    sent = time.time()
    ended = _finish(procs)
    assert [code for code, *_ in ended] == [0, 0], ended[0][2][-3000:] + ended[1][2][-3000:]
    assert max(t for *_, t in ended) - sent < 90
    said = [re.findall(r"^preempted: saved step (\d+) on all 2 processes; rerun the same "
                       r"command to resume$", out, re.M) for _, out, _, _ in ended]
    assert len(said[0]) == len(said[1]) == 1 and said[0] == said[1], ended
    assert not any(NOISE.search(err) for _, _, err, _ in ended), ended[1][2][-3000:]
    _resumes_exactly(workdir, reference, compile_cache, int(said[0][0]))


@pytest.mark.slow  # three launches of two processes: ~3 min on a quiet machine
def test_kill_9_of_process_0_ends_the_other_in_one_line(tmp_path, reference, compile_cache):
    workdir = tmp_path / "run"
    procs = _start(workdir, compile_cache)
    _wait(lambda: (workdir / "checkpoints" / "10").is_dir() and _logged(workdir) >= 12, procs)
    procs[0][0].send_signal(signal.SIGKILL)
    killed = time.time()
    (_, _, _, _), (code, _, err, ended) = _finish(procs)
    assert code == 1 and ended - killed < 90, err[-3000:]
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("[Gloo]")
             and not x.startswith("pre-training")]
    assert len(lines) == 1 and not NOISE.search(err), err[-3000:]
    assert re.fullmatch(
        rf"error: process 0 of 2 was lost \(.+\); this process stopped, as every other does; "
        rf"last complete checkpoint: {workdir}/checkpoints/10; to resume, run the same "
        rf"command on every host again: python launch/train.py .+ --process_id=1 "
        rf"\(details: \S+\.log\)", lines[0]), lines[0]
    log = re.search(r"details: (\S+\.log)", lines[0]).group(1)
    assert "Terminating process because the JAX distributed service" in open(log).read()
    _resumes_exactly(workdir, reference, compile_cache, 10)


@pytest.mark.slow  # three launches of two processes: ~3 min on a quiet machine
def test_a_save_failing_on_one_process_stops_both_at_the_same_step(tmp_path, reference,
                                                                   compile_cache):
    workdir = tmp_path / "run"
    ended = _finish(_start(workdir, compile_cache,
                           {1: ["--debug_fail_save_at_step=20"]}))
    assert [code for code, *_ in ended] == [1, 1], ended[0][2][-3000:] + ended[1][2][-3000:]
    errors = [[x for x in err.splitlines() if x.startswith("error: ")] for _, _, err, _ in ended]
    assert all(len(e) == 1 for e in errors), errors
    stopped = [re.search(r"every process stopped at step (\d+)$", e[0]).group(1)
               for e in errors]
    assert stopped[0] == stopped[1], errors
    assert errors[1][0].startswith(
        f"error: checkpoint at step 20 failed: no space left on device ({workdir}/checkpoints/"
        f"20.orbax-checkpoint-tmp, removed); last good checkpoint: 10;"), errors[1]
    assert errors[0][0].startswith(
        "error: checkpoint at step 20 failed on process 1 (its log names the cause); last "
        "good checkpoint: 10;"), errors[0]
    assert not any(NOISE.search(err) for _, _, err, _ in ended)
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["10"]
    _resumes_exactly(workdir, reference, compile_cache, 10)
