"""The parent of one of several processes (bert_jax/supervise.py), with a stand-in child
that writes what jax writes when it aborts a process: the terminal gets one line naming the
lost process and the last checkpoint, exit code 1; the log file keeps everything."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

# What jax's distributed client writes when process 0's service is gone (abridged), then
# the abort; a Python warning logged by absl before it, and a progress bar's redraws.
CHILD = r'''
import os, sys
err = sys.stderr
err.write("pre-training:  10%|#  | 3/30\r")
err.write("pre-training:  13%|#  | 4/30\r")
err.write("W1204 21:20:16.322655 1400 loop.py:12] a warning of ours\n")
err.write("E1204 21:24:20.533978   30678 coordination_service.cc:1549] Use error polling: "
          "The following tasks are unhealthy (stopped sending heartbeats):\n1\nThe tasks "
          "have crashed.\n")
err.write("F1204 21:24:20.534075   30678 client.h:80] Terminating process because the JAX "
          "distributed service detected fatal errors. absl::Status: UNAVAILABLE: Failed to "
          "send RPC to coordination service. Either the leader task was preempted\n")
err.write("Additional GRPC error information\n*** Check failure stack trace: ***\n")
err.write("    @     0x7f1a62c40634  absl::log_internal::LogMessage::SendToLog()\n")
err.flush()
os.abort()
'''


def _supervised(tmp_path, body: str, *flags: str):
    script = tmp_path / "child.py"
    script.write_text(body)
    argv = [str(script), f"--workdir={tmp_path / 'run'}", "--num_processes=2",
            "--process_id=1", *flags]
    return subprocess.run(
        [sys.executable, "-c", "import sys; from bert_jax import supervise; "
         f"sys.exit(supervise.run({argv!r}))"], cwd=REPO, capture_output=True, text=True,
        timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_jax_aborting_the_child_is_one_line_and_exit_1(tmp_path):
    (tmp_path / "run" / "checkpoints" / "20" / "state").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "30.orbax-checkpoint-tmp").mkdir()
    result = _supervised(tmp_path, CHILD)
    assert result.returncode == 1, result.stderr
    shown = result.stderr.replace("\r", "\n").splitlines()
    assert shown[:3] == ["pre-training:  10%|#  | 3/30", "pre-training:  13%|#  | 4/30",
                         "W1204 21:20:16.322655 1400 loop.py:12] a warning of ours"], shown
    log = shown[3].split("(details: ")[1].rstrip(")")
    assert shown[3:] == [
        f"error: process 0 of 2 was lost (the coordination service it hosts stopped "
        f"answering); this process stopped, as every other does; last complete checkpoint: "
        f"{tmp_path / 'run'}/checkpoints/20; to resume, run the same command on every host "
        f"again: python {tmp_path / 'child.py'} --workdir={tmp_path / 'run'} "
        f"--num_processes=2 --process_id=1 (details: {log})"], shown
    kept = open(log).read()
    assert "Check failure stack trace" in kept and "client.h:80] Terminating" in kept


def test_verbose_shows_everything_and_exit_codes_pass_through(tmp_path):
    result = _supervised(tmp_path, CHILD, "--verbose")
    assert result.returncode == 1 and "Check failure stack trace" in result.stderr
    passed = _supervised(tmp_path, "import sys\nprint('out')\nsys.exit(3)\n")
    assert (passed.returncode, passed.stdout, passed.stderr) == (3, "out\n", "")
    killed = _supervised(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert killed.returncode == 137
    assert killed.stderr.startswith("error: the training process ended on signal SIGKILL")
