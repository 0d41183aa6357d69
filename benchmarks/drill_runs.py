"""What both fault drills (benchmarks/fault_drill.py and its several-process mode,
benchmarks/pod_drill.py) share: the training command and its environment, and what a run
leaves on disk (metrics.jsonl's steps, the checkpoints). Not a script."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TMP_MARK = ".orbax-checkpoint-tmp"


def command(args, workdir: str) -> list[str]:
    return [sys.executable, os.path.join(REPO, "launch", "train.py"), f"--config={args.config}",
            f"--workdir={workdir}", "--config.data.source=synthetic",
            f"--config.train.steps={args.steps}", f"--config.checkpoint.every={args.every}",
            "--config.checkpoint.keep=3", "--config.train.log_every=1",
            "--config.train.eval_every=-1", "--config.train.tensorboard=False"]


def env(cache: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["JAX_COMPILATION_CACHE_DIR"] = cache
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return env


def records(workdir: str, offset: int = 0) -> list[dict]:
    """metrics.jsonl's records from byte `offset` on (a line cut by a kill is skipped)."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path, "rb") as f:
        f.seek(offset)
        lines = f.read().decode("utf-8", "replace").splitlines()
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def logged(workdir: str, offset: int = 0) -> dict[int, float]:
    """step -> train/loss, the last record of each step (a resumed step logs again)."""
    return {int(r["step"]): r["train/loss"] for r in records(workdir, offset)
            if "train/loss" in r}


def size(workdir: str) -> int:
    path = os.path.join(workdir, "metrics.jsonl")
    return os.path.getsize(path) if os.path.isfile(path) else 0


def checkpoints(workdir: str) -> tuple[list[int], list[str]]:
    """(complete steps, temporary folders) under WORKDIR/checkpoints."""
    directory = os.path.join(workdir, "checkpoints")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(int(n) for n in names if n.isdigit()), sorted(n for n in names if TMP_MARK in n)


def wait_first_step(proc, workdir, offset: int, deadline: float) -> bool:
    """Waits until the launch logs a step (metrics.jsonl grows past `offset`)."""
    while time.time() < deadline and proc.poll() is None:
        if logged(workdir, offset):
            return True
        time.sleep(0.01)
    return False


def start_step(log_text: str) -> Optional[int]:
    """The step a launch started training from ("... steps S -> N ..."), None if it was
    killed before that line (while starting up or restoring)."""
    m = re.search(r"; steps (\d+) -> \d+;", log_text)
    return int(m.group(1)) if m else None
