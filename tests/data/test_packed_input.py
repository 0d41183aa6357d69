"""Packed TFRecords (data_prep --pack) through the input pipeline and the data doctor: read
back exactly (train and eval), recognised by their features, a mix of packed and unpacked
files refused naming the file, and every broken piece of a packed row's layout named."""

import numpy as np
import pytest

from bert_jax.data import checks, features, pretrain
from bert_jax.data.features import DataCheckError
from bert_jax.data import inspect as doctor
from data_prep import packing, tfrecord
from tests.data import fixtures

S, P, K = 48, 5, 3
SLOTS = features.predictions_per_pack(P, K)  # 8


def _rows(seed: int, n_rows: int) -> dict:
    """n_rows packed rows of 1-3 of fixtures' records (12-16 tokens each)."""
    rng = np.random.default_rng(seed)
    sizes = [(1, 3, 2)[i % 3] for i in range(n_rows)]
    recs = [fixtures.make_record(rng, seed, i, 16, P) for i in range(sum(sizes))]
    inst = {name: np.stack([r[name] for r in recs]) for name in recs[0]}
    for name in ("input_ids", "input_mask", "segment_ids"):
        inst[name] = np.pad(inst[name], ((0, 0), (0, S - 16)))
    inst["next_sentence_labels"] = inst["next_sentence_labels"][:, 0]
    return packing.pack_rows(inst, sizes, K, SLOTS)


def _write(path, rows) -> str:
    blob, _ = tfrecord.serialize_examples(rows, fixtures.VOCAB_SIZE, features.PACKED_FEATURES)
    path.write_bytes(blob)
    return str(path)


def _cfg(train="", eval_="", **kw):
    return pretrain.data_config(train_files=train, eval_files=eval_, max_seq_length=S,
                                max_predictions_per_seq=P, shuffle=False,
                                vocab_size=fixtures.VOCAB_SIZE, **kw)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    d = tmp_path_factory.mktemp("packed")
    rows = _rows(1, 12)
    return _write(d / "packed.tfrecord", rows), rows


def test_packed_files_read_back_exactly_for_training_and_evaluation(packed):
    path, rows = packed
    cfg = _cfg(train=path, eval_=path)
    pretrain.check_input(cfg)  # layout, lengths and [CLS]s of the first records: fine
    it = pretrain.train_iterator(cfg, 4, process_index=0, process_count=1)
    assert it.max_sequences_per_pack == K
    got = [next(it) for _ in range(3)]
    for name in features.PACKED_FEATURES:
        np.testing.assert_array_equal(np.concatenate([b[name] for b in got]), rows[name],
                                      err_msg=name)
        assert got[0][name].dtype == (np.float32 if name.endswith("weights") else np.int32)
    assert got[0]["next_sentence_labels"].shape == (4, K)
    assert got[0]["masked_lm_ids"].shape == (4, SLOTS)
    checks.check_batch(got[0], max_seq_length=S, max_predictions_per_seq=P,
                       vocab_size=fixtures.VOCAB_SIZE)
    ev = pretrain.eval_iterator(_cfg(eval_=path), 8, process_index=0,
                                process_count=1)
    # Evaluation reads its batches in any order (map with deterministic=False): the full
    # batch and the one of 4 records + 4 filler rows, whichever comes first.
    batches = sorted(ev, key=lambda b: -b["example_weights"].sum())
    assert len(batches) == 2 and batches[1]["example_weights"].tolist() == [1] * 4 + [0] * 4
    got = np.concatenate([batches[0]["sequence_ids"], batches[1]["sequence_ids"][:4]])
    assert sorted(map(bytes, got)) == sorted(map(bytes, rows["sequence_ids"]))
    assert not batches[1]["next_sentence_weights"][4:].any()  # filler rows: no sequence


def test_unpacked_and_packed_files_in_one_set_are_refused_naming_the_file(packed, tmp_path):
    path, _ = packed
    plain, _ = fixtures.write_files(tmp_path, 1, [4], seq=S, preds=P)
    cfg = _cfg(train=f"{path},{plain[0]}")
    with pytest.raises(DataCheckError) as e:
        pretrain.check_input(cfg)
    msg = str(e.value)
    assert "\n" not in msg and f"{plain[0]} record 0: unpacked rows (one sequence per row), " \
        f"but {path} record 0 holds packed rows (data_prep --pack, up to 3 sequences per " \
        f"row): the files of data.train_files must be all packed or all unpacked" in msg
    # Packed training files with unpacked evaluation files are fine (each set is one kind).
    pretrain.check_input(_cfg(train=path, eval_=plain[0]))
    with pytest.raises(DataCheckError, match="dynamic_masking=True re-masks unpacked"):
        pretrain.check_input(_cfg(train=path, dynamic_masking=True))


def _broken(mutate):
    rows = _rows(1, 3)
    row = {name: np.array(v[1]) for name, v in rows.items()}  # 3 sequences: 0, 16, 32 or so
    mutate(row)
    return {name: ("float" if features.PACKED_FEATURES[name][0] == "float" else "int64", v)
            for name, v in row.items()}


def _shift_second_start(r):
    r["next_sentence_positions"][1] += 1


def _no_restart(r):
    r["position_ids"][r["sequence_ids"] > 0] = np.arange((r["sequence_ids"] > 0).sum())


def _gap(r):
    r["sequence_ids"][3] = 0


def _out_of_order(r):
    r["sequence_ids"][r["sequence_ids"] == 2] = 3


@pytest.mark.parametrize("mutate,message", [
    (_no_restart, "position_ids: expected 0, 1, ... restarting at every sequence"),
    (_shift_second_start, "next_sentence_positions: expected each sequence's first position"),
    (lambda r: r["input_ids"].__setitem__(r["next_sentence_positions"][2], 555),
     "input_ids: expected [CLS] (id 101) at each sequence's first position"),
    (lambda r: r["next_sentence_weights"].__setitem__(2, 0.0),
     "next_sentence_weights: expected 1.0 for each of the row's 3 sequence(s), then 0.0, "
     "found [1.0, 1.0, 0.0]"),
    (_gap, "sequence_ids: padding (0) at position 3 before a sequence"),
    (_out_of_order, "sequence_ids: expected runs numbered 1, 2, ... in order, found 1 x"),
    (lambda r: r["input_mask"].__setitem__(-1, 1), "input_mask: expected 1 exactly on the "
     "sequences' tokens (sequence_ids > 0), found 1 at position 47"),
    (lambda r: r["masked_lm_positions"].__setitem__(0, 0),
     "masked_lm_positions: a prediction at position 0, outside the row's sequences or on a "
     "sequence's [CLS]"),
    (lambda r: r["sequence_ids"].__setitem__(0, 7), "sequence_ids: expected values in [0, 3]"),
])
def test_the_doctor_names_each_broken_piece_of_a_packed_row(mutate, message):
    assert checks.check_record(_broken(lambda r: None), max_seq_length=S,
                               max_predictions_per_seq=P, cls_id=fixtures.CLS) == []
    problems = checks.check_record(_broken(mutate), max_seq_length=S, max_predictions_per_seq=P,
                                   cls_id=fixtures.CLS)
    assert any(message in p for p in problems), problems


def test_doctor_report_on_packed_files(packed, tmp_path):
    path, rows = packed
    r = doctor.report(path, max_seq_length=S, max_predictions_per_seq=P, verify=True)
    assert r["problems"] == [] and r["max_sequences_per_pack"] == K
    assert r["sequences_per_row"] == pytest.approx(rows["next_sentence_weights"].sum() / 12)
    assert r["padding_fraction"] == pytest.approx(1 - rows["input_mask"].mean())
    text = doctor.format_report(r)
    assert (f"layout: packed rows (data_prep --pack, up to 3 sequences per row); 2.000 "
            f"sequences per row, padding {1 - rows['input_mask'].mean():.2%}") in text
    inferred = doctor.report(path)  # the lengths inferred: P from the P + K slots
    assert (inferred["max_seq_length"], inferred["max_predictions_per_seq"]) == (S, P)
    bad = dict(rows)
    bad["position_ids"] = np.broadcast_to(np.arange(S), (12, S)).astype(np.int32)
    r = doctor.report(_write(tmp_path / "bad.tfrecord", bad))
    assert any("position_ids: expected 0, 1, ... restarting" in p for p in r["problems"])
