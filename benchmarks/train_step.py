r"""Time one pre-training optimizer step (MLM + NSP, forward + backward + AdamW update).

    python benchmarks/train_step.py --config=configs/bert_base.py --batch=8 --seq=128

The exact jitted, sharded step the trainer runs (bert_jax.train.step), on synthetic
batches, all local devices in one data-parallel mesh. Prints compile time, the median of
--steps timed steps, seq/s, tokens/s and MFU (model FLOPs / peak FLOP/s; the peak is the
device table's bf16 figure on accelerators, and on CPU a float32 matmul ceiling measured at
start-up on the host that runs it, printed as well). Anything else running on the host slows
the result: check `uptime` first.

A step time on a shared CPU is only comparable with one measured beside it: to compare with
Hugging Face PyTorch or KerasHub, run `benchmarks/anchor_torch.py --interleave` or
`benchmarks/anchor_kerashub.py --interleave`, which alternate their step with this one in
one process. The figures measured so far are in benchmarks/RESULTS.md ("The CPU step
against PyTorch and KerasHub").
"""

from __future__ import annotations

import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags  # noqa: E402
from pretrain_step import build, define_step_flags, step_config  # noqa: E402

FLAGS = flags.FLAGS
define_step_flags()
flags.DEFINE_integer("predictions", None, "MLM slots per example (default: 0.15 * seq).")
flags.DEFINE_integer("steps", 5, "Timed steps (median reported).")
flags.DEFINE_integer("warmup", 2, "Untimed steps after compile.")
flags.DEFINE_integer("accum", 1, "Micro-batches per step.")
flags.DEFINE_string("optimizer", "adamw", "adamw | lamb")
flags.DEFINE_bool("dropout", True, "Dropout on (as in training).")
flags.DEFINE_string("dropout_rng", None,
                    "hash | jax: dropout mask generator (default: the config's model.dropout_rng).")


def main(argv):
    del argv
    import jax
    import numpy as np

    from bert_jax.train import metrics as metrics_lib

    config = step_config(FLAGS.config, FLAGS.dtype)
    with config.unlocked():
        if FLAGS.dropout_rng:
            config.model.dropout_rng = FLAGS.dropout_rng
        config.optimizer.name = FLAGS.optimizer
    preds = FLAGS.predictions or max(1, int(round(0.15 * FLAGS.seq)))
    built = build(config, FLAGS.batch, FLAGS.seq, preds, accum=FLAGS.accum,
                  dropout=FLAGS.dropout)
    model, mcfg, state = built["model"], built["mcfg"], built["state"]
    batches, rng, compiled = built["batches"], built["rng"], built["compiled"]
    compile_s = built["compile_s"]
    for i in range(FLAGS.warmup):
        state, m = compiled(state, batches[i % 2], rng)
    jax.block_until_ready(state)
    times, cpu = [], []
    for i in range(FLAGS.steps):
        t, c = time.perf_counter(), time.process_time()
        state, m = compiled(state, batches[i % 2], rng)
        jax.block_until_ready((state, m))
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    step_s = statistics.median(times)
    flops = metrics_lib.model_flops_per_example(mcfg, FLAGS.seq, preds, nsp=model.nsp)
    peak, source = metrics_lib.peak_flops_per_device()
    perf = metrics_lib.throughput(step_s, FLAGS.batch, FLAGS.seq, flops, peak,
                                  jax.device_count())
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
    print(f"model: L={mcfg.num_hidden_layers} H={mcfg.hidden_size} "
          f"({n_params / 1e6:.1f}M params), dtype {config.model.dtype}, {FLAGS.optimizer}, "
          f"MLM+NSP, batch {FLAGS.batch} x {FLAGS.seq} tokens, {preds} MLM slots, "
          f"accum {FLAGS.accum}, dropout "
          f"{('on (' + mcfg.dropout_rng + ' masks)') if FLAGS.dropout else 'off'}, "
          f"skip_nonfinite={bool(config.train.skip_nonfinite)}")
    print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; load average "
          f"{os.getloadavg()[0]:.2f} (other processes slow the figures)")
    print(f"compile: {compile_s:.1f} s")
    print(f"step time: median {step_s:.3f} s over {FLAGS.steps} steps "
          f"(min {min(times):.3f}, max {max(times):.3f}); loss {float(m['train/loss']):.4f}")
    print(f"CPU time per step (all threads; less sensitive to other processes): median "
          f"{statistics.median(cpu):.3f} s")
    print(f"throughput: {perf['perf/seq_per_s']:.2f} seq/s, "
          f"{perf['perf/tokens_per_s']:.0f} tokens/s")
    print(f"model FLOPs per step: {flops * FLAGS.batch / 1e9:.1f} GFLOP; peak: "
          f"{peak / 1e9:.1f} GFLOP/s per device ({source})")
    print(f"MFU: {100 * perf['perf/mfu']:.1f}%")


if __name__ == "__main__":
    app.run(main)
