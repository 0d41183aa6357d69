"""model.dtype=auto (every config's default) on the trainer's real step: the GEMMs compute in
bfloat16 when the step compiles for a TPU slice (a v5e 2x2 topology description, libtpu) or
an H100 (the CUDA compile target, jax's CUDA plugin wheels), and in float32 on CPU. The
step is lowered as benchmarks/compiled_step.py lowers it for step_memory.py / step_hlo.py;
the dtype is resolved while tracing, from the mesh's devices (bert_jax.models.kernels.backend)."""

from __future__ import annotations

import collections
import importlib.util
import os
import re
import subprocess
import sys

import jax
import pytest

from bert_jax.models.config import BertConfig
from bert_jax.models.kernels.backend import platform_name
from bert_jax.train.config import load_config
from tests.conftest import REPO, load_script

compiled_step = load_script("benchmarks/compiled_step.py")

# configs/bert_tiny.py, one layer and a 512-token vocabulary: lowering time.
OVERRIDES = {"model.vocab_size": 512, "model.num_hidden_layers": 1}
_DOT = re.compile(r"stablehlo\.dot_general .*?: \(tensor<[0-9x]*(\w+)>, tensor<[0-9x]*(\w+)>\)")


def dot_operand_dtypes(lowered) -> collections.Counter:
    """Counter of (lhs, rhs) element types over the lowered step's dot_generals."""
    return collections.Counter(_DOT.findall(lowered.as_text()))


def lowered_tiny_step(devices, **overrides):
    config = load_config("configs/bert_tiny.py", {**OVERRIDES, **overrides})
    if "model.dtype" not in overrides:
        assert config.model.dtype == "auto"  # the config's default, not set here
    return compiled_step.lower_step(config, 4, 32, 5, devices, config_mesh=True)


def test_platform_names_resolve():
    """The names jax gives a device's platform, through backend.platform_name."""
    auto = BertConfig()
    resolved = {name: auto.dtype_for(platform_name(name))
                for name in ("cuda", "rocm", "gpu", "tpu", "cpu")}
    assert resolved == {"cuda": "bfloat16", "rocm": "bfloat16", "gpu": "bfloat16",
                        "tpu": "bfloat16", "cpu": "float32"}


def test_auto_is_float32_on_cpu():
    lowered, mcfg = lowered_tiny_step(jax.devices("cpu")[:1])
    dots = dot_operand_dtypes(lowered)
    assert mcfg.dtype == "auto" and sum(dots.values()) >= 12, dots
    assert set(dots) == {("f32", "f32")}, dots
    # a named dtype still wins
    lowered, _ = lowered_tiny_step(jax.devices("cpu")[:1], **{"model.dtype": "bfloat16"})
    assert ("bf16", "bf16") in dot_operand_dtypes(lowered)


def test_auto_is_bfloat16_for_a_tpu_slice():
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (the [test] extra brings it on x86-64 Linux)")
    with pytest.MonkeyPatch.context() as mp:  # as tests/test_tpu_compile.py
        for name, value in (("TPU_ACCELERATOR_TYPE", "v5litepod-4"),
                            ("TPU_WORKER_HOSTNAMES", "localhost"),
                            ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
            if name not in os.environ:
                mp.setenv(name, value)
        devices = compiled_step.tpu_target_devices("v5e:2x2")
    lowered, _ = lowered_tiny_step(devices, **{"mesh.data": 2, "mesh.fsdp": 2})
    dots = dot_operand_dtypes(lowered)
    # Every product of the encoder and the heads, forward and backward, in bfloat16 (Q, K,
    # V, attention scores and context, output projection, FFN in and out, pooler, MLM
    # transform and decoder, NSP: 36 dot_generals in this one-layer step).
    assert set(dots) == {("bf16", "bf16")} and sum(dots.values()) >= 24, dots


def test_auto_is_bfloat16_for_an_h100_target():
    """benchmarks/step_hlo.py's audit of the tiny step for the H100 description: its model
    line and its GEMMs. Needs jax's CUDA plugin wheels (jax-cuda12-plugin and -pjrt of
    jax's version, not a GPU), which the [test] extra does not install: skipped without."""
    if importlib.util.find_spec("jax_cuda12_plugin") is None:
        pytest.skip("jax's CUDA plugin wheels are not installed: no CUDA compile target")
    if not os.path.exists(compiled_step.DEFAULT_GPU_TARGET):
        pytest.skip(f"no GPU target description at {compiled_step.DEFAULT_GPU_TARGET}")
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/step_hlo.py"), "--config=configs/bert_tiny.py",
         "--config.model.num_hidden_layers=1", "--batch=2", "--seq=32", "--target=h100"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "compute bfloat16 (model.dtype=auto)" in out.stdout, out.stdout
    gemms = out.stdout.split("GEMMs by dtype")[1].split("total:")[0]
    assert "bf16 x bf16" in gemms and "f32 x f32" not in gemms, gemms
