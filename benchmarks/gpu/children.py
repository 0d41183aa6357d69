"""Every measurement (and the header's version probe and the kernel check) runs in its own
child process: benchmarks/gpu_suite.py again, with a hidden --child=JSON flag, answering one
RESULT_PREFIX + JSON line on stdout. So JAX's and torch's device memory never coexist, and an
out-of-memory or a crash fills one cell with its one-line error while the suite goes on.

The parent's side: child_env (JAX children run with XLA_PYTHON_CLIENT_MEM_FRACTION=0.95,
torch children see JAX_PLATFORMS=cpu: they read the config files only) and spawn (runs one
child under a timeout, logs the tail of its stderr). The child's side: run_child, which
dispatches the spec's "kind" to child_info here, jax_child, torch_child or kernel_check."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback

from .common import REPO, RESULT_PREFIX, SCRIPT, exc_line, one_line

VERSIONED = ("jax", "jaxlib", "flax", "optax", "orbax.checkpoint", "torch", "transformers",
             "ml_collections", "numpy")


# -- the child's side --------------------------------------------------------------------

def run_child(spec: dict) -> None:
    """Runs the child of `spec["kind"]` and prints its result line (with its one-line error
    when it raised, and the TensorFlow modules it loaded). spec["t0"] is the child's start,
    before it imports jax or torch: the children time their first step from it."""
    spec["t0"] = time.perf_counter()
    from . import jax_child, kernel_check, torch_child

    fn = {"info": child_info, "jax": jax_child.run, "torch": torch_child.run,
          "check": kernel_check.run}[spec["kind"]]
    result: dict = {}
    try:
        fn(spec, result)
    except BaseException as e:  # noqa: BLE001 - one line back to the parent
        traceback.print_exc()
        result["error"] = exc_line(e)
    result["tensorflow_modules"] = tf_modules()
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def tf_modules() -> list:
    return sorted(m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow."))[:5]


def child_info(spec: dict, info: dict) -> dict:
    """The header's facts: versions, the device JAX and torch see, CUDA libraries, the MFU
    peak, nvidia-smi's line per GPU."""
    import importlib

    info.update(python=platform.python_version(), host=platform.node())
    for name in VERSIONED:
        try:
            info[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as e:  # noqa: BLE001 - reported in the header
            info[name] = f"unavailable ({exc_line(e)})"
    _jax_device(info)
    _torch_device(spec, info)
    _nvidia_smi(info)
    return info


def _jax_device(info: dict) -> None:
    try:
        import jax

        dev = jax.devices()[0]
        info.update(platform=dev.platform, device_kind=dev.device_kind,
                    device_count=jax.device_count())
        if dev.platform == "gpu":
            for key in ("cuda_runtime_get_version", "cuda_driver_get_version",
                        "cudnn_get_version", "cublas_get_version"):
                try:
                    from jax._src.lib import cuda_versions as cv
                    info["jax_" + key.replace("_get_version", "")] = getattr(cv, key)()
                except Exception as e:  # noqa: BLE001
                    info["jax_" + key.replace("_get_version", "")] = exc_line(e)
        from bert_jax.train import metrics

        if dev.platform != "cpu":
            info["peak_flops"], info["peak_source"] = metrics.peak_flops_per_device()
    except Exception as e:  # noqa: BLE001
        info["jax_error"] = exc_line(e)


def _torch_device(spec: dict, info: dict) -> None:
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["torch_cudnn"] = torch.backends.cudnn.version() if torch.cuda.is_available() else None
        if torch.cuda.is_available() and not spec.get("smoke"):
            info["torch_device"] = torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001
        info["torch_error"] = exc_line(e)


def _nvidia_smi(info: dict) -> None:
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                              "clocks.max.sm,power.limit", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if smi.returncode == 0:
            info["nvidia_smi"] = smi.stdout.strip().splitlines()
    except Exception:  # noqa: BLE001 - no nvidia-smi (CPU machine)
        pass


# -- the parent's side -------------------------------------------------------------------

def child_env(kind: str, smoke: bool, xla_flags: str = "") -> dict:
    env = dict(os.environ)
    if xla_flags:  # a variant's XLA flags, after the suite's own (the later flag wins)
        env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS", ""), xla_flags]))
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if smoke:
        env.setdefault("JAX_PLATFORMS", "cpu")
    if kind == "jax":
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    elif kind == "torch":
        env["JAX_PLATFORMS"] = "cpu"  # torch children read the config files only
    else:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def spawn(spec: dict, timeout: float, report) -> dict:
    """Runs one child; returns its result with wall_s, or {"error": ...} when it printed no
    result line (a crash, a timeout). Its stderr's tail goes to report.log."""
    cmd = [sys.executable, SCRIPT, "--child", json.dumps(spec)]
    t = time.perf_counter()
    # In this process group: whatever ends the suite's group ends the child too, so no
    # orphan keeps the device's memory.
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(spec["kind"], spec.get("smoke"),
                                                          spec.get("xla_flags", "")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        rc = None
    wall = time.perf_counter() - t
    result = _result_line(stdout, stderr, rc, timeout)
    result["wall_s"] = wall
    tail = stderr.splitlines()[-80:]
    report.log.write(f"=== {shlex.join(cmd[:3])} '{cmd[3]}'\n    rc={rc} wall={wall:.1f}s\n"
                     + "\n".join(ln[:400] for ln in tail) + "\n")
    report.log.flush()
    return result


def _result_line(stdout: str, stderr: str, rc, timeout: float) -> dict:
    result = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
    if result is not None:
        return result
    if rc is None:
        return {"error": f"timeout after {timeout:.0f} s (--child_timeout)"}
    tail = [ln for ln in stderr.splitlines() if ln.strip()]
    why = next((ln for ln in reversed(tail) if "Error" in ln or "error" in ln),
               tail[-1] if tail else "no output")
    return {"error": one_line(f"child exited {rc}: {why}")}
