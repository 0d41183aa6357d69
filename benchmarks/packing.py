r"""Packed against unpacked pre-training on the sample corpus: real-token throughput, side
by side in one process.

    python benchmarks/packing.py                                    # CPU: BERT-Tiny, 128 + 512
    python benchmarks/packing.py --config=configs/bert_base.py --batch=64 --dtype=bfloat16

The rows are those `create_pretraining_data.py` writes for data_prep/sample_corpus (dupe
factor --dupe_factor), with and without --pack (made in memory by data_prep.pipeline's
iter_rows; no TensorFlow), at each length of --seqs with ceil(0.15 x length) MLM slots per
sequence (20 at 128, 77 at 512). For each length, two jitted train steps (the trainer's
own, bert_jax.train.step) of --batch rows each, one on unpacked rows and one on packed
rows, alternate step by step (so a change in the machine's speed hits both); each reports
its median step time, rows/s, real (non-padding) tokens/s, padding and MFU on real tokens
(bert_jax.train.metrics.real_token_metrics), then the packed / unpacked ratio of real
tokens/s. The attention path is the config's `model.attention` (auto: XLA on CPU, the
Pallas kernel on a GPU for both). On a GPU, run it with a larger model and batch.

A ratio above 1 means packing moved more real tokens per second. It grows with the padding
packing removes and shrinks with the extra MLM slots a packed row carries: with BERT-Tiny,
whose decoder over 30,522 words dominates its step, there is little to win where there was
little padding. The figures measured so far are in benchmarks/RESULTS.md
("Packing: real tokens per second").
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", os.path.join(REPO, "configs", "bert_tiny.py"),
                                "Run config (model, optimizer, schedule, train sections).")
flags.DEFINE_integer("batch", 16, "Rows per step (global), packed or not.")
flags.DEFINE_list("seqs", ["128", "512"], "Sequence lengths to compare.")
flags.DEFINE_integer("max_sequences_per_pack", 3, "K: the most sequences per packed row.")
flags.DEFINE_integer("dupe_factor", 1, "data_prep's passes over the sample corpus.")
flags.DEFINE_integer("steps", 10, "Timed steps of each kind (median reported).")
flags.DEFINE_integer("warmup", 2, "Untimed steps of each kind after compile.")
flags.DEFINE_string("dtype", None, "Compute dtype (params stay float32); default: the "
                    "config's model.dtype (auto: bfloat16 on GPU / TPU, float32 on CPU).")


def corpus_rows(seq: int, preds: int, pack: int, dupe_factor: int) -> dict:
    """All rows data_prep makes of the sample corpus, as the input pipeline yields them
    (int32 / float32, example_weights 1)."""
    import glob

    import numpy as np

    from data_prep import instances, pipeline

    cfg = instances.InstanceConfig(max_seq_length=seq, max_predictions_per_seq=preds,
                                   dupe_factor=dupe_factor, max_sequences_per_pack=pack)
    spec = pipeline.WorkerSpec(os.path.join(REPO, "data_prep", "bert_uncased_vocab.txt"),
                               None, True, cfg, 12345)
    files = sorted(glob.glob(os.path.join(REPO, "data_prep", "sample_corpus", "*.txt")))
    parts = list(pipeline.iter_rows(files, spec))
    names = [n for n in parts[0] if n not in ("decision", "n_candidates")]
    rows = {n: np.concatenate([p[n] for p in parts]) for n in names}
    rows = {n: v.astype(np.float32 if v.dtype.kind == "f" else np.int32) for n, v in rows.items()}
    rows["example_weights"] = np.ones(len(rows["input_ids"]), np.float32)
    return rows


def compare(config, seq: int, batch: int, k: int) -> dict:
    """Alternated steps on unpacked and packed rows of length seq; returns the figures."""
    import jax

    from bert_jax import optim
    from bert_jax import sharding as sharding_lib
    from bert_jax.data import device as data_device
    from bert_jax.train import metrics as metrics_lib
    from bert_jax.tasks.pretraining import PretrainingTask
    from bert_jax.train import state as state_lib
    from bert_jax.train import step as step_lib

    preds = math.ceil(0.15 * seq)  # as gpu_suite / step_memory: 20 at 128, 77 at 512
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
    bsh = data_device.batch_sharding(mesh, rules)
    fn = step_lib.jit_train_step(task, tx, schedule, shardings, bsh, rules,
                                 deterministic=bool(config.train.deterministic),
                                 keep_state_on_nonfinite=bool(config.train.skip_nonfinite))
    rng = jax.device_put(jax.random.key(1), sharding_lib.replicated(mesh))
    peak, source = metrics_lib.peak_flops_per_device()
    runs = {}
    for name, pack in (("unpacked", 0), ("packed", k)):
        rows = corpus_rows(seq, preds, pack, FLAGS.dupe_factor)
        n = len(rows["input_ids"]) // batch * batch
        host = [{f: v[i:i + batch] for f, v in rows.items()} for i in range(0, n, batch)]
        batches = [data_device.to_global(b, bsh) for b in host[:FLAGS.steps + FLAGS.warmup]]
        state = state_lib.init_state(model, tx, mesh, rules, jax.random.key(0),
                                     state_lib.dummy_inputs(seq, preds), shardings)
        t = time.perf_counter()
        compiled = fn.lower(state, batches[0], rng).compile()
        runs[name] = dict(state=state, compiled=compiled, batches=batches, times=[],
                          stats=[], compile_s=time.perf_counter() - t, rows=len(rows["input_ids"]),
                          sequences=int(rows["next_sentence_weights"].sum()) if pack
                          else len(rows["input_ids"]),
                          padding=float(1 - rows["input_mask"].mean()))
    for i in range(FLAGS.warmup + FLAGS.steps):
        for name, r in runs.items():
            t = time.perf_counter()
            r["state"], m = r["compiled"](r["state"], r["batches"][i], rng)
            jax.block_until_ready((r["state"], m))
            if i >= FLAGS.warmup:
                r["times"].append(time.perf_counter() - t)
                r["stats"].append(step_lib.host_metrics(m))
    out = dict(seq=seq, preds=preds, peak=peak, peak_source=source)
    for name, r in runs.items():
        step_s = statistics.median(r["times"])
        stats = metrics_lib.average(r["stats"])
        perf = metrics_lib.real_token_metrics(
            stats, rows=batch, seq_len=seq, config=mcfg, nsp=model.nsp, step_time=step_s,
            peak_per_device=peak, num_devices=jax.device_count())
        out[name] = dict(step_s=step_s, rows_per_s=batch / step_s, compile_s=r["compile_s"],
                         corpus_rows=r["rows"], corpus_sequences=r["sequences"],
                         corpus_padding=r["padding"], **perf)
    out["ratio"] = (out["packed"]["perf/real_tokens_per_s"]
                    / out["unpacked"]["perf/real_tokens_per_s"])
    return out


def main(argv):
    del argv
    import jax

    config = FLAGS.config
    if FLAGS.dtype:
        with config.unlocked():
            config.model.dtype = FLAGS.dtype
    mcfg = config.model
    print(f"model: L={mcfg.num_hidden_layers} H={mcfg.hidden_size} dtype {mcfg.dtype}, "
          f"attention {mcfg.get('attention', 'auto')}; {FLAGS.batch} rows per step; "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}; load average "
          f"{os.getloadavg()[0]:.2f}; K={FLAGS.max_sequences_per_pack}, sample corpus, "
          f"dupe factor {FLAGS.dupe_factor}; medians of {FLAGS.steps} alternated steps")
    header = (f"{'seq':>4} {'rows':<8} {'corpus rows':>11} {'seq/row':>7} {'padding':>8} "
              f"{'ms/step':>8} {'rows/s':>8} {'real tok/s':>11} {'real MFU':>8} {'compile s':>9}")
    print(header)
    results = []
    for seq in map(int, FLAGS.seqs):
        r = compare(config, seq, FLAGS.batch, FLAGS.max_sequences_per_pack)
        results.append(r)
        for name in ("unpacked", "packed"):
            x = r[name]
            print(f"{seq:>4} {name:<8} {x['corpus_rows']:>11,} "
                  f"{x['corpus_sequences'] / x['corpus_rows']:>7.3f} "
                  f"{x['corpus_padding']:>8.2%} {1e3 * x['step_s']:>8.1f} "
                  f"{x['rows_per_s']:>8.1f} {x['perf/real_tokens_per_s']:>11,.0f} "
                  f"{x['perf/real_mfu']:>8.2%} {x['compile_s']:>9.1f}", flush=True)
        print(f"{seq:>4} packed / unpacked real tokens/s: {r['ratio']:.3f}x (an epoch of the "
              f"corpus: {r['unpacked']['corpus_rows'] / r['packed']['corpus_rows']:.3f}x fewer "
              f"rows)", flush=True)
    print(f"MFU against the {results[0]['peak_source']} ({results[0]['peak'] / 1e9:.0f} GFLOP/s)")


if __name__ == "__main__":
    app.run(main)
