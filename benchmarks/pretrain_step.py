"""The trainer's jitted, sharded pre-training step on synthetic batches, as the benchmarks
build it (train_step.py, compiler_options.py; anchor_torch.py and anchor_kerashub.py
--interleave), and the flags and config handling the step scripts share. Not a script."""

from __future__ import annotations

import time


def define_step_flags() -> None:
    """The absl flags of a step benchmark: --config (required), --batch, --seq, --dtype."""
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Run config (model section used).")
    flags.DEFINE_integer("batch", 8, "Global batch size.")
    flags.DEFINE_integer("seq", 128, "Sequence length.")
    flags.DEFINE_string("dtype", None, "Compute dtype (params stay float32); default: the "
                        "config's model.dtype (auto: bfloat16 on GPU / TPU, float32 on CPU).")
    flags.mark_flags_as_required(["config"])


def step_config(config, dtype: str):
    """`config` (the --config flag's) with model.dtype = dtype (None: the config's own) and
    the training sections' defaults added when the file has none (a model-only config).
    Returns it."""
    from bert_jax.train.config import add_training_sections

    with config.unlocked():
        if dtype:
            config.model.dtype = dtype
        if "optimizer" not in config:
            add_training_sections(config)
    return config


def build(config, batch: int, seq: int, preds: int, *, accum: int = 1, dropout: bool = True,
          host_batches: list | None = None):
    """All local devices in one data-parallel mesh. Returns a dict: model, mcfg (the
    BertConfig), state, batches (two global batches: synthetic full-length rows, or
    `host_batches`, numpy batches of any layout the step takes, e.g. packed rows), rng,
    lowered (the step's
    lowering, to compile again with other compiler options), compiled (the step, compiled
    as launch/train.py compiles it), compile_s (lowering and compiling the step) and
    init_s (initializing the state)."""
    import jax
    import numpy as np

    from bert_jax import optim
    from bert_jax import sharding as sharding_lib
    from bert_jax.data import device as data_device
    from bert_jax.data.synthetic import synthetic_batch
    from bert_jax.tasks.pretraining import PretrainingTask
    from bert_jax.train import state as state_lib
    from bert_jax.train import step as step_lib

    with config.unlocked():
        config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
    mesh = sharding_lib.make_mesh(config.mesh)
    rules = sharding_lib.rules_from_config(config.mesh)
    task = PretrainingTask(config, "")
    model, mcfg = task.model, task.model_config
    tx = optim.make_optimizer(config.optimizer, config.schedule, 1_000_000)
    schedule = optim.make_schedule(config.schedule, 1_000_000)
    _, shardings = state_lib.state_shardings(model, tx, mesh, rules,
                                             state_lib.dummy_inputs(seq, preds))
    t = time.perf_counter()
    state = state_lib.init_state(model, tx, mesh, rules, jax.random.key(0),
                                 state_lib.dummy_inputs(seq, preds), shardings)
    jax.block_until_ready(state)
    init_s = time.perf_counter() - t
    bsh = data_device.batch_sharding(mesh, rules)
    # As launch/train.py compiles it: with the default train.skip_nonfinite=False the step
    # has no select of old against new state (the loop stops on the flag instead).
    fn = step_lib.jit_train_step(task, tx, schedule, shardings, bsh, rules,
                                 accum_steps=accum, deterministic=not dropout,
                                 keep_state_on_nonfinite=bool(config.train.skip_nonfinite))
    gen = np.random.default_rng(0)
    host_batches = host_batches or [synthetic_batch(
        gen, batch, seq, preds, vocab_size=mcfg.vocab_size, cls_id=101, sep_id=102,
        mask_id=103) for _ in range(2)]
    batches = [data_device.to_global(b, bsh) for b in host_batches]
    rng = jax.device_put(jax.random.key(1), sharding_lib.replicated(mesh))
    t = time.perf_counter()
    lowered = fn.lower(state, batches[0], rng)
    compiled = lowered.compile()
    return dict(model=model, mcfg=mcfg, state=state, batches=batches, rng=rng,
                lowered=lowered, compiled=compiled, compile_s=time.perf_counter() - t,
                init_s=init_s)


def base_stepper(batch: int, seq: int):
    """A closure running one step of configs/bert_base.py (float32 AdamW, MLM + NSP, dropout
    on, 0.15 * seq predictions) built as train_step.py builds it; returns the step's loss.
    The anchors alternate it with another framework's step."""
    import importlib.util
    import os
    import sys

    import jax

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location(
        "bert_base_config", os.path.join(root, "configs", "bert_base.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    built = build(module.get_config(), batch, seq, anchor_preds(seq))
    holder = {"state": built["state"], "count": 0}

    def run() -> float:
        holder["state"], m = built["compiled"](holder["state"],
                                               built["batches"][holder["count"] % 2],
                                               built["rng"])
        holder["count"] += 1
        return float(jax.block_until_ready(m)["train/loss"])
    return run


def anchor_preds(seq: int) -> int:
    """MLM predictions per row of the anchors' batches: round(0.15 * seq), 19 at 128."""
    return max(1, int(round(0.15 * seq)))


def anchor_args():
    """The anchors' command line: --batch, --seq, --steps, --warmup, --interleave."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--interleave", action="store_true",
                   help="alternate with bert_jax's step on configs/bert_base.py")
    return p.parse_args()


def run_anchor(name: str, label: str, their_step, args, *, pause: float = 0.3) -> None:
    """Times `their_step()` (one step of another framework; returns its loss) for
    args.warmup + args.steps steps and, with args.interleave, one bert_jax BERT-Base step
    after each (base_stepper, `pause` seconds apart), then prints the medians and the
    ratio. `name` is the other framework's short name, `label` describes its step."""
    import statistics

    ours = base_stepper(args.batch, args.seq) if args.interleave else None
    times, ours_times = [], []
    loss = ours_loss = float("nan")
    for i in range(args.warmup + args.steps):
        t = time.perf_counter()
        loss = their_step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t)
        if ours is not None:
            time.sleep(pause)
            t = time.perf_counter()
            ours_loss = ours()
            if i >= args.warmup:
                ours_times.append(time.perf_counter() - t)
            time.sleep(pause)
    theirs = statistics.median(times)
    print(label)
    print(f"step time: median {theirs:.3f} s over {args.steps} steps (min {min(times):.3f}, "
          f"max {max(times):.3f}); loss {loss:.4f}")
    if ours is not None:
        m = statistics.median(ours_times)
        print(f"bert_jax configs/bert_base.py step (MLM + NSP), interleaved: median {m:.3f} s "
              f"(min {min(ours_times):.3f}, max {max(ours_times):.3f}); loss {ours_loss:.4f}")
        print(f"ratio bert_jax / {name}: {m / theirs:.3f}")
