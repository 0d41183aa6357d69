"""Bad input is caught early, naming the file and the expected and found values."""

import logging

import numpy as np
import pytest

from bert_jax.data import checks, pretrain, shards
from bert_jax.data.features import DataCheckError
from tests.data import fixtures


def _cfg(pattern, **kw):
    base = dict(train_files=pattern, max_seq_length=32, max_predictions_per_seq=5,
                shuffle_buffer=16, vocab_size=fixtures.VOCAB_SIZE)
    base.update(kw)
    return pretrain.data_config(**base)


@pytest.fixture()
def good(tmp_path):
    paths, _ = fixtures.write_files(tmp_path, 3, 20, seq=32, preds=5)
    return tmp_path, paths


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2 + 40])  # inside a record body


def test_check_input_passes_on_good_files(good):
    d, _ = good
    pretrain.check_input(_cfg(str(d / "*.tfrecord")), process_index=0, process_count=1)


def test_wrong_lengths_name_file_expected_and_found(good):
    d, paths = good
    with pytest.raises(DataCheckError) as e:
        pretrain.check_input(_cfg(str(d / "*.tfrecord"), max_seq_length=128,
                                  max_predictions_per_seq=20),
                             process_index=0, process_count=1)
    msg = str(e.value)
    assert paths[0] in msg
    assert "input_ids: expected 128 values (max_seq_length=128), found 32" in msg
    assert "masked_lm_ids: expected 20 values (max_predictions_per_seq=20), found 5" in msg


def test_ids_outside_vocab_and_missing_features(tmp_path):
    rng = np.random.default_rng(0)
    rec = fixtures.make_record(rng, 0, 0, 32, 5)
    rec["input_ids"][5] = 50000
    bad = dict(rec)
    del bad["next_sentence_labels"]
    import tensorflow as tf
    with tf.io.TFRecordWriter(str(tmp_path / "a.tfrecord")) as w:
        w.write(fixtures.serialize(rec))
    with tf.io.TFRecordWriter(str(tmp_path / "b.tfrecord")) as w:
        w.write(fixtures.serialize(bad))
    with pytest.raises(DataCheckError) as e:
        pretrain.check_input(_cfg(str(tmp_path / "*.tfrecord")), process_index=0,
                             process_count=1)
    msg = str(e.value)
    assert (f"{tmp_path / 'a.tfrecord'} record 0: input_ids: expected values in [0, 2000) "
            f"(vocab_size=2000), found min 0, max 50000") in msg
    assert (f"{tmp_path / 'b.tfrecord'} record 0: missing feature(s) "
            f"['next_sentence_labels']") in msg


def test_check_batch():
    rng = np.random.default_rng(0)
    recs = [fixtures.make_record(rng, 0, i, 32, 5) for i in range(4)]
    batch = {k: np.stack([r[k] for r in recs]).astype(
        np.float32 if k == "masked_lm_weights" else np.int32) for k in recs[0]}
    batch["next_sentence_labels"] = batch["next_sentence_labels"][:, 0]
    batch["example_weights"] = np.ones(4, np.float32)
    checks.check_batch(batch, max_seq_length=32, max_predictions_per_seq=5, vocab_size=2000)
    batch["masked_lm_ids"] = batch["masked_lm_ids"].copy()
    batch["masked_lm_ids"][0, 0] = -1
    with pytest.raises(DataCheckError, match=r"(?s)gs://x/\*: .*masked_lm_ids: expected "
                       r"values in \[0, 2000\) \(vocab_size=2000\), found min -1"):
        checks.check_batch(batch, max_seq_length=32, max_predictions_per_seq=5,
                           vocab_size=2000, source="gs://x/*")
    with pytest.raises(DataCheckError, match=r"input_ids: expected shape \[batch, 64\]"
                       r", found \[4, 32\]"):
        checks.check_batch(batch, max_seq_length=64, max_predictions_per_seq=5)


def test_corrupt_shard_error_names_the_file(good):
    d, paths = good
    _truncate(paths[1])
    it = pretrain.train_iterator(_cfg(str(d / "*.tfrecord")), 8, process_index=0,
                                 process_count=1)
    with pytest.raises(shards.CorruptShardError) as e:
        for _ in range(20):
            next(it)
    assert paths[1] in str(e.value) and "truncated record" in str(e.value)
    assert paths[0] not in str(e.value) and paths[2] not in str(e.value)
    # the up-front check names it as well
    with pytest.raises(DataCheckError, match="unreadable"):
        pretrain.check_input(_cfg(str(d / "*.tfrecord"), check_records_per_file=100),
                             process_index=0, process_count=1)


def test_skip_corrupt_leaves_the_shard_out_with_a_count(good, caplog):
    d, paths = good
    _truncate(paths[2])
    open(d / "junk.tfrecord", "wb").write(b"not a tfrecord at all" * 10)
    caplog.set_level(logging.WARNING)
    it = pretrain.train_iterator(_cfg(str(d / "*.tfrecord"), skip_corrupt=True), 8,
                                 process_index=0, process_count=1)
    assert sorted(f for f, _, _ in it.skipped_files) == sorted([paths[2],
                                                                str(d / "junk.tfrecord")])
    assert it.files == paths[:2]
    assert "skipped 2 of 4 shards" in caplog.text
    seen = {fixtures.record_key(r)[0] for _ in range(10) for r in next(it)["input_ids"]}
    assert seen == {0, 1}


def test_cut_inside_a_record_header_is_caught_by_the_scan(good):
    """TF's reader takes a file cut inside a 12-byte record header for a clean end; the
    scan (skip_corrupt, eval counting, the doctor's --verify) compares sizes and says so."""
    d, paths = good
    data = open(paths[0], "rb").read()
    import struct
    offset = 0
    for _ in range(7):  # the start of record 7
        (n,) = struct.unpack("<Q", data[offset:offset + 8])
        offset += 16 + n
    open(paths[0], "wb").write(data[:offset + 5])
    count, error = shards.scan_file(paths[0])
    assert count == 7 and "truncated inside a record header" in error
    assert shards.scan_file(paths[1]) == (20, None)
    with pytest.raises(shards.CorruptShardError, match=paths[0]):
        shards.count_records(paths)
