r"""The trainer's pre-training step compiled on abstract inputs, for CPU, or a GPU or TPU
compile target on a machine without one: what benchmarks/step_memory.py and step_hlo.py share
(their flags, target devices and the lowering). Not a script.

Import it before jax: with `--target=h100` on the command line it sets JAX_PLATFORMS=cpu and
JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 (unless already set), which a CUDA compile target on a CPU
host needs before jax loads; with `--target=tpu:<topology>` JAX_PLATFORMS=cpu and libtpu's
start-up variables.
"""

from __future__ import annotations

import math
import os
import sys
import time



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
    flags.DEFINE_integer("predictions", None, "MLM slots per example (default: ceil(p * seq) "
                         "with the config's data.masked_lm_prob p, else 0.15: 20 at 128 as "
                         "BERT's data, 77 at 512; as gpu_suite.py).")
    flags.DEFINE_string("dtype", None, "Compute dtype (params stay float32); default: the "
                        "config's model.dtype (auto: bfloat16 for a GPU or TPU target, "
                        "float32 for cpu).")
    flags.DEFINE_string("target", "cpu", "What to compile for: cpu, h100, device, or "
                        "tpu:<topology> (e.g. tpu:v5e:2x2, tpu:v4:2x2x2: a TPU slice, on the "
                        "config's mesh).")
    flags.register_validator("target", lambda t: parse_target(t) is not None,
                             "expected cpu, h100, device or tpu:<topology>, e.g. tpu:v5e:2x2")
    flags.DEFINE_string("gpu_target_config", DEFAULT_GPU_TARGET,
                        "GPU target description (text proto) for --target=h100.")
    # Without --target=h100 the description would be ignored and the step compiled for
    # another target (the CPU by default) under the GPU's name in the caller's mind.
    flags.register_multi_flags_validator(
        ["target", "gpu_target_config"],
        lambda f: f["target"] == "h100" or f["gpu_target_config"] == DEFAULT_GPU_TARGET,
        "--gpu_target_config describes a GPU to compile for: add --target=h100 (the "
        "default target is cpu)")
    flags.DEFINE_bool("dropout", True, "Dropout on (as in training).")
    flags.mark_flags_as_required(["config"])


def from_flags(flags):
    """(config, devices, MLM slots) of the flags define_step_flags defines: the run config
    with model.dtype set to --dtype (when given), the --target's devices, and --predictions
    or the config's masking rate times --seq."""
    devices = target_devices(flags.target, flags.gpu_target_config)
    config = flags.config
    if flags.dtype:
        with config.unlocked():
            config.model.dtype = flags.dtype
    rate = config.data.get("masked_lm_prob", 0.15) if "data" in config else 0.15
    return config, devices, predictions_for(flags.seq, flags.predictions, rate)


def predictions_for(seq: int, predictions: int | None, masked_lm_prob: float = 0.15) -> int:
    """MLM slots per example: `predictions`, else ceil(masked_lm_prob * seq) (the config's
    data.masked_lm_prob: 0.15 for BERT, 0.3 for the ModernBERT configs)."""
    return predictions or max(1, math.ceil(masked_lm_prob * seq - 1e-9))


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
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=topology_name)
    except Exception as e:  # noqa: BLE001 - libtpu's own error is the useful part
        raise SystemExit(
            f"cannot build a TPU compile target for topology {topology_name!r}: {e}\n"
            "install libtpu of the version the installed jax pins (pip install "
            "'bert_jax[tpu]', or jax[tpu] of jax's version); topology names look like "
            "v5e:2x2, v4:2x2x1, v5p:2x2x1, v6e:2x2") from None
    return list(topo.devices)


def target_devices(target: str, gpu_target_config: str = DEFAULT_GPU_TARGET):
    """The devices to compile for: "h100" (a compile-only GPU target), "tpu:<topology>"
    (every device of a compile-only TPU slice), "cpu" (the host) or "device" (the first
    local device)."""
    kind, topology = parse_target(target)
    if kind == "tpu":
        return tpu_target_devices(topology)
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


def lower_step(config, batch: int, seq: int, preds: int, devices, *, dropout: bool = True,
               config_mesh: bool = False):
    """(lowered step, model config): the trainer's jitted step (bert_jax.train.step)
    lowered on abstract state and batch, on a one-axis data-parallel mesh over `devices`, or
    with `config_mesh` on the config's own `mesh` section (as the trainer builds it)."""
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
        if not config_mesh:
            config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
        if (devices[0].platform == "gpu" and config.model.attention == "auto"
                and not cudnn_loadable()):
            # jax asks the cuDNN library for its version while tracing a cuDNN call, so a
            # GPU target on a host without it cannot hold one: the Pallas kernel stands in
            # (same O(length) memory; on a GPU, auto takes cuDNN for dropout-free global
            # layers).
            print("cuDNN is not loadable here: compiling with model.attention=pallas "
                  "instead of auto")
            config.model.attention = "pallas"
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


def cudnn_loadable() -> bool:
    """Whether jax finds the cuDNN library (a GPU host; not a CPU host compiling for one)."""
    try:
        from jax._src.lib import cuda_versions
        return cuda_versions is not None and cuda_versions.cudnn_get_version() > 0
    except Exception:  # no CUDA plugin, or the plugin without its libraries
        return False


def compile_step(config, batch: int, seq: int, preds: int, devices, *, dropout: bool = True,
                 config_mesh: bool = False):
    """(compiled step, model config, compile seconds) of lower_step's step."""
    lowered, mcfg = lower_step(config, batch, seq, preds, devices, dropout=dropout,
                               config_mesh=config_mesh)
    t = time.perf_counter()
    compiled = lowered.compile()
    return compiled, mcfg, time.perf_counter() - t


def attention_path(mcfg, devices, *, dropout: bool = True) -> str:
    """The attention implementation the model resolves to on these devices."""
    from bert_jax.models.kernels import attention as attention_kernels

    return attention_kernels.resolve(mcfg.attention, devices[0].platform, mcfg, training=dropout)


def describe(mcfg, attention: str, devices=None) -> str:
    """The model line both scripts print first: the compute dtype `devices` resolve
    model.dtype to (auto: bfloat16 on a GPU or TPU target, float32 on CPU)."""
    from bert_jax.models.kernels.backend import platform_name

    plat = platform_name(devices[0].platform) if devices else "cpu"
    return (f"model: L={mcfg.num_hidden_layers} H={mcfg.hidden_size} "
            f"A={mcfg.num_attention_heads} {mcfg.describe_compute(plat)}, remat {mcfg.remat}, "
            f"attention {attention}, scan_layers {mcfg.scan_layers}"
            + (f" (scan_unroll {mcfg.scan_unroll})" if mcfg.scan_layers else ""))
