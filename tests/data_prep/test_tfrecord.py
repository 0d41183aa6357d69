"""The hand-written Example serializer against TensorFlow's parser and protobuf."""

import numpy as np
import pytest

from bert_jax.data.features import PRETRAIN_FEATURES
from data_prep import tfrecord

tf = pytest.importorskip("tensorflow")


def _batch(rng, n, S, P, max_id):
    edges = np.array([e for e in (0, 1, 127, 128, 16383, 16384, 2**21 - 1) if e <= max_id])
    ids = rng.integers(0, max_id + 1, (n, S))
    ids[0, :min(S, len(edges) + 1)] = np.append(edges, max_id)[:S]  # varint length boundaries
    return {
        "input_ids": ids,
        "input_mask": rng.integers(0, 2, (n, S)),
        "segment_ids": rng.integers(0, 2, (n, S)),
        "masked_lm_positions": rng.integers(0, S, (n, P)),
        "masked_lm_ids": rng.integers(0, max_id + 1, (n, P)),
        "masked_lm_weights": rng.choice(np.float32([0.0, 1.0, 0.5, 1e-8, 3.25]), (n, P)),
        "next_sentence_labels": rng.integers(0, 2, n),
    }


@pytest.mark.parametrize("S,P,max_id", [(128, 20, 30521), (512, 80, 2**21 - 1), (8, 1, 5)])
def test_parses_to_same_values_and_same_bytes_as_tf(tmp_path, S, P, max_id):
    """Varints of 1, 2, 3 bytes (every length boundary), positions past 127, odd floats."""
    rng = np.random.default_rng(S)
    n = 300
    feats = _batch(rng, n, S, P, max_id)
    blob, ends = tfrecord.serialize_examples(feats, max(max_id, S))
    path = tmp_path / "x.tfrecord"
    path.write_bytes(blob)
    assert ends[-1] == len(blob)
    spec = {k: tf.io.FixedLenFeature([feats[k].shape[1] if feats[k].ndim > 1 else 1],
                                     tf.float32 if dt == "float" else tf.int64)
            for k, (dt, _) in PRETRAIN_FEATURES.items()}
    records = list(tf.data.TFRecordDataset(str(path)))  # TF checks both CRCs
    assert len(records) == n
    parsed = tf.io.parse_example(tf.stack(records), spec)
    for k, v in feats.items():
        np.testing.assert_array_equal(parsed[k].numpy().reshape(n, -1),
                                      np.asarray(v).reshape(n, -1).astype(parsed[k].dtype.as_numpy_dtype))
    # Same bytes as protobuf's own serializer, feature for feature.
    for i in (0, n - 1):
        ex = tf.train.Example.FromString(records[i].numpy())
        again = tf.train.Example()
        for k, (dt, _) in PRETRAIN_FEATURES.items():
            vals = np.asarray(feats[k][i]).reshape(-1)
            f = again.features.feature[k]
            (f.float_list if dt == "float" else f.int64_list).value.extend(vals.tolist())
        assert ex == again
        assert len(records[i].numpy()) == again.ByteSize()
    # Our own reader (used by tools without TF) agrees and checks CRCs.
    assert [r.numpy() for r in records] == list(tfrecord.read_records(str(path)))


def test_reader_detects_corruption(tmp_path):
    feats = _batch(np.random.default_rng(0), 3, 16, 4, 1000)
    blob, _ = tfrecord.serialize_examples(feats, 2**21 - 1)
    bad = bytearray(blob)
    bad[40] ^= 0xFF
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(bytes(bad))
    with pytest.raises(ValueError, match="bad data crc"):
        list(tfrecord.read_records(str(path)))


def test_rejects_negative_and_too_large_values():
    feats = _batch(np.random.default_rng(0), 2, 16, 4, 1000)
    feats["input_ids"][0, 0] = -1
    with pytest.raises(ValueError, match="negative"):
        tfrecord.serialize_examples(feats, 1000)
    feats["input_ids"][0, 0] = 2**21
    with pytest.raises(ValueError, match="varint bytes"):
        tfrecord.serialize_examples(feats, 1000)
