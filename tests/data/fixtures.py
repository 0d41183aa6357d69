"""Tiny TFRecord fixtures in the original BERT pre-training format, written by hand with
tf.train.Example (independent of data_prep and of the reader under test).

Each record is identifiable: input_ids[1] = 1000 + file id, input_ids[2] = 1000 + record
index (never masked), so tests can tell exactly which records a pipeline yielded.
"""

from __future__ import annotations

import os

import numpy as np

VOCAB_SIZE = 2000
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103


def make_record(rng, file_id: int, index: int, seq: int, preds: int) -> dict[str, np.ndarray]:
    length = int(rng.integers(12, seq + 1))
    ids = rng.integers(200, VOCAB_SIZE, size=length).astype(np.int64)
    ids[0] = CLS
    ids[1], ids[2] = 1000 + file_id, 1000 + index
    mid = int(rng.integers(4, length - 2))
    ids[mid] = SEP
    ids[length - 1] = SEP
    segment = np.zeros(length, np.int64)
    segment[mid + 1:] = 1
    candidates = [i for i in range(3, length - 1) if i != mid]
    n = min(preds, max(1, int(round(length * 0.15))), len(candidates))
    positions = np.sort(rng.choice(candidates, size=n, replace=False))
    labels = ids[positions].copy()
    for p in positions:
        u = rng.random()
        ids[p] = MASK if u < 0.8 else (ids[p] if u < 0.9 else rng.integers(200, VOCAB_SIZE))
    pad = seq - length
    rec = {
        "input_ids": np.pad(ids, (0, pad)),
        "input_mask": np.pad(np.ones(length, np.int64), (0, pad)),
        "segment_ids": np.pad(segment, (0, pad)),
        "masked_lm_positions": np.pad(positions, (0, preds - n)).astype(np.int64),
        "masked_lm_ids": np.pad(labels, (0, preds - n)),
        "masked_lm_weights": np.pad(np.ones(n, np.float32), (0, preds - n)),
        "next_sentence_labels": np.array([int(rng.integers(0, 2))], np.int64),
    }
    return rec


def serialize(rec: dict[str, np.ndarray]) -> bytes:
    import tensorflow as tf
    feature = {}
    for name, value in rec.items():
        if value.dtype == np.float32:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=value))
        else:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=value))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_files(directory, num_files: int, records_per_file, seq: int = 32, preds: int = 5,
                seed: int = 0, name: str = "shard") -> tuple[list[str], dict]:
    """Writes num_files files; returns (paths, {(file_id, index): record})."""
    import tensorflow as tf
    rng = np.random.default_rng(seed)
    if isinstance(records_per_file, int):
        records_per_file = [records_per_file] * num_files
    paths, records = [], {}
    for f in range(num_files):
        path = os.path.join(str(directory), f"{name}-{f:05d}-of-{num_files:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for i in range(records_per_file[f]):
                rec = make_record(rng, f, i, seq, preds)
                records[(f, i)] = rec
                w.write(serialize(rec))
        paths.append(path)
    return paths, records


def record_key(input_ids_row) -> tuple[int, int]:
    return int(input_ids_row[1]) - 1000, int(input_ids_row[2]) - 1000
