"""Acceptance: TFRecords written by data_prep read back identically, all seven features."""

import numpy as np
import pytest

from bert_jax.data import features as features_lib
from bert_jax.data import pretrain
from tests.data import fixtures

FEATURES = list(features_lib.PRETRAIN_FEATURES)


def _eval_records(cfg, batch_size: int):
    """{input_ids row bytes: {feature: row}} of every real row of one eval pass."""
    out = []
    for batch in pretrain.eval_iterator(cfg, batch_size, process_index=0, process_count=1):
        for row in np.nonzero(batch["example_weights"] > 0)[0]:
            out.append({k: batch[k][row] for k in FEATURES})
    return out


def test_data_prep_serializer_reads_back_identically(tmp_path):
    """Known arrays -> data_prep's writer -> our pipeline == the arrays, exactly."""
    from data_prep import tfrecord as writer
    rng = np.random.default_rng(3)
    recs = [fixtures.make_record(rng, f, i, 48, 7) for f in range(2) for i in range(37)]
    for f in range(2):
        part = recs[f * 37:(f + 1) * 37]
        arrays = {k: np.stack([r[k] for r in part]) for k in FEATURES}
        blob, _ = writer.serialize_examples(arrays, max_id=fixtures.VOCAB_SIZE - 1)
        (tmp_path / f"dp-{f}.tfrecord").write_bytes(blob)
    cfg = pretrain.data_config(train_files=str(tmp_path / "dp-*"),
                               eval_files=str(tmp_path / "dp-*"), max_seq_length=48,
                               max_predictions_per_seq=7,
                               vocab_size=fixtures.VOCAB_SIZE)
    pretrain.check_input(cfg, process_index=0, process_count=1)
    got = {fixtures.record_key(r["input_ids"]): r for r in _eval_records(cfg, 16)}
    assert len(got) == len(recs)
    for rec in recs:
        row = got[fixtures.record_key(rec["input_ids"])]
        for name in FEATURES:
            np.testing.assert_array_equal(row[name], rec[name].reshape(-1), err_msg=name)
            assert row[name].dtype == (np.float32 if name == "masked_lm_weights" else np.int32)


@pytest.fixture(scope="module")
def data_prep_run(tmp_path_factory):
    from tests.data_prep import helpers
    d = tmp_path_factory.mktemp("dp")
    corpus = d / "corpus.txt"
    text = open([p for p in helpers.SAMPLE if p.endswith("britannica.txt")][0]).read()
    corpus.write_text(text[:60_000])
    outs = [d / f"sample-{i}.tfrecord" for i in range(3)]
    helpers.run_tool([corpus], outs, max_seq_length=64, max_predictions_per_seq=10,
                     dupe_factor=2)
    return d, outs, helpers


def test_data_prep_tool_output_reads_back_identically(data_prep_run):
    """create_pretraining_data's files, read by our pipeline == the same bytes decoded by
    protobuf (tf.train.Example) record by record."""
    from bert_jax.data import checks
    from data_prep import tfrecord as writer
    d, outs, helpers = data_prep_run
    expected = []
    for path in outs:
        for raw in writer.read_records(str(path)):
            decoded = checks.decode_example(raw)
            expected.append({k: decoded[k][1] for k in FEATURES})
    assert len(expected) > 100
    cfg = pretrain.data_config(train_files=str(d / "sample-*"), eval_files=str(d / "sample-*"),
                               max_seq_length=64, max_predictions_per_seq=10,
                               vocab_file=helpers.VOCAB)
    pretrain.check_input(cfg, process_index=0, process_count=1)
    got = _eval_records(cfg, 32)
    assert len(got) == len(expected)

    def key(r):
        return tuple(np.concatenate([r[k].astype(np.float64).reshape(-1) for k in FEATURES]))
    assert sorted(map(key, got)) == sorted(map(key, expected))
    # and the training iterator yields the same records, re-masked on the fly if asked
    cfg.dynamic_masking = True
    batch = next(pretrain.train_iterator(cfg, 32, process_index=0, process_count=1))
    originals = {tuple(helpers.restore({k: np.stack([e[k]]) for k in FEATURES})[0]): e
                 for e in expected}
    remasked = helpers.restore(batch)
    assert all(tuple(row) in originals for row in remasked)
    # Parity with data_prep's own masking: the same number of predictions per record, and
    # a different choice of positions (a fresh mask).
    same_positions = 0
    for row, ids in enumerate(remasked):
        static = originals[tuple(ids)]
        assert batch["masked_lm_weights"][row].sum() == static["masked_lm_weights"].sum()
        same_positions += np.array_equal(batch["masked_lm_positions"][row],
                                         static["masked_lm_positions"])
    assert same_positions < len(remasked) // 4
