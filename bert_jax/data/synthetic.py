"""`data.source="synthetic"`: random pre-training batches of the real shapes and dtypes.

For accelerator throughput runs (the GPU image has no TensorFlow) and tests. Never imports
TensorFlow. Batch i of host h is a pure function of (data.seed, h, i), so the state is just
the batch counter and resuming is exact.

Each row looks like a full-length pre-training pair: [CLS] A [SEP] B [SEP] with
input_mask all ones (the worst case for throughput), segment 1 on B,
max_predictions_per_seq distinct sorted masked positions (never [CLS]/[SEP]) whose input ids
are [MASK], and random NSP labels.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from bert_jax.data import state as state_lib
from bert_jax.tokenization import vocab_info


def synthetic_batch(rng: np.random.Generator, local_batch: int, max_seq_length: int,
                    max_predictions_per_seq: int, *, vocab_size: int, cls_id: int,
                    sep_id: int, mask_id: int, pad_id: int = 0) -> dict[str, np.ndarray]:
    """One batch, dict of numpy arrays (shapes as in bert_jax.data.pretrain)."""
    b, length, p = local_batch, max_seq_length, max_predictions_per_seq
    lo = max(cls_id, sep_id, mask_id, pad_id) + 1
    lo = lo if lo < vocab_size else 0
    ids = rng.integers(lo, vocab_size, size=(b, length), dtype=np.int32)
    mid = max(1, length // 2)
    ids[:, 0] = cls_id
    ids[:, mid] = sep_id
    ids[:, -1] = sep_id
    segment = np.zeros((b, length), np.int32)
    segment[:, mid + 1:] = 1
    # p distinct positions among the non-special ones, in increasing order.
    keys = rng.random((b, length))
    keys[:, [0, mid, length - 1]] = 2.0
    p_real = min(p, max(length - 3, 0))
    positions = np.zeros((b, p), np.int32)
    if p_real:
        chosen = np.argpartition(keys, p_real - 1, axis=1)[:, :p_real]
        positions[:, :p_real] = np.sort(chosen, axis=1)
    weights = np.zeros((b, p), np.float32)
    weights[:, :p_real] = 1.0
    labels = np.where(weights > 0, np.take_along_axis(ids, positions, axis=1), 0)
    rows = np.arange(b)[:, None]
    ids[rows, positions[:, :p_real]] = mask_id
    return {
        "input_ids": ids,
        "input_mask": np.ones((b, length), np.int32),
        "segment_ids": segment,
        "masked_lm_positions": positions,
        "masked_lm_ids": labels.astype(np.int32),
        "masked_lm_weights": weights,
        "next_sentence_labels": rng.integers(0, 2, size=(b,), dtype=np.int32),
        "example_weights": np.ones((b,), np.float32),
    }


class SyntheticIterator:
    """Endless synthetic batches with get_state / set_state / save / restore."""

    def __init__(self, cfg, *, process_index: int, process_count: int, local_batch: int):
        self._cfg = cfg
        self._vocab = vocab_info(cfg)
        self.process_index, self.process_count = process_index, process_count
        self.local_batch = local_batch
        self.batches = 0
        self._signature = dict(process_index=process_index, process_count=process_count,
                               local_batch=local_batch, seed=cfg.seed,
                               max_seq_length=cfg.max_seq_length,
                               max_predictions_per_seq=cfg.max_predictions_per_seq)

    def batch(self, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self._cfg.seed, self.process_index, index])
        return synthetic_batch(rng, self.local_batch, self._cfg.max_seq_length,
                               self._cfg.max_predictions_per_seq, **self._vocab)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        out = self.batch(self.batches)
        self.batches += 1
        return out

    def get_state(self) -> dict[str, np.ndarray]:
        return {state_lib.META: state_lib.pack_meta(
            dict(kind="synthetic", batches=self.batches, signature=self._signature))}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        meta = state_lib.unpack_meta(state)
        if meta.get("kind") != "synthetic" or meta["signature"] != self._signature:
            raise ValueError(f"input state {meta} does not belong to this synthetic iterator "
                             f"({self._signature})")
        self.batches = int(meta["batches"])

    def seek(self, batches: int) -> None:
        """The next batch is batch `batches` of this host's stream (a resume without a
        usable state, e.g. onto another process count: bert_jax.data.state.restore_input)."""
        self.batches = int(batches)

    def save(self, path) -> None:
        state_lib.save_state(path, self.get_state())

    def restore(self, path) -> None:
        self.set_state(state_lib.load_state(path))


class SyntheticEval:
    """`num_batches` synthetic eval batches (a fresh, identical pass each iteration)."""

    def __init__(self, cfg, *, process_index: int, process_count: int, local_batch: int,
                 num_batches: int):
        self._it = SyntheticIterator(cfg, process_index=process_index,
                                     process_count=process_count, local_batch=local_batch)
        self.num_batches = num_batches
        self.local_batch = local_batch

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(self.num_batches):
            yield self._it.batch(1_000_000_000 + i)
