"""The data doctor: its figures on hand-made files whose statistics we know exactly."""

import numpy as np
import pytest
from absl import flags

from bert_jax.data import inspect as doctor
from tests.data import fixtures


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("doctor")
    paths, records = fixtures.write_files(d, 3, 30, seq=32, preds=5, seed=5)
    vocab = [f"w{i}" for i in range(fixtures.VOCAB_SIZE)]
    for i, tok in ((0, "[PAD]"), (100, "[UNK]"), (101, "[CLS]"), (102, "[SEP]"), (103, "[MASK]")):
        vocab[i] = tok
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return d, records


def test_report_figures(data):
    d, records = data
    r = doctor.report(str(d / "*.tfrecord"), vocab_file=str(d / "vocab.txt"),
                      max_seq_length=32, max_predictions_per_seq=5, num_records=90)
    recs = list(records.values())
    assert r["num_records"] == r["num_well_formed"] == 90 and r["problems"] == []
    masked = sum(rec["masked_lm_weights"].sum() for rec in recs)
    tokens = sum(rec["input_mask"].sum() for rec in recs)
    assert r["mask_ratio"] == pytest.approx(masked / tokens)
    is_mask = sum(((rec["input_ids"][rec["masked_lm_positions"]] == fixtures.MASK)
                   * rec["masked_lm_weights"]).sum() for rec in recs)
    assert r["mask_split"]["mask"] == pytest.approx(is_mask / masked)
    assert sum(r["mask_split"].values()) == pytest.approx(1.0)
    assert r["is_next_ratio"] == pytest.approx(
        np.mean([rec["next_sentence_labels"][0] == 0 for rec in recs]))
    assert sum(c for _, _, c in r["length_histogram"]) == 90
    assert r["out_of_vocab_records"] == 0
    assert r["examples"][0]["text"].startswith("[CLS] w1000 w100")
    text = doctor.format_report(r)
    assert "input_ids              int64  length 32         ok" in text
    assert "no problems found" in text


def test_report_infers_lengths_and_flags_a_mismatch(data):
    d, _ = data
    r = doctor.report(str(d / "*.tfrecord"), num_records=30)
    assert r["inferred"] == {"max_seq_length": 32, "max_predictions_per_seq": 5}
    assert r["problems"] == [] and "inferred from the data" in doctor.format_report(r)
    r = doctor.report(str(d / "*.tfrecord"), max_seq_length=128, max_predictions_per_seq=5,
                      vocab_file=str(d / "vocab.txt"), num_records=30)
    text = doctor.format_report(r)
    assert "MISMATCH (expected int64 x 128)" in text
    assert "input_ids: expected 128 values (max_seq_length=128), found 32 (and 29 more" in text


def test_cli_exit_status(data, capsys):
    d, _ = data
    for args, status in (([], 0), (["--max_seq_length=64"], 1)):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["inspect", f"--input={d}/*.tfrecord", "--num_records=9"] + args)
        with pytest.raises(SystemExit) as e:
            doctor.main([])
        assert e.value.code == status
    flags.FLAGS.unparse_flags()
    assert "PROBLEMS: " in capsys.readouterr().out


def test_verify_counts_every_record_and_names_a_truncated_shard(tmp_path):
    paths, _ = fixtures.write_files(tmp_path, 2, 25, seq=32, preds=5)
    r = doctor.report(str(tmp_path / "*.tfrecord"), num_records=4, verify=True)
    assert r["verified"] == {"files": 2, "records": 50, "corrupt": 0} and not r["problems"]
    data = open(paths[1], "rb").read()
    open(paths[1], "wb").write(data[: len(data) - 30])
    r = doctor.report(str(tmp_path / "*.tfrecord"), num_records=4, verify=True)
    assert r["verified"] == {"files": 2, "records": 49, "corrupt": 1}
    assert len(r["problems"]) == 1
    assert r["problems"][0].startswith(f"{paths[1]}: corrupt shard after 24 good records: "
                                       f"truncated record at ")
    assert "1 corrupt or truncated file(s)" in doctor.format_report(r)
