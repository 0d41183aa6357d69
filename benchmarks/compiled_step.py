r"""The trainer's pre-training step compiled on abstract inputs, for CPU or a GPU compile
target on a machine without a GPU: what benchmarks/step_memory.py and step_hlo.py share
(their flags, target devices and the lowering). Not a script.

Import it before jax: with `--target=h100` on the command line it sets JAX_PLATFORMS=cpu and
JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 (unless already set), which a CUDA compile target on a CPU
host needs before jax loads.
"""

from __future__ import annotations

import math
import os
import sys
import time

if "--target=h100" in sys.argv or "--target h100" in " ".join(sys.argv):
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_GPU_TARGET = os.path.join(os.path.dirname(_ROOT), "shared", "gpu", "h100_sxm.txtpb")


def define_step_flags() -> None:
    """The absl flags both scripts take: --config (required), --batch, --seq, --predictions,
    --dtype, --target, --gpu_target_config, --dropout."""
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Run config (model section used).")
    flags.DEFINE_integer("batch", 8, "Global batch size.")
    flags.DEFINE_integer("seq", 128, "Sequence length.")
    flags.DEFINE_integer("predictions", None, "MLM slots per example (default: ceil(0.15 * "
                         "seq): 20 at 128 as BERT's data, 77 at 512; as gpu_suite.py).")
    flags.DEFINE_string("dtype", "bfloat16", "Compute dtype (params stay float32).")
    flags.DEFINE_enum("target", "cpu", ["cpu", "h100", "device"], "What to compile for.")
    flags.DEFINE_string("gpu_target_config", DEFAULT_GPU_TARGET,
                        "GPU target description (text proto) for --target=h100.")
    flags.DEFINE_bool("dropout", True, "Dropout on (as in training).")
    flags.mark_flags_as_required(["config"])


def predictions_for(seq: int, predictions: int | None) -> int:
    """MLM slots per example: `predictions`, else ceil(0.15 * seq)."""
    return predictions or max(1, math.ceil(0.15 * seq - 1e-9))


def gpu_target_devices(target_config_path: str):
    """The devices of a one-GPU compile-only topology described by a GPU target text proto
    (e.g. shared/gpu/h100_sxm.txtpb); needs jax's CUDA plugin wheels, not a GPU."""
    from jax.experimental import topologies

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


def target_devices(target: str, gpu_target_config: str = DEFAULT_GPU_TARGET):
    """One device to compile for: "h100" (a compile-only GPU target), "cpu" (the host) or
    "device" (the first local device)."""
    if target == "h100":
        return gpu_target_devices(gpu_target_config)
    if target == "cpu":
        return jax.devices("cpu")[:1]
    return jax.devices()[:1]


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
    from bert_jax import optim
    from bert_jax import sharding as sharding_lib
    from bert_jax.data import device as data_device
    from bert_jax.tasks.pretraining import PretrainingTask
    from bert_jax.train import config as config_lib
    from bert_jax.train import state as state_lib
    from bert_jax.train import step as step_lib

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


def compile_step(config, batch: int, seq: int, preds: int, devices, *, dropout: bool = True):
    """(compiled step, model config, compile seconds) of lower_step's step."""
    lowered, mcfg = lower_step(config, batch, seq, preds, devices, dropout=dropout)
    t = time.perf_counter()
    compiled = lowered.compile()
    return compiled, mcfg, time.perf_counter() - t


def attention_path(mcfg, devices, *, dropout: bool = True) -> str:
    """The attention implementation the model resolves to on these devices."""
    from bert_jax.models import attention_ops

    return attention_ops.resolve(mcfg.attention, devices[0].platform, mcfg, training=dropout)


def describe(mcfg, attention: str) -> str:
    """The model line both scripts print first."""
    return (f"model: L={mcfg.num_hidden_layers} H={mcfg.hidden_size} "
            f"A={mcfg.num_attention_heads} dtype {mcfg.dtype}, remat {mcfg.remat}, "
            f"attention {attention}, scan_layers {mcfg.scan_layers}")
