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
from tests.conftest import load_script

if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu is not installed (pip install -c constraints.txt -e '.[test]' brings "
                "it on x86-64 Linux): no TPU compiler to compile for a TPU topology",
                allow_module_level=True)

compiled_step = load_script("benchmarks/compiled_step.py")

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


@pytest.mark.slow  # three compiles of a 4-layer tiny step for the v5e topology
def test_tpu_estimate_counts_every_layer_of_the_loop(tpu_devices):
    """step_hlo's TPU estimate: XLA's cost analysis counts the rolled layer loop's body
    once; the correction from a second compile (two layers a trip) gives the FLOPs of the
    same step compiled with every layer unrolled, and the audit's trip counts (no
    known_trip_count on TPU: the condition's constant) find as many attention products in
    the rolled program as in the unrolled one. The report's lines end in the estimate."""
    from benchmarks import step_hlo, tpu_roofline

    seq, layers, compiles = 256, 4, {}  # hidden 128: no other array has two dims of 256

    def compiled(unroll):
        if unroll not in compiles:
            config = load_config("configs/bert_tiny.py", {
                **OVERRIDES, "model.num_hidden_layers": layers, "model.scan_layers": True,
                "model.attention": "xla"})
            with config.unlocked():
                config.model.scan_unroll = unroll
            lowered, mcfg = compiled_step.lower_step(config, 8, seq, 39, tpu_devices,
                                                     config_mesh=True)
            compiles[unroll] = lowered.compile(), mcfg
        return compiles[unroll]

    rolled, mcfg = compiled(1)
    assert mcfg.unroll_for("tpu") == 1
    cost, how = tpu_roofline.step_cost(rolled, mcfg, lambda u: compiled(u)[0])
    assert f"counted {layers} times" in how
    flat = compiled(0)[0]
    unrolled = tpu_roofline.xla_cost(flat)
    once = tpu_roofline.xla_cost(rolled)
    assert once["flops"] < 0.6 * unrolled["flops"]  # the body counted once: far too few
    assert cost["flops"] == pytest.approx(unrolled["flops"], rel=0.03)

    def products(text):
        return sum(k.count for k in tpu_roofline.square_kernels(step_hlo.audit(text), seq)
                   if k.kind == "gemm")

    text = rolled.as_text()
    n = products(text)
    assert n >= 6 * layers and n % layers == 0, n  # 2 forward, 4 backward at least
    assert n == products(flat.as_text())
    assert [t for _, t in step_hlo.while_loops(text)] == [layers, layers]
    lines = tpu_roofline.report(rolled, mcfg, tpu_devices, 2, seq, step_hlo.audit(text),
                                lambda u: compiled(u)[0], step_hlo.while_loops(text))
    assert lines[0].startswith("chip: TPU v5e, 1 device(s) per chip"), lines[0]
    assert f"loops: 2 over the layers ({layers}, {layers} trips)" in lines
    assert lines[-1].startswith("estimate: ") and "sequences/s per chip" in lines[-1], lines
