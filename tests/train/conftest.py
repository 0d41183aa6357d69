"""Fixtures of the training tests: the 1-device reference losses, and a runner for
subprocesses (multi-device simulation, multi-process, launch/train.py)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def read_losses(workdir) -> dict[int, float]:
    out = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "train/loss" in r:
                out[r["step"]] = r["train/loss"]
    return out


@pytest.fixture(scope="session")
def reference_losses(tmp_path_factory) -> list[float]:
    """Losses of 5 steps of the tiny config on this process's single CPU device."""
    from bert_jax.tasks import pretraining
    from tests.train.common import memory_data, tiny_config

    workdir = tmp_path_factory.mktemp("reference")
    config = tiny_config(steps=5)
    config.train.tensorboard = False
    pretraining.run(config, str(workdir), make_train_data=memory_data,
               make_eval_data=lambda c, w: None)
    losses = read_losses(workdir)
    return [losses[i] for i in range(1, 6)]


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> str:
    """A persistent XLA compilation cache shared by the subprocesses of one session:
    a relaunched run reuses the compiled step (same program, same numerics)."""
    return str(tmp_path_factory.mktemp("jax_cache"))


def subprocess_env(devices: int = 1, cache: str | None = None) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["JAX_PLATFORMS"] = "cpu"
    if cache:
        env["JAX_COMPILATION_CACHE_DIR"] = cache
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    return env


def run(args, *, devices: int = 1, cache: str | None = None, timeout: int = 600,
        check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *map(str, args)], cwd=REPO, capture_output=True,
                            text=True, env=subprocess_env(devices, cache), timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}:\n{result.stderr[-6000:]}")
    return result
