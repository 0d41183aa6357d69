r"""What the compiled pre-training step holds in device memory, on any machine.

    python benchmarks/step_memory.py --config=configs/bert_large.py --batch=256 --seq=128 --target=h100
    python benchmarks/step_memory.py --config=configs/bert_tiny.py --batch=8 --seq=128 --target=cpu

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

if "--target=h100" in sys.argv or "--target h100" in " ".join(sys.argv):
    # A CUDA compile target on a CPU host: set before jax loads.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

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
    flags.DEFINE_enum("target", "cpu", ["cpu", "h100", "device"], "What to compile for.")
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


def lower_step(config, batch: int, seq: int, preds: int, devices, *, dropout: bool = True):
    """(lowered step, model config): the trainer's jitted step (bert_jax.train.step) on a
    one-axis data-parallel mesh over `devices`, lowered on abstract state and batch."""
    with config.unlocked():
        if "optimizer" not in config:
            config_lib.add_training_sections(config)
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


def analyze(config, batch: int, seq: int, preds: int, devices, *, dropout: bool = True) -> dict:
    """Compiles the step and returns its memory figures in bytes: argument, output, alias,
    temp, peak (argument + output - alias + temp), plus model (the BertConfig), attention
    (the implementation the model resolves to on these devices), device and compile_s."""
    lowered, mcfg = lower_step(config, batch, seq, preds, devices, dropout=dropout)
    t = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t
    stats = compiled.memory_analysis()
    out = dict(argument=stats.argument_size_in_bytes, output=stats.output_size_in_bytes,
               alias=stats.alias_size_in_bytes, temp=stats.temp_size_in_bytes)
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    out.update(model=mcfg, device=devices[0].device_kind, compile_s=compile_s,
               attention=attention_ops.resolve(mcfg.attention, devices[0].platform,
                                               mcfg, training=dropout))
    return out


def main(argv):
    del argv
    devices = None
    if FLAGS.target == "h100":
        devices = gpu_target_devices(FLAGS.gpu_target_config)
    elif FLAGS.target == "cpu":
        devices = jax.devices("cpu")[:1]
    else:
        devices = jax.devices()[:1]
    config = FLAGS.config
    with config.unlocked():
        config.model.dtype = FLAGS.dtype
    preds = FLAGS.predictions or max(1, math.ceil(0.15 * FLAGS.seq - 1e-9))
    report = analyze(config, FLAGS.batch, FLAGS.seq, preds, devices=devices,
                                 dropout=FLAGS.dropout)
    m = report["model"]
    print(f"model: L={m.num_hidden_layers} H={m.hidden_size} A={m.num_attention_heads} "
          f"dtype {m.dtype}, remat {m.remat}, attention {report['attention']}, "
          f"scan_layers {m.scan_layers}")
    print(f"step: batch {FLAGS.batch} x {FLAGS.seq}, {preds} MLM slots, dropout "
          f"{'on' if FLAGS.dropout else 'off'}; compiled for {report['device']} "
          f"in {report['compile_s']:.1f} s")
    for key in ("argument", "output", "alias"):
        print(f"{key}: {report[key] / GIB:.3f} GiB")
    per = report["temp"] / (FLAGS.batch * m.num_hidden_layers)
    print(f"temp per example per layer: {per / MIB:.3f} MiB")
    print(f"peak estimate (argument + output - alias + temp): {report['peak'] / GIB:.3f} GiB")
    print(f"temp: {report['temp'] / GIB:.3f} GiB")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
