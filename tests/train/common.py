"""Shared helpers for the training tests: a very small model config and hand-built batches."""

from __future__ import annotations

import numpy as np


def tiny_config(**train_overrides):
    """configs/bert_tiny.py shrunk to vocab 128, H 32, 2 layers, 4 heads (tensor=4 divides
    heads), float32, no dropout: fast enough for subprocess tests."""
    from configs import bert_tiny  # noqa: F401  (configs/ is a directory of plain files)
    raise NotImplementedError


def random_batch(seed: int, batch: int, length: int = 16, predictions: int = 4,
                 vocab: int = 128, padded_tail: bool = True) -> dict:
    """A valid pre-training batch with real padding: variable lengths, masked-LM slots with
    weight 0, both NSP labels. Deterministic in `seed`."""
    rs = np.random.RandomState(seed)
    lengths = rs.randint(length // 2, length + 1, size=batch)
    pos = np.arange(length)[None, :]
    input_mask = (pos < lengths[:, None]).astype(np.int32)
    input_ids = rs.randint(5, vocab, size=(batch, length)).astype(np.int32) * input_mask
    segment_ids = ((pos >= (lengths // 2)[:, None]) & (input_mask > 0)).astype(np.int32)
    n_pred = rs.randint(1, predictions + 1, size=batch) if padded_tail else np.full(batch, predictions)
    positions = np.zeros((batch, predictions), np.int32)
    weights = np.zeros((batch, predictions), np.float32)
    ids = np.zeros((batch, predictions), np.int32)
    for b in range(batch):
        p = np.sort(rs.choice(np.arange(1, lengths[b]), size=n_pred[b], replace=False))
        positions[b, :n_pred[b]] = p
        weights[b, :n_pred[b]] = 1.0
        ids[b, :n_pred[b]] = input_ids[b, p]
        input_ids[b, p] = 4  # [MASK]
    return dict(input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids,
                masked_lm_positions=positions, masked_lm_ids=ids, masked_lm_weights=weights,
                next_sentence_labels=rs.randint(0, 2, size=(batch, 1)).astype(np.int32))
