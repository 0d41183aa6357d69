"""Degenerate pre-training TFRecords through the data doctor (`python -m bert_jax.data.inspect
--verify`) and through the run's check before compile (pretrain.check_input): empty files,
records missing a feature (also past the sample the first check reads), and records whose
tokens are mostly [UNK]. Each is named with the file (and record) and what was expected; the
doctor said "no problems found" to all of them before."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from absl import flags

from bert_jax.data import pretrain
from bert_jax.data.features import DataCheckError
from bert_jax.data import inspect as doctor
from bert_jax.tokenization import VocabError
from bert_jax.errors import UserError
from tests.conftest import REPO
from tests.data import fixtures

VOCAB = str(REPO / "data_prep" / "bert_uncased_vocab.txt")  # [UNK] = 100, as the fixtures'
EMPTY = "empty file (no records), expected TFRecords of create_pretraining_data.py"


def _write(path, records) -> str:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as w:
        for rec in records:
            w.write(fixtures.serialize(rec))
    return str(path)


def _records(n: int, seed: int = 0, unk_every: int = 0, drop: dict | None = None):
    """(n fixture records of length 32 with 5 predictions, [(unk, total) per record]).
    unk_every=k: every k-th real token of the text ([CLS] / [SEP] left out) is [UNK] (in
    input_ids, or in masked_lm_ids where that position is masked); drop={i: feature}:
    record i lacks that feature."""
    rng = np.random.default_rng(seed)
    out, counts = [], []
    for i in range(n):
        rec = fixtures.make_record(rng, 0, i, 32, 5)
        masked = {int(p): j for j, (p, w) in enumerate(zip(rec["masked_lm_positions"],
                                                             rec["masked_lm_weights"])) if w}
        text = [p for p in np.flatnonzero(rec["input_mask"])
                if rec["input_ids"][p] not in (fixtures.CLS, fixtures.SEP) or p in masked]
        chosen = text[::unk_every] if unk_every else []
        for p in chosen:
            if p in masked:
                rec["masked_lm_ids"][masked[p]] = fixtures.UNK
            else:
                rec["input_ids"][p] = fixtures.UNK
        counts.append((len(chosen), len(text)))
        for feature in [f for j, f in (drop or {}).items() if j == i]:
            del rec[feature]
        out.append(rec)
    return out, counts


def _fraction(counts) -> float:
    return sum(u for u, _ in counts) / sum(t for _, t in counts)


def _report(pattern, **kw):
    return doctor.report(pattern, vocab_file=VOCAB, max_seq_length=32,
                         max_predictions_per_seq=5, num_records=2, verify=True, **kw)


def test_doctor_names_empty_files(tmp_path):
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    r = _report(str(empty))
    assert r["problems"] == [f"{empty}: {EMPTY}"]
    good = _write(tmp_path / "good.tfrecord", _records(3)[0])
    r = _report(f"{empty},{good}")
    assert r["problems"] == [f"{empty}: {EMPTY}"]
    assert "PROBLEMS: 1" in doctor.format_report(r)


def test_doctor_verify_parses_every_record(tmp_path):
    """Record 6 lacks a feature: the sample (2 records) misses it, --verify names it."""
    path = _write(tmp_path / "a.tfrecord", _records(8, drop={6: "next_sentence_labels"})[0])
    r = doctor.report(path, max_seq_length=32, max_predictions_per_seq=5, num_records=2)
    assert r["problems"] == []  # the sample alone reads records 0 and 1
    r = _report(path)
    assert r["problems"] == [f"{path} record 6: missing feature(s) ['next_sentence_labels']; "
                             f"found ['input_ids', 'input_mask', 'masked_lm_ids', "
                             f"'masked_lm_positions', 'masked_lm_weights', 'segment_ids']"]


def test_doctor_refuses_mostly_unknown_tokens_and_warns_on_some(tmp_path):
    records, counts = _records(4, unk_every=1)
    path = _write(tmp_path / "unk.tfrecord", records)
    r = _report(path)
    assert r["unk_fraction"] == 1.0  # of the 2 records read
    (problem,) = r["problems"]
    assert problem == (f"{path} (the 2 records read): 100.0% of {sum(t for _, t in counts[:2])} "
                       f"word pieces are [UNK] with the vocabulary {VOCAB}, expected under 5% "
                       f"for a vocabulary that fits the text: use the model's own vocabulary "
                       f"and its casing (do_lower_case)")
    records, counts = _records(4, unk_every=4)
    path = _write(tmp_path / "unk.tfrecord", records)
    r = _report(path)
    assert r["problems"] == [] and r["unk_fraction"] == pytest.approx(_fraction(counts[:2]))
    assert 0.2 < r["unk_fraction"] < 0.3
    (warning,) = r["warnings"]
    assert warning.startswith(f"{path} (the 2 records read): {r['unk_fraction']:.1%} of ")
    text = doctor.format_report(r)
    assert f"WARNING: {warning}" in text and "no problems found" in text
    assert "[UNK]: 0.00% of the real tokens" in doctor.format_report(
        _report(_write(tmp_path / "ok.tfrecord", _records(4)[0])))


def test_doctor_cli_exits_1_on_an_empty_file(tmp_path, capsys):
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["inspect", f"--input={tmp_path}/*.tfrecord", "--verify"])
    try:
        with pytest.raises(SystemExit) as e:
            doctor.main([])
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr().out
    assert e.value.code == 1 and f"{tmp_path}/empty.tfrecord: {EMPTY}" in out, out


def _cfg(pattern):
    return pretrain.data_config(train_files=pattern, max_seq_length=32,
                                max_predictions_per_seq=5, vocab_file=VOCAB)


@pytest.mark.parametrize("case", ["empty", "missing_feature"])
def test_run_check_is_one_line_naming_the_file(case, tmp_path):
    path = tmp_path / f"{case}.tfrecord"
    if case == "empty":
        path.write_bytes(b"")
        expected = f"{path}: {EMPTY}"
    else:
        _write(path, _records(3, drop={0: "masked_lm_ids"})[0])
        expected = f"{path} record 0: missing feature(s) ['masked_lm_ids']"
    with pytest.raises(DataCheckError) as e:
        pretrain.check_input(_cfg(str(path)), process_index=0, process_count=1)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg and expected in msg, msg


def test_run_check_refuses_mostly_unknown_tokens_and_warns_on_some(tmp_path, caplog):
    path = _write(tmp_path / "unk.tfrecord", _records(4, unk_every=1)[0])
    with pytest.raises(VocabError) as e:
        pretrain.check_input(_cfg(path), process_index=0, process_count=1)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg.startswith(f"{path} (the first 2 records): 100.0% of ") and VOCAB in msg, msg
    records, counts = _records(4, unk_every=4)
    _write(tmp_path / "unk.tfrecord", records)
    caplog.set_level(logging.WARNING)
    pretrain.check_input(_cfg(path), process_index=0, process_count=1)
    (warning,) = [r.getMessage() for r in caplog.records if "[UNK]" in r.getMessage()]
    assert warning.startswith(f"{path} (the first 2 records): {_fraction(counts[:2]):.1%} "
                              f"of {sum(t for _, t in counts[:2])} word pieces are [UNK] with "
                              f"the vocabulary {VOCAB}"), warning


@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_record_missing_a_feature_past_the_check_is_one_line_mid_run(split, tmp_path):
    """The check before compile reads 2 records; record 6 lacks a feature: the iterators
    (training, and evaluation which the run builds at each eval) name the files and the
    lengths expected (a raw tf InvalidArgumentError before)."""
    path = _write(tmp_path / "a.tfrecord", _records(8, drop={6: "masked_lm_weights"})[0])
    cfg = _cfg(path)
    cfg.update(dict(eval_files=path, shuffle=False))
    pretrain.check_input(cfg, process_index=0, process_count=1)
    with pytest.raises(DataCheckError) as e:
        if split == "train":
            it = pretrain.train_iterator(cfg, 4, process_index=0, process_count=1)
            for _ in range(3):
                next(it)
        else:
            list(pretrain.eval_iterator(cfg, 4, process_index=0, process_count=1))
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg.startswith(f"cannot parse the records of {path} as BERT pre-training features "
                          f"with max_seq_length=32, max_predictions_per_seq=5: "), msg
    assert "masked_lm_weights" in msg and "inspect --verify" in msg, msg
