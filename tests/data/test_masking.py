"""Dynamic (RoBERTa) re-masking: invariants on hand-built batches and the 80/10/10 split."""

import numpy as np
import tensorflow as tf

from bert_jax.data import masking
from tests.data import fixtures

PARAMS = dict(max_predictions_per_seq=20, masked_lm_prob=0.15,
              vocab_size=fixtures.VOCAB_SIZE, cls_id=fixtures.CLS, sep_id=fixtures.SEP,
              pad_id=fixtures.PAD, mask_id=fixtures.MASK)


def _batch(n=64, seq=128, preds=20, seed=0):
    rng = np.random.default_rng(seed)
    recs = [fixtures.make_record(rng, 0, i, seq, preds) for i in range(n)]
    out = {k: np.stack([r[k] for r in recs]) for k in recs[0]}
    out = {k: (v.astype(np.float32) if v.dtype == np.float32 else v.astype(np.int32))
           for k, v in out.items()}
    out["next_sentence_labels"] = out["next_sentence_labels"][:, 0]
    return out


def _original(b):
    ids = b["input_ids"].copy()
    for i in range(ids.shape[0]):
        real = b["masked_lm_weights"][i] > 0
        ids[i, b["masked_lm_positions"][i][real]] = b["masked_lm_ids"][i][real]
    return ids


def test_unmask_writes_the_labels_back():
    b = _batch()
    got = masking.unmask(tf.constant(b["input_ids"]), tf.constant(b["masked_lm_positions"]),
                         tf.constant(b["masked_lm_ids"]), tf.constant(b["masked_lm_weights"]))
    np.testing.assert_array_equal(got.numpy(), _original(b))
    # padding slots point at position 0 ([CLS]) with id 0: they must not overwrite it
    assert (got.numpy()[:, 0] == fixtures.CLS).all()


def test_remask_invariants():
    b = _batch()
    original = _original(b)
    out = {k: v.numpy() for k, v in masking.remask(
        {k: tf.constant(v) for k, v in b.items()}, tf.constant([3, 4]), **PARAMS).items()}
    lengths = b["input_mask"].sum(1)
    for i in range(len(lengths)):
        n = int(out["masked_lm_weights"][i].sum())
        assert n == min(20, max(1, round(lengths[i] * 0.15))), (i, lengths[i], n)
        pos = out["masked_lm_positions"][i][:n]
        assert np.all(np.diff(pos) > 0), "positions unique and increasing"
        assert np.all(out["masked_lm_weights"][i][:n] == 1)
        assert not out["masked_lm_positions"][i][n:].any() and not out["masked_lm_ids"][i][n:].any()
        assert np.all(pos < lengths[i]), "only real tokens"
        assert not np.isin(original[i][pos], [fixtures.CLS, fixtures.SEP, fixtures.PAD]).any()
        np.testing.assert_array_equal(out["masked_lm_ids"][i][:n], original[i][pos])
        # outside the chosen positions the ids are the original ones
        keep = np.ones(original.shape[1], bool)
        keep[pos] = False
        np.testing.assert_array_equal(out["input_ids"][i][keep], original[i][keep])
    for k in ("input_mask", "segment_ids", "next_sentence_labels"):
        np.testing.assert_array_equal(out[k], b[k])
    # a re-mask of a re-masked batch starts from the same original ids
    again = masking.unmask(*(tf.constant(out[k]) for k in (
        "input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")))
    np.testing.assert_array_equal(again.numpy(), original)


def test_remask_is_seeded_and_fresh_per_seed():
    b = {k: tf.constant(v) for k, v in _batch(n=8).items()}
    one = masking.remask(b, tf.constant([1, 2]), **PARAMS)
    same = masking.remask(b, tf.constant([1, 2]), **PARAMS)
    other = masking.remask(b, tf.constant([1, 3]), **PARAMS)
    np.testing.assert_array_equal(one["input_ids"].numpy(), same["input_ids"].numpy())
    assert not np.array_equal(one["masked_lm_positions"].numpy(),
                              other["masked_lm_positions"].numpy())


def test_80_10_10_split():
    b = _batch(n=256, seed=1)
    original = _original(b)
    counts = np.zeros(3)
    for seed in range(4):
        out = masking.remask({k: tf.constant(v) for k, v in b.items()},
                             tf.constant([seed, 0]), **PARAMS)
        ids, pos = out["input_ids"].numpy(), out["masked_lm_positions"].numpy()
        w = out["masked_lm_weights"].numpy() > 0
        at = np.take_along_axis(ids, pos, 1)[w]
        orig = np.take_along_axis(original, pos, 1)[w]
        is_mask = at == fixtures.MASK
        same = (at == orig) & ~is_mask
        counts += [is_mask.sum(), same.sum(), (~is_mask & ~same).sum()]
    frac = counts / counts.sum()
    # ~22k masked slots: 3 sigma of a 10% share is ~0.6 points. A random id equal to the
    # original (p = 1/1800) hardly moves the "unchanged" share.
    np.testing.assert_allclose(frac, [0.8, 0.1, 0.1], atol=0.012)


def test_short_sequences_and_fewer_candidates_than_slots():
    # length 8: [CLS] a b [SEP] c d e [SEP]; 5 candidates, max_predictions 6 > ... and > length
    ids = np.array([[101, 300, 301, 102, 302, 303, 304, 102]], np.int32)
    b = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
         "masked_lm_positions": np.zeros((1, 10), np.int32),
         "masked_lm_ids": np.zeros((1, 10), np.int32),
         "masked_lm_weights": np.zeros((1, 10), np.float32),
         "next_sentence_labels": np.zeros((1,), np.int32)}
    params = dict(PARAMS, max_predictions_per_seq=10, masked_lm_prob=1.0)
    out = masking.remask({k: tf.constant(v) for k, v in b.items()}, tf.constant([0, 0]),
                         **params)
    assert out["masked_lm_positions"].shape == (1, 10)
    np.testing.assert_array_equal(out["masked_lm_positions"].numpy()[0],
                                  [1, 2, 4, 5, 6, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(out["masked_lm_ids"].numpy()[0],
                                  [300, 301, 302, 303, 304, 0, 0, 0, 0, 0])
