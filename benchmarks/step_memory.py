r"""What the compiled pre-training step holds in device memory, on any machine.

    python benchmarks/step_memory.py --config=configs/bert_large.py --batch=256 --seq=128 --target=h100
    python benchmarks/step_memory.py --config=configs/bert_tiny.py --batch=8 --seq=128 --target=cpu
    python benchmarks/step_memory.py --config=configs/bert_large.py --batch=256 --seq=512 --target=tpu:v4:2x2x2

Lowers the trainer's own step (bert_jax.train.step, MLM + NSP, AdamW, dropout on, one
device) on abstract inputs (`jax.ShapeDtypeStruct`: nothing is allocated), compiles it and
prints `memory_analysis()`: the arguments (params, optimizer state, batch), the outputs, the
temporaries (activations kept for the backward pass, gradients, workspace) and the temp
bytes per example per layer. The last line is the temp figure in GiB.

--target=h100 compiles for an NVIDIA H100 SXM on a machine without a GPU: it needs the
`jax-cuda12-plugin` and `jax-cuda12-pjrt` wheels matching the installed jax (not a
dependency of bert_jax) and reads the device description from --gpu_target_config
(default ../shared/gpu/h100_sxm.txtpb beside the repo). On a machine with a GPU,
--target=device compiles for the local device. --target=cpu uses the host.

--target=tpu:<topology> (e.g. tpu:v5e:2x2, tpu:v4:2x2x2, multi-host slices such as tpu:v5e:4x4)
compiles for every chip of a TPU slice on a machine without one: it needs `libtpu` of the
version jax pins (the `[tpu]` extra) and takes the devices from
`jax.experimental.topologies.get_topology_desc`. Unlike the one-device targets, the step runs
on the config's own mesh (FSDP for configs/bert_large.py, data parallel for bert_base.py), so
the figures are per device, and XLA's cost analysis (FLOPs, bytes accessed) is printed too.

The model section's remat policy, attention implementation and dtype come from the config
and can be overridden as usual (`--config.model.remat=...`); --dtype sets model.dtype
(default: the config's, auto: bfloat16 for a GPU or TPU target, float32 for cpu).
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Before jax: sets the environment a GPU or TPU compile target on a CPU host needs.
from benchmarks import compiled_step  # noqa: E402

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS

GIB = 2.0**30
MIB = 2.0**20


def analyze(config, batch: int, seq: int, preds: int, devices, *, dropout: bool = True,
            config_mesh: bool = False) -> dict:
    """Compiles the step and returns its memory figures in bytes (per device): argument,
    output, alias, temp, peak (argument + output - alias + temp), plus model (the
    BertConfig), attention (the implementation the model resolves to on these devices),
    device, mesh (axis sizes), compile_s, and flops / bytes_accessed per device from XLA's
    cost analysis (None where the backend gives none)."""
    from bert_jax import sharding as sharding_lib

    compiled, mcfg, compile_s = compiled_step.compile_step(
        config, batch, seq, preds, devices, dropout=dropout, config_mesh=config_mesh)
    stats = compiled.memory_analysis()
    out = dict(argument=stats.argument_size_in_bytes, output=stats.output_size_in_bytes,
               alias=stats.alias_size_in_bytes, temp=stats.temp_size_in_bytes)
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    try:
        cost = compiled.cost_analysis() or {}
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    except Exception:  # noqa: BLE001 - some compile targets have no cost model
        cost = {}
    out.update(flops=cost.get("flops"), bytes_accessed=cost.get("bytes accessed"))
    out.update(model=mcfg, device=devices[0].device_kind, compile_s=compile_s,
               mesh=dict(zip(sharding_lib.MESH_AXES,
                             sharding_lib.mesh_shape(config.mesh, len(devices)))),
               attention=compiled_step.attention_path(mcfg, devices, dropout=dropout))
    return out


def main(argv):
    del argv
    kind, topology = compiled_step.parse_target(FLAGS.target)
    config, devices, preds = compiled_step.from_flags(FLAGS)
    report = analyze(config, FLAGS.batch, FLAGS.seq, preds, devices=devices,
                     dropout=FLAGS.dropout, config_mesh=kind == "tpu")
    m = report["model"]
    print(compiled_step.describe(m, report["attention"], devices))
    print(f"step: batch {FLAGS.batch} x {FLAGS.seq}, {preds} MLM slots, dropout "
          f"{'on' if FLAGS.dropout else 'off'}; compiled for {report['device']} "
          f"in {report['compile_s']:.1f} s")
    if kind == "tpu":
        print(f"mesh: {report['mesh']} over {len(devices)} {report['device']} devices "
              f"({topology}); the figures below are per device")
        if report["flops"] is not None:
            print(f"cost analysis per device: {report['flops'] / 1e12:.2f} TFLOP, "
                  f"{report['bytes_accessed'] / 1e9:.1f} GB accessed"
                  + (" (XLA counts a loop body once: one scanned layer, not all)"
                     if m.scan_layers else ""))
    for key in ("argument", "output", "alias"):
        print(f"{key}: {report[key] / GIB:.3f} GiB")
    per_device_batch = FLAGS.batch / (report["mesh"]["data"] * report["mesh"]["fsdp"])
    per = report["temp"] / (per_device_batch * m.num_hidden_layers)
    print(f"temp per example per layer: {per / MIB:.3f} MiB")
    print(f"peak estimate (argument + output - alias + temp): {report['peak'] / GIB:.3f} GiB")
    print(f"temp: {report['temp'] / GIB:.3f} GiB")


if __name__ == "__main__":
    compiled_step.define_step_flags()
    app.run(main)
