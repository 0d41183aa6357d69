"""Device memory of the compiled pre-training step, from abstract inputs (nothing allocated).

    report = analyze(config, batch=256, seq=128, preds=20, devices=gpu_target_devices(path))
    report["temp"]   # bytes of temporaries: activations kept for backward, gradients, workspace

Used by `benchmarks/step_memory.py` (any config, CPU or an H100 compile target without a
GPU) and by tests/train/test_step_memory.py (which pins the tiny config's figures).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp


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
    from bert_jax.train import config as config_lib
    from bert_jax.train import state as state_lib
    from bert_jax.train import step as step_lib

    with config.unlocked():
        if "optimizer" not in config:
            config_lib.add_training_sections(config)
        config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
    mesh = sharding_lib.make_mesh(config.mesh, devices)
    rules = sharding_lib.rules_from_config(config.mesh)
    model = state_lib.create_model(config)
    tx = optim.make_optimizer(config.optimizer, config.schedule, 1_000_000)
    schedule = optim.make_schedule(config.schedule, 1_000_000)
    abstract, shardings = state_lib.state_shardings(model, tx, mesh, rules, seq, preds)
    bsh = data_device.batch_sharding(mesh, rules)
    fn = step_lib.jit_train_step(model, tx, schedule, shardings, bsh, rules,
                                 deterministic=not dropout,
                                 keep_state_on_nonfinite=bool(config.train.skip_nonfinite))
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                               sharding=sharding_lib.replicated(mesh))
    return fn.lower(abstract, abstract_batch(batch, seq, preds, bsh), rng), model.config


def analyze(config, batch: int, seq: int, preds: int, devices, *, dropout: bool = True) -> dict:
    """Compiles the step and returns its memory figures in bytes: argument, output, alias,
    temp, peak (argument + output - alias + temp), plus model (the BertConfig), attention
    (the implementation the model resolves to on these devices), device and compile_s."""
    from bert_jax.models import attention_ops

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
