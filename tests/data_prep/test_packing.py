"""create_pretraining_data --pack: the SPFHP packing (every sequence placed once, at most K
per row, lengths fit, a hand-computed histogram), the exact packed feature layout of a
hand-built row (values and protobuf bytes), and the tool's packed output unpacked again:
the same sequences, labels and every prediction of the same run without --pack."""

import hashlib

import numpy as np
import pytest

from bert_jax.data import features
from data_prep import packing, pipeline, tfrecord
from tests.data_prep.helpers import (SAMPLE, check_invariants, read_examples, restore,
                                     run_tool, unpack_rows)

CLS, SEP = 101, 102


def _check_strategies(strategies, histogram, max_length, k):
    placed = np.zeros_like(histogram)
    for count, lengths in strategies:
        assert count > 0 and 1 <= len(lengths) <= k and sum(lengths) <= max_length
        assert list(lengths) == sorted(lengths, reverse=True)
        for n in lengths:
            placed[n] += count
    np.testing.assert_array_equal(placed, histogram)  # every sequence exactly once


def test_spfhp_on_a_hand_computed_histogram():
    # Rows of 8, K = 3; sequences of 6, 6, 4, 2, 2, 2, 1 tokens. Longest first: the 6s open
    # two packs (room 2), the 4 opens one (room 4); the first 2 joins the 4 (the pack with
    # most room: 4 2, room 2); the next joins the last-opened pack of room 2 (4 2 2: full),
    # the third a 6 (6 2: full); the 1 joins the other 6 (6 1). 3 rows for 7 sequences.
    histogram = np.bincount([6, 6, 4, 2, 2, 2, 1], minlength=9)
    strategies = packing.spfhp(histogram, 8, 3)
    assert sorted(strategies) == [(1, (4, 2, 2)), (1, (6, 1)), (1, (6, 2))]
    _check_strategies(strategies, histogram, 8, 3)
    rows = sum(c for c, _ in strategies)
    assert histogram.sum() / rows == pytest.approx(7 / 3)          # packing factor
    assert 1 - 23 / (rows * 8) == pytest.approx(1 / 24)             # padding after
    # K = 1: one sequence per row; K = 2: the 4 2 2 row cannot be formed.
    assert sum(c for c, _ in packing.spfhp(histogram, 8, 1)) == 7
    _check_strategies(packing.spfhp(histogram, 8, 2), histogram, 8, 2)
    assert sum(c for c, _ in packing.spfhp(histogram, 8, 2)) == 4


@pytest.mark.parametrize("max_length,k", [(128, 3), (512, 3), (64, 2), (32, 5)])
def test_spfhp_places_every_sequence_once_within_the_limits(max_length, k):
    rng = np.random.default_rng(max_length + k)
    lengths = np.concatenate([rng.integers(5, max_length + 1, 700),
                              np.full(300, max_length - 3)])  # many near-full rows
    histogram = np.bincount(lengths, minlength=max_length + 1)
    strategies = packing.spfhp(histogram, max_length, k)
    _check_strategies(strategies, histogram, max_length, k)
    rows = sum(c for c, _ in strategies)
    # No worse than 10% above the simplest lower bound (every token in a full row).
    assert rows <= 1.1 * max(np.ceil(lengths.sum() / max_length), (lengths > max_length // 2).sum())


def test_assign_gives_every_sequence_one_row_and_keeps_every_prediction():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 60, 400)
    preds = packing.max_predictions(lengths, 20, 0.15)
    np.testing.assert_array_equal(preds, np.minimum(20, np.maximum(1, np.rint(lengths * 0.15))))
    slots = 12  # less than three sequences of 9 predictions: some rows give up one
    packs, moved = packing.assign(lengths, 128, 3, rng, preds, slots)
    flat = np.concatenate(packs)
    assert sorted(flat.tolist()) == list(range(400))
    assert all(1 <= len(p) <= 3 and lengths[p].sum() <= 128 and preds[p].sum() <= slots
               for p in packs)
    assert moved > 0
    unlimited, none_moved = packing.assign(lengths, 128, 3, np.random.default_rng(0))
    assert none_moved == 0 and len(packs) == len(unlimited) + moved


def _instances():
    """Two masked instances as instances.assemble returns them (S = 12, P = 3)."""
    S, P = 12, 3
    a = dict(ids=[CLS, 7, 103, SEP, 9, SEP], types=[0, 0, 0, 0, 1, 1], pos=[2], lab=[8], nsp=0)
    b = dict(ids=[CLS, 11, SEP, 103, 103, SEP], types=[0, 0, 0, 1, 1, 1], pos=[3, 4],
             lab=[13, 14], nsp=1)
    inst = {k: [] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                            "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")}
    for x in (a, b):
        n, m = len(x["ids"]), len(x["pos"])
        inst["input_ids"].append(x["ids"] + [0] * (S - n))
        inst["input_mask"].append([1] * n + [0] * (S - n))
        inst["segment_ids"].append(x["types"] + [0] * (S - n))
        inst["masked_lm_positions"].append(x["pos"] + [0] * (P - m))
        inst["masked_lm_ids"].append(x["lab"] + [0] * (P - m))
        inst["masked_lm_weights"].append([1.0] * m + [0.0] * (P - m))
        inst["next_sentence_labels"].append(x["nsp"])
    return {k: np.array(v, np.float32 if k == "masked_lm_weights" else np.int32)
            for k, v in inst.items()}


def test_packed_row_layout_values_and_bytes(tmp_path):
    tf = pytest.importorskip("tensorflow")
    slots = features.predictions_per_pack(3, 3)
    assert slots == 6 and features.predictions_per_pack(20, 3) == 23
    assert features.predictions_per_pack(80, 3) == 83 and features.predictions_per_pack(1, 3) == 3
    rows = packing.pack_rows(_instances(), [2], 3, slots)
    want = {
        "input_ids":       [[CLS, 7, 103, SEP, 9, SEP, CLS, 11, SEP, 103, 103, SEP]],
        "input_mask":      [[1] * 12],
        "segment_ids":     [[0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1]],
        "sequence_ids":    [[1] * 6 + [2] * 6],
        "position_ids":    [list(range(6)) * 2],
        "masked_lm_positions": [[2, 9, 10, 0, 0, 0]],
        "masked_lm_ids":   [[8, 13, 14, 0, 0, 0]],
        "masked_lm_weights": [[1, 1, 1, 0, 0, 0]],
        "next_sentence_positions": [[0, 6, 0]],
        "next_sentence_labels": [[0, 1, 0]],
        "next_sentence_weights": [[1, 1, 0]],
    }
    assert list(rows) == list(features.PACKED_FEATURES)
    for name, value in want.items():
        np.testing.assert_array_equal(rows[name], value, err_msg=name)
    # One sequence per row (two rows), with the padding at the end of each.
    two = packing.pack_rows(_instances(), [1, 1], 3, slots)
    np.testing.assert_array_equal(two["sequence_ids"], [[1] * 6 + [0] * 6] * 2)
    np.testing.assert_array_equal(two["position_ids"], [list(range(6)) + [0] * 6] * 2)
    np.testing.assert_array_equal(two["masked_lm_positions"][1], [3, 4, 0, 0, 0, 0])
    np.testing.assert_array_equal(two["next_sentence_weights"], [[1, 0, 0]] * 2)

    # The bytes: protobuf's own serializer of the same features, in the table's order.
    blob, _ = tfrecord.serialize_examples(rows, 30521, features.PACKED_FEATURES)
    (tmp_path / "row.tfrecord").write_bytes(blob)
    [record] = [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / "row.tfrecord"))]
    again = tf.train.Example()
    for name, (kind, _) in features.PACKED_FEATURES.items():
        f = again.features.feature[name]
        (f.float_list if kind == "float" else f.int64_list).value.extend(
            np.asarray(want[name][0]).tolist())
    assert tf.train.Example.FromString(record) == again
    assert len(record) == again.ByteSize()


@pytest.fixture(scope="module")
def packed_and_unpacked(tmp_path_factory):
    """britannica.txt at length 64 (half the targets short), with and without --pack."""
    tmp = tmp_path_factory.mktemp("pack")
    kw = dict(max_seq_length=64, max_predictions_per_seq=10, short_seq_prob=0.5)
    plain = run_tool([SAMPLE[0]], [tmp / "plain.tfrecord"], **kw)
    packed = run_tool([SAMPLE[0]], [tmp / "packed.tfrecord"], max_sequences_per_pack=3, **kw)
    return (plain, tmp / "plain.tfrecord"), (packed, tmp / "packed.tfrecord")


def test_unpacked_output_is_unchanged(packed_and_unpacked):
    """The bytes the tool wrote before --pack existed (sha256 of the same run then)."""
    (stats, path), _ = packed_and_unpacked
    assert stats.instances == stats.rows == 1866
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "05aafca6d6087d780cd03d476bd3b031078e9fcc073def37401107e398dc18aa")


def test_packed_output_holds_the_same_sequences_and_every_prediction(packed_and_unpacked):
    (plain_stats, plain_path), (stats, path) = packed_and_unpacked
    rows = read_examples([path], 64, 10, max_sequences_per_pack=3)
    assert rows["masked_lm_ids"].shape[1] == 13 and rows["next_sentence_labels"].shape[1] == 3
    assert len(rows["input_ids"]) == stats.rows < stats.instances == plain_stats.instances
    seqs = unpack_rows(rows, 10)
    assert len(seqs["input_ids"]) == stats.instances
    assert seqs["masked_lm_weights"].sum() == rows["masked_lm_weights"].sum() == stats.masked
    check_invariants(seqs, cls_id=CLS, sep_id=SEP, max_seq_length=64, max_predictions_per_seq=10)
    # Row structure: sequences back to back from position 0, padding only at the end.
    sid, mask = rows["sequence_ids"], rows["input_mask"]
    np.testing.assert_array_equal(mask, (sid > 0).astype(mask.dtype))
    assert (np.diff(sid, axis=1)[mask[:, 1:] > 0] >= 0).all() and (sid[:, 0] == 1).all()
    assert ((sid.max(1) >= 1) & (sid.max(1) <= 3)).all()
    # The same sequences (the masks are drawn anew), labels and segments as without --pack.
    plain = read_examples([plain_path], 64, 10)

    def keyed(ex):
        return sorted(zip(map(tuple, restore(ex).tolist()), map(tuple, ex["segment_ids"].tolist()),
                          ex["next_sentence_labels"].reshape(-1).tolist()))
    assert keyed(seqs) == keyed(plain)
    pad_before = 1 - plain["input_mask"].sum() / plain["input_mask"].size
    pad_after = 1 - mask.sum() / mask.size
    assert pad_after < pad_before / 2
    summary = stats.summary(max_seq_length=64, max_sequences_per_pack=3)
    assert (f"packing          {stats.instances / stats.rows:.3f} sequences per row (was 1; "
            f"at most 3, SPFHP): {stats.rows:,} rows") in summary
    assert (f"padding          {pad_before:.2%} of the tokens before packing, "
            f"{pad_after:.2%} after (rows of 64)") in summary


def test_summary_counts_sequences_moved_for_the_slots():
    stats = pipeline.Stats(instances=10, rows=5, instance_tokens=600, moved=2)
    text = stats.summary(max_seq_length=128, max_sequences_per_pack=3)
    assert "2.000 sequences per row" in text and "53.12% of the tokens before packing" in text
    assert "6.25% after" in text and "moved            2 sequences" in text
    assert "padding          53.12% of the tokens (rows of 128; --pack" in (
        pipeline.Stats(instances=10, rows=10, instance_tokens=600).summary(max_seq_length=128))
