"""Input side of fine-tuning: tokens with character offsets, the TFRecord feature cache, and
numpy batches whose last eval batch is padded with zero-weight rows (no example dropped).

Features of every task are a dict of equal-length numpy arrays, `<int32>[N, ...]`
(`input_ids`, `input_mask`, `segment_ids` [N, L] as the original run_classifier/run_squad,
plus task fields: `label_ids`, `start_positions`, ...). The cache stores exactly that dict.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterator, Mapping, Optional

import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.data.state import META, pack_meta, unpack_meta
from bert_jax.tokenization import check_unk_rate
from bert_jax.tasks.readers import DataError


# --- tokens with offsets ---------------------------------------------------------------

def encode_with_offsets(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """WordPiece ids of `text` and, per id, its [start, end) character span in `text` itself
    (not in a normalized copy): what maps SQuAD answers back to the exact original characters,
    accents and odd whitespace included. Needs the `tokenizers` backend (WordPieceTokenizer)."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None:
        raise TypeError(f"{type(tokenizer).__name__} has no character offsets; span tasks "
                        "need a WordPiece vocab (tokenizers backend)")
    enc = backend.encode(text, add_special_tokens=False)
    return list(enc.ids), [tuple(o) for o in enc.offsets]


# --- checks of a task's features ------------------------------------------------------

def check_features(features: Mapping[str, np.ndarray], tokenizer, source: str
                   ) -> Mapping[str, np.ndarray]:
    """`features` (a task's: input_ids / input_mask `[N, L]` or `[N, choices, L]`) once two
    checks naming `source` pass: at least one row (DataError), and the share of [UNK] among
    the real tokens ([CLS] / [SEP] / [PAD] left out): tokenization.VocabError above
    UNK_ERROR, a logged warning from UNK_WARN on."""
    if not num_rows(features):
        raise DataError(f"{source}: no features from its examples (every one was skipped); "
                        f"expected at least one usable example")
    ids = np.asarray(features["input_ids"])
    real = (np.asarray(features["input_mask"]) > 0) & ~np.isin(
        ids, [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id])
    vocab = (f"{getattr(tokenizer, 'source', type(tokenizer).__name__)} (do_lower_case="
             f"{getattr(tokenizer, 'do_lower_case', '?')})")
    warning = check_unk_rate(int((ids[real] == tokenizer.unk_id).sum()), int(real.sum()),
                             source, vocab)
    if warning:
        logging.warning("%s", warning)
    return features


# --- TFRecord feature cache ------------------------------------------------------------

def cache_key(**parts) -> str:
    """A short hash of everything the features depend on (data files' size+mtime, vocab,
    lengths, task): a changed input builds a new cache instead of reading a stale one."""
    norm = {}
    for k, v in sorted(parts.items()):
        if isinstance(v, str) and v and paths.exists(v):
            st = epath.Path(v).stat()  # local or gs://: size and modification time
            v = [paths.resolve(v), int(st.length), int(st.mtime)]
        norm[k] = v
    return hashlib.sha1(json.dumps(norm, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_feature_cache(path: str, features: Mapping[str, np.ndarray]) -> None:
    """One tf.train.Example per row, int64 lists (float for float arrays), flattened; shapes
    in a `.json` sidecar. Written to a temporary name and renamed (no half cache). `path` may
    be a URI (gs://...): TensorFlow's file system writes it."""
    import tensorflow as tf

    n = num_rows(features)
    meta = {k: {"shape": list(v.shape[1:]), "dtype": str(v.dtype)} for k, v in features.items()}
    tmp = path + ".tmp"
    with tf.io.TFRecordWriter(tmp) as w:
        for i in range(n):
            feats = {}
            for k, v in features.items():
                row = np.asarray(v[i]).reshape(-1)
                if np.issubdtype(row.dtype, np.floating):
                    feats[k] = tf.train.Feature(float_list=tf.train.FloatList(value=row))
                else:
                    feats[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=row))
            w.write(tf.train.Example(features=tf.train.Features(feature=feats))
                    .SerializeToString())
    with tf.io.gfile.GFile(tmp + ".json", "w") as f:
        f.write(json.dumps({"num_rows": n, "features": meta}))
    tf.io.gfile.rename(tmp + ".json", path + ".json", overwrite=True)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def read_feature_cache(path: str) -> dict[str, np.ndarray]:
    import tensorflow as tf

    with tf.io.gfile.GFile(path + ".json") as f:
        meta = json.loads(f.read())
    spec = {}
    for k, m in meta["features"].items():
        kind = tf.float32 if m["dtype"].startswith("float") else tf.int64
        spec[k] = tf.io.FixedLenFeature([int(np.prod(m["shape"], dtype=np.int64))], kind)
    ds = tf.data.TFRecordDataset(path).map(lambda r: tf.io.parse_single_example(r, spec))
    n = meta["num_rows"]
    out = {k: np.zeros([n] + m["shape"], m["dtype"]) for k, m in meta["features"].items()}
    for i, ex in enumerate(ds.batch(1024).as_numpy_iterator()):
        for k, m in meta["features"].items():
            rows = ex[k]
            out[k][i * 1024: i * 1024 + len(rows)] = rows.reshape([len(rows)] + m["shape"])
    return out


def cached_features(cache_dir: Optional[str], name: str, key: str, build) -> dict:
    """features from `cache_dir/name-key.tfrecord` if present, else build() and write it."""
    if not cache_dir:
        return build()
    import tensorflow as tf

    path = paths.join(cache_dir, f"{name}-{key}.tfrecord")
    if tf.io.gfile.exists(path) and tf.io.gfile.exists(path + ".json"):
        return read_feature_cache(path)
    features = build()
    tf.io.gfile.makedirs(paths.resolve(cache_dir))
    write_feature_cache(path, features)
    return features


# --- batches ---------------------------------------------------------------------------

def num_rows(features: Mapping[str, np.ndarray]) -> int:
    sizes = {k: len(v) for k, v in features.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"feature arrays differ in length: {sizes}")
    return next(iter(sizes.values()))


def train_batch_indices(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Row indices of batch `step` (from 0) of the stream that concatenates the epochs'
    permutations (each a pure function of (seed, epoch), so a resumed run or another host
    recomputes them): rows [step * B, (step + 1) * B) of it. A batch may straddle two epochs,
    so no batch is ragged and every row is seen once per epoch."""
    first, last = step * batch_size, (step + 1) * batch_size  # stream positions [first, last)
    out = []
    for epoch in range(first // n, (last - 1) // n + 1):
        perm = np.random.default_rng([int(seed), int(epoch)]).permutation(n)
        lo, hi = max(first - epoch * n, 0), min(last - epoch * n, n)
        out.append(perm[lo:hi])
    return np.concatenate(out)


class FeatureBatches:
    """Shuffled full training batches of in-memory features, forever: batch `step` of the
    stream is a pure function of (seed, step) (train_batch_indices), so its position is its
    step. Each of `process_count` processes takes its own rows [p * B/P, (p + 1) * B/P) of
    every global batch of `batch_size` rows; `example_weights` are 1. get_state / set_state
    / seek give the loop's exact resume (bert_jax.data.state)."""

    def __init__(self, features: Mapping[str, np.ndarray], batch_size: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        if not num_rows(features):
            raise ValueError("no training features")
        if batch_size % process_count:
            raise ValueError(f"train.batch_size={batch_size} (global) must be a multiple of "
                             f"the number of processes, {process_count}")
        self.features, self.batch_size, self.seed = features, int(batch_size), int(seed)
        self.rows = slice(process_index * batch_size // process_count,
                          (process_index + 1) * batch_size // process_count)
        self.step = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        idx = train_batch_indices(num_rows(self.features), self.batch_size, self.seed,
                                  self.step)[self.rows]
        self.step += 1
        batch = {k: v[idx] for k, v in self.features.items()}
        batch["example_weights"] = np.ones([len(idx)], np.float32)
        return batch

    def get_state(self) -> dict[str, np.ndarray]:
        return {META: pack_meta({"kind": "features", "seed": self.seed,
                                 "batches": self.step}),
                "step": np.asarray(self.step, np.int64)}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        meta = unpack_meta(dict(state))
        if meta.get("kind") != "features" or meta.get("seed") != self.seed:
            raise ValueError(f"a state of {meta}, not of feature batches with seed "
                             f"{self.seed}")
        self.step = int(state["step"])

    def seek(self, batches: int) -> None:
        self.step = int(batches)


def eval_batches(features: Mapping[str, np.ndarray], batch_size: int
                 ) -> Iterator[dict[str, np.ndarray]]:
    """Every row once, in order; the last batch is filled up with copies of row 0 whose
    `example_weights` are 0, so shapes stay static and nothing is dropped."""
    n = num_rows(features)
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(start + batch_size, n))
        weights = np.ones([batch_size], np.float32)
        if len(idx) < batch_size:
            weights[len(idx):] = 0.0
            idx = np.concatenate([idx, np.zeros([batch_size - len(idx)], np.int64)])
        batch = {k: v[idx] for k, v in features.items()}
        batch["example_weights"] = weights
        yield batch
