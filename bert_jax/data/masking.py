"""Dynamic (RoBERTa-style) re-masking of whole batches in TensorFlow ops.

`data.dynamic_masking=True` makes the input pipeline draw a fresh MLM mask every time an
example is seen instead of using the one frozen into the TFRecords by data_prep. The
unmasked ids are rebuilt from the record (writing `masked_lm_ids` back at
`masked_lm_positions`), then the original recipe is applied again, vectorized over the batch:

  * candidates: real tokens (`input_mask == 1`) that are not [CLS], [SEP] or [PAD];
  * per example, n = min(max_predictions_per_seq, max(1, round(len * masked_lm_prob)))
    positions chosen uniformly without replacement (len counts [CLS]/[SEP] as the
    original tool does; `tf.round` rounds half to even like Python's `round`);
  * each chosen position: 80% [MASK], 10% a random id in [0, vocab_size), 10% unchanged;
  * the positions are written in increasing order, padded with position 0, id 0, weight 0.

Randomness is stateless (`tf.random.stateless_*`) and keyed by (seed, process, batch index),
so a pipeline that uses it stays deterministic and its iterator can be checkpointed.

The top-k choice dominates its cost, which is of the order of parse_example's own
(benchmarks/RESULTS.md, with the variants tried and dropped).
"""

from __future__ import annotations

from typing import Mapping

import tensorflow as tf


def unmask(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights):
    """The ids before masking.

    input_ids: <int32>[batch, length]; masked_lm_*: [batch, P] (weights float, 0 = padding).
    Returns <int32>[batch, length] with `masked_lm_ids` written back at the real positions.
    """
    batch = tf.shape(input_ids)[0]
    num_preds = tf.shape(masked_lm_positions)[1]
    rows = tf.broadcast_to(tf.range(batch)[:, None], [batch, num_preds])
    index = tf.stack([rows, masked_lm_positions], axis=-1)  # [batch, P, 2]
    real = masked_lm_weights > 0
    return tf.tensor_scatter_nd_update(
        input_ids, tf.boolean_mask(index, real), tf.boolean_mask(masked_lm_ids, real))


def remask(features: Mapping[str, tf.Tensor], seed, *, max_predictions_per_seq: int,
           masked_lm_prob: float, vocab_size: int, cls_id: int, sep_id: int, pad_id: int,
           mask_id: int) -> dict[str, tf.Tensor]:
    """Returns `features` with a fresh mask.

    features: int32 input_ids / input_mask [batch, length], masked_lm_positions /
      masked_lm_ids [batch, P], float32 masked_lm_weights [batch, P] (other keys pass through).
    seed: <int32 or int64>[2] stateless seed; different seeds give independent masks.
    """
    original = unmask(features["input_ids"], features["masked_lm_positions"],
                      features["masked_lm_ids"], features["masked_lm_weights"])
    input_mask = features["input_mask"]
    shape = tf.shape(original)
    batch, length = shape[0], shape[1]
    num_slots = max_predictions_per_seq
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)

    candidate = ((input_mask > 0) & (original != cls_id) & (original != sep_id)
                 & (original != pad_id))
    num_tokens = tf.reduce_sum(input_mask, axis=1)
    num_to_predict = tf.cast(tf.round(tf.cast(num_tokens, tf.float32) * masked_lm_prob), tf.int32)
    num_to_predict = tf.minimum(num_slots, tf.maximum(1, num_to_predict))
    num_to_predict = tf.minimum(num_to_predict,
                                tf.reduce_sum(tf.cast(candidate, tf.int32), axis=1))

    # Uniform choice without replacement: the top-P of i.i.d. uniform scores (non-candidates
    # score -1, below every candidate); keep the first n of them.
    scores = tf.random.stateless_uniform([batch, length], seeds[0])
    scores = tf.where(candidate, scores, -1.0)
    # Static: parse_example gives a known length; a Python int keeps the graph free of
    # data-dependent control flow (no autograph needed).
    k = min(num_slots, int(original.shape[1]))
    _, chosen = tf.math.top_k(scores, k=k, sorted=True)  # [batch, k]
    keep = tf.range(k)[None, :] < num_to_predict[:, None]
    # Increasing position order, the padding slots (position `length`) last.
    chosen = tf.sort(tf.where(keep, chosen, length), axis=1)
    keep = chosen < length
    positions = tf.where(keep, chosen, 0)
    if k < num_slots:  # sequences shorter than max_predictions_per_seq
        positions = tf.pad(positions, [[0, 0], [0, num_slots - k]])
        keep = tf.pad(keep, [[0, 0], [0, num_slots - k]])
    labels = tf.where(keep, tf.gather(original, positions, batch_dims=1), 0)

    # 80% [MASK], 10% random id, 10% unchanged.
    action = tf.random.stateless_uniform([batch, num_slots], seeds[1])
    random_ids = tf.random.stateless_uniform([batch, num_slots], seeds[2], minval=0,
                                             maxval=vocab_size, dtype=tf.int32)
    replacement = tf.where(action < 0.8, mask_id, tf.where(action < 0.9, labels, random_ids))
    rows = tf.broadcast_to(tf.range(batch)[:, None], [batch, num_slots])
    index = tf.stack([rows, positions], axis=-1)
    input_ids = tf.tensor_scatter_nd_update(
        original, tf.boolean_mask(index, keep), tf.boolean_mask(replacement, keep))

    out = dict(features)
    out.update(input_ids=input_ids, masked_lm_positions=positions, masked_lm_ids=labels,
               masked_lm_weights=tf.cast(keep, tf.float32))
    return out
