"""The training step compiles for a TPU slice, on a machine without one: the tiny config's
real step (bert_jax.train.step, lowered by benchmarks/compiled_step.py as step_memory.py
does) for the devices of a v5e 2x2 topology description and compiled by libtpu, once per
TPU attention path, so that a change that breaks TPU lowering (a sharding the TPU
partitioner refuses, a Pallas kernel Mosaic cannot compile) fails here. Needs the `libtpu` wheel (the [test] extra installs it on
x86-64 Linux); skipped without it."""

from __future__ import annotations

import importlib.util
import os

import pytest

from bert_jax.train.config import load_config
from tests.conftest import REPO

if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu is not installed (pip install -c constraints.txt -e '.[test]' brings "
                "it on x86-64 Linux): no TPU compiler to compile for a TPU topology",
                allow_module_level=True)

_SPEC = importlib.util.spec_from_file_location("compiled_step",
                                               REPO / "benchmarks/compiled_step.py")
compiled_step = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(compiled_step)

TOPOLOGY = "v5e:2x2"
# configs/bert_tiny.py cut to one layer and a 512-token vocabulary (compile time), on a
# 2 x 2 data x fsdp mesh so that both the batch split and the parameter sharding lower.
OVERRIDES = {"model.vocab_size": 512, "model.num_hidden_layers": 1,
             "model.dtype": "bfloat16", "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 1}


@pytest.fixture(scope="module")
def tpu_devices():
    # Off a TPU VM libtpu looks the first two up in the VM's metadata at load and logs
    # errors without them; their values do not change the topology compiled for. The third
    # lets libtpu load while another process (a benchmark, a parallel test run) holds it:
    # compiling touches no TPU.
    with pytest.MonkeyPatch.context() as mp:
        for name, value in (("TPU_ACCELERATOR_TYPE", "v5litepod-4"),
                            ("TPU_WORKER_HOSTNAMES", "localhost"),
                            ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
            if name not in os.environ:
                mp.setenv(name, value)
        devices = compiled_step.tpu_target_devices(TOPOLOGY)
    assert len(devices) == 4 and all(d.platform == "tpu" for d in devices)
    return devices


@pytest.mark.parametrize("attention, overrides", [
    ("xla", {}),
    # splash attention: no attention-probability dropout
    ("pallas", {"model.attention_probs_dropout_prob": 0.0}),
])
def test_training_step_compiles_for_a_tpu_slice(tpu_devices, attention, overrides):
    config = load_config("configs/bert_tiny.py",
                         {**OVERRIDES, "model.attention": attention, **overrides})
    lowered, mcfg = compiled_step.lower_step(config, 8, 128, 20, tpu_devices, config_mesh=True)
    assert mcfg.attention == attention
    text = lowered.as_text()
    # The Mosaic (Pallas TPU) kernel is in the program only on the splash path.
    assert ("tpu_custom_call" in text) == (attention == "pallas"), attention
    compiled = lowered.compile()
    assert "TPU" in tpu_devices[0].device_kind
    stats = compiled.memory_analysis()
    assert stats.temp_size_in_bytes > 0 and stats.argument_size_in_bytes > 0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    assert cost["flops"] > 0
