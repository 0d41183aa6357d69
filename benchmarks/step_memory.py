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
(default bfloat16, the accelerator setting).
"""

from __future__ import annotations

import math
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _argv_target(argv) -> str:
    """The --target value in argv ("--target=x" or "--target x"), before flags are parsed."""
    for i, arg in enumerate(argv):
        if arg.startswith("--target="):
            return arg.split("=", 1)[1]
        if arg == "--target" and i + 1 < len(argv):
            return argv[i + 1]
    return ""


# libtpu reads these at start-up and, off a TPU VM, logs errors for each one it cannot find
# in the VM metadata; any single-host accelerator type of the generation quiets it (the
# compile target is the topology name, not this). libtpu also takes a lock file that makes
# a second process loading it abort; compiling touches no TPU, so several may run at once.
_TPU_ACCELERATOR_TYPES = {"v4": "v4-8", "v5e": "v5litepod-4", "v5p": "v5p-8", "v6e": "v6e-4"}

if _argv_target(sys.argv) == "h100":
    # A CUDA compile target on a CPU host: set before jax loads.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
elif _argv_target(sys.argv).startswith("tpu:"):
    # A TPU compile target on a host without one: set before jax (and libtpu) load.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    _gen = _argv_target(sys.argv)[len("tpu:"):].split(":", 1)[0]
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", _TPU_ACCELERATOR_TYPES.get(_gen, "v5litepod-4"))
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from bert_jax import optim  # noqa: E402
from bert_jax import sharding as sharding_lib  # noqa: E402
from bert_jax.data import device as data_device  # noqa: E402
from bert_jax.models import attention_ops  # noqa: E402
from bert_jax.tasks.pretraining import PretrainingTask  # noqa: E402
from bert_jax.train import config as config_lib  # noqa: E402
from bert_jax.train import state as state_lib  # noqa: E402
from bert_jax.train import step as step_lib  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS


def _define_flags() -> None:
    config_flags.DEFINE_config_file("config", None, "Run config (model section used).")
    flags.DEFINE_integer("batch", 8, "Global batch size.")
    flags.DEFINE_integer("seq", 128, "Sequence length.")
    flags.DEFINE_integer("predictions", None, "MLM slots per example (default: ceil(0.15 * "
                         "seq): 20 at 128 as BERT's data, 77 at 512; as gpu_suite.py).")
    flags.DEFINE_string("dtype", "bfloat16", "Compute dtype (params stay float32).")
    flags.DEFINE_string("target", "cpu", "What to compile for: cpu, h100, device, or "
                        "tpu:<topology> (e.g. tpu:v5e:2x2, tpu:v4:2x2x2: a TPU slice, on the "
                        "config's mesh).")
    flags.register_validator("target", lambda t: parse_target(t) is not None,
                             "expected cpu, h100, device or tpu:<topology>, e.g. tpu:v5e:2x2")
    flags.DEFINE_string("gpu_target_config",
                        os.path.join(os.path.dirname(_ROOT), "shared", "gpu", "h100_sxm.txtpb"),
                        "GPU target description (text proto) for --target=h100.")
    flags.DEFINE_bool("dropout", True, "Dropout on (as in training).")
    flags.mark_flags_as_required(["config"])


GIB = 2.0**30
MIB = 2.0**20


def gpu_target_devices(target_config_path: str):
    """The devices of a one-GPU compile-only topology described by a GPU target text proto
    (e.g. shared/gpu/h100_sxm.txtpb); needs jax's CUDA plugin wheels, not a GPU."""
    with open(target_config_path, encoding="utf-8") as f:
        target = f.read()
    try:
        topo = topologies.get_topology_desc(platform="cuda", topology_name="",
                                            target_config=target, topology="1x1x1")
    except Exception as e:  # noqa: BLE001 - the plugin's own error is the useful part
        raise SystemExit(
            f"cannot build a CUDA compile target from {target_config_path}: {e}\n"
            "install jax-cuda12-plugin and jax-cuda12-pjrt of the installed jax's version "
            "and run with JAX_PLATFORMS=cpu JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1") from None
    return list(topo.devices)


def parse_target(target: str):
    """(kind, topology) of a --target value: ("cpu" | "h100" | "device", None) or ("tpu",
    "v5e:2x2"); None when it is none of these."""
    if target in ("cpu", "h100", "device"):
        return target, None
    if target.startswith("tpu:") and target[len("tpu:"):]:
        return "tpu", target[len("tpu:"):]
    return None


def tpu_target_devices(topology_name: str):
    """The devices of a TPU slice described by its topology name (e.g. "v5e:2x2", "v4:2x2x2",
    multi-host ones included); needs libtpu (the `[tpu]` extra), not a TPU."""
    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=topology_name)
    except Exception as e:  # noqa: BLE001 - libtpu's own error is the useful part
        raise SystemExit(
            f"cannot build a TPU compile target for topology {topology_name!r}: {e}\n"
            "install libtpu of the version the installed jax pins (pip install "
            "'bert_jax[tpu]', or jax[tpu] of jax's version); topology names look like "
            "v5e:2x2, v4:2x2x1, v5p:2x2x1, v6e:2x2") from None
    return list(topo.devices)


def abstract_batch(batch: int, seq: int, preds: int, sharding) -> dict:
    """ShapeDtypeStructs of one pre-training batch (the original feature names)."""
    def s(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
    return dict(input_ids=s((batch, seq), jnp.int32), input_mask=s((batch, seq), jnp.int32),
                segment_ids=s((batch, seq), jnp.int32),
                masked_lm_positions=s((batch, preds), jnp.int32),
                masked_lm_ids=s((batch, preds), jnp.int32),
                masked_lm_weights=s((batch, preds), jnp.float32),
                next_sentence_labels=s((batch, 1), jnp.int32))


def lower_step(config, batch: int, seq: int, preds: int, devices, *, dropout: bool = True,
               config_mesh: bool = False):
    """(lowered step, model config): the trainer's jitted step (bert_jax.train.step)
    lowered on abstract state and batch, on a one-axis data-parallel mesh over `devices`, or
    with `config_mesh` on the config's own `mesh` section (as the trainer builds it)."""
    with config.unlocked():
        if "optimizer" not in config:
            config_lib.add_training_sections(config)
        if not config_mesh:
            config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
    mesh = sharding_lib.make_mesh(config.mesh, devices)
    rules = sharding_lib.rules_from_config(config.mesh)
    task = PretrainingTask(config, "")
    tx = optim.make_optimizer(config.optimizer, config.schedule, 1_000_000)
    schedule = optim.make_schedule(config.schedule, 1_000_000)
    abstract, shardings = state_lib.state_shardings(task.model, tx, mesh, rules,
                                                    state_lib.dummy_inputs(seq, preds))
    bsh = data_device.batch_sharding(mesh, rules)
    fn = step_lib.jit_train_step(task, tx, schedule, shardings, bsh, rules,
                                 deterministic=not dropout,
                                 keep_state_on_nonfinite=bool(config.train.skip_nonfinite))
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                               sharding=sharding_lib.replicated(mesh))
    return fn.lower(abstract, abstract_batch(batch, seq, preds, bsh), rng), task.model_config


def analyze(config, batch: int, seq: int, preds: int, devices, *, dropout: bool = True,
            config_mesh: bool = False) -> dict:
    """Compiles the step and returns its memory figures in bytes (per device): argument,
    output, alias, temp, peak (argument + output - alias + temp), plus model (the
    BertConfig), attention (the implementation the model resolves to on these devices),
    device, mesh (axis sizes), compile_s, and flops / bytes_accessed per device from XLA's
    cost analysis (None where the backend gives none)."""
    lowered, mcfg = lower_step(config, batch, seq, preds, devices, dropout=dropout,
                               config_mesh=config_mesh)
    t = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t
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
               attention=attention_ops.resolve(mcfg.attention, devices[0].platform,
                                               mcfg, training=dropout))
    return out


def main(argv):
    del argv
    devices = None
    kind, topology = parse_target(FLAGS.target)
    if kind == "tpu":
        devices = tpu_target_devices(topology)
    elif kind == "h100":
        devices = gpu_target_devices(FLAGS.gpu_target_config)
    elif kind == "cpu":
        devices = jax.devices("cpu")[:1]
    else:
        devices = jax.devices()[:1]
    config = FLAGS.config
    with config.unlocked():
        config.model.dtype = FLAGS.dtype
    preds = FLAGS.predictions or max(1, math.ceil(0.15 * FLAGS.seq - 1e-9))
    report = analyze(config, FLAGS.batch, FLAGS.seq, preds, devices=devices,
                     dropout=FLAGS.dropout, config_mesh=kind == "tpu")
    m = report["model"]
    print(f"model: L={m.num_hidden_layers} H={m.hidden_size} A={m.num_attention_heads} "
          f"dtype {m.dtype}, remat {m.remat}, attention {report['attention']}, "
          f"scan_layers {m.scan_layers}")
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
    _define_flags()
    app.run(main)
