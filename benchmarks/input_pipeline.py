"""Input pipeline throughput (examples/s per host), side by side with the bare ceiling.

    python benchmarks/input_pipeline.py [--batch=256] [--seconds=6] [--lengths=128,512]

Writes synthetic TFRecords in the original BERT format to a temp dir (a pool of distinct
examples written repeatedly; ~90% full-length pairs as create_pretraining_data makes with
short_seq_prob=0.1), then times, for each length:
  ceiling  bare TFRecordDataset + batched parse_example of the seven features, tensors
           left in TF (no shuffle, no interleave, no numpy)
  staticN  static with data.read_threads=-2 (AUTOTUNE reader threads, the choice for gs://)
  static   bert_jax.data.pretrain.train_iterator: sharding, interleave, seeded shuffle,
           batch, parse, prefetch, numpy hand-off (what the trainer gets)
  static+at  the same with data.autotune=True (tf.data's autotuning model thread)
  dynamic  the same with data.dynamic_masking=True (re-masked in TF ops)
examples/s is wall-clock; examples/CPU-s divides by the CPU time of this process (all its
threads), which moves less when other jobs share the cores.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
import tensorflow as tf

from bert_jax.data import pretrain, tfrecord

PREDICTIONS = {128: 20, 512: 80}


def _example(rng, seq, preds, vocab=30522):
    length = seq if rng.random() < 0.9 else int(rng.integers(16, seq))
    ids = rng.integers(999, vocab, size=length)
    ids[0], ids[length // 2], ids[-1] = 101, 102, 102
    segment = np.zeros(length, np.int64)
    segment[length // 2 + 1:] = 1
    n = min(preds, max(1, round(length * 0.15)))
    positions = np.sort(rng.choice(np.arange(1, length - 1), n, replace=False))
    labels = ids[positions].copy()
    ids[positions] = 103

    def ints(v, width):
        return tf.train.Feature(int64_list=tf.train.Int64List(
            value=np.pad(np.asarray(v, np.int64), (0, width - len(v)))))
    feature = {
        "input_ids": ints(ids, seq), "input_mask": ints(np.ones(length), seq),
        "segment_ids": ints(segment, seq), "masked_lm_positions": ints(positions, preds),
        "masked_lm_ids": ints(labels, preds),
        "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(
            value=np.pad(np.ones(n), (0, preds - n)))),
        "next_sentence_labels": ints([int(rng.integers(0, 2))], 1),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_data(directory, seq, num_files=16, records_per_file=4096, pool=2048):
    rng = np.random.default_rng(seq)
    examples = [_example(rng, seq, PREDICTIONS[seq]) for _ in range(pool)]
    for f in range(num_files):
        with tf.io.TFRecordWriter(os.path.join(directory, f"data-{f:03d}.tfrecord")) as w:
            for i in range(records_per_file):
                w.write(examples[(f * 7919 + i) % pool])
    return os.path.join(directory, "*.tfrecord"), sum(len(e) for e in examples) / pool


def rate(iterator, batch, seconds, warmup=20):
    """(examples per wall second, examples per CPU second of this process, all threads)."""
    for _ in range(warmup):
        next(iterator)
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        next(iterator)
        n += 1
    return (n * batch / (time.perf_counter() - start),
            n * batch / max(1e-9, time.process_time() - cpu))


def ceiling(pattern, seq, batch):
    spec = tfrecord.parse_spec(seq, PREDICTIONS[seq])
    files = tf.io.gfile.glob(pattern)
    # Files read one after the other: with few cores that is faster than
    # num_parallel_reads=AUTOTUNE (figures in benchmarks/RESULTS.md, "Input pipeline choices").
    ds = (tf.data.TFRecordDataset(files).repeat()
          .batch(batch).map(lambda s: tf.io.parse_example(s, spec),
                            num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))
    return iter(ds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=256, help="examples per host batch")
    parser.add_argument("--seconds", type=float, default=6.0, help="timed seconds per row")
    parser.add_argument("--lengths", default="128,512")
    args = parser.parse_args()
    print(f"tf {tf.__version__}, {os.cpu_count()} CPU cores, host batch {args.batch}; "
          f"numbers are noisy if other jobs share the cores")
    print(f"{'length':>6}  {'pipeline':<9} {'examples/s':>11}  {'of ceiling':>10}  "
          f"{'examples/CPU-s':>14}")
    for seq in [int(s) for s in args.lengths.split(",")]:
        tmp = tempfile.mkdtemp(prefix=f"bert_jax_input_{seq}_")
        try:
            pattern, size = write_data(tmp, seq)
            rows = [("ceiling", ceiling(pattern, seq, args.batch))]
            for name, dynamic, threads, tune in (
                    ("static", False, -1, False), ("static+at", False, -1, True),
                    ("staticN", False, -2, False), ("dynamic", True, -1, False)):
                cfg = pretrain.data_config(
                    train_files=pattern, max_seq_length=seq,
                    max_predictions_per_seq=PREDICTIONS[seq],
                    dynamic_masking=dynamic, read_threads=threads, autotune=tune)
                rows.append((name, pretrain.train_iterator(cfg, args.batch, process_index=0,
                                                           process_count=1)))
            top = None
            for name, it in rows:
                r, per_cpu = rate(it, args.batch, args.seconds)
                top = top or r
                print(f"{seq:>6}  {name:<9} {r:>11,.0f}  {r / top:>9.0%}  {per_cpu:>14,.0f}",
                      flush=True)
            print(f"{'':>6}  (records of ~{size / 1024:.1f} KB, 16 files x 4096)")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
