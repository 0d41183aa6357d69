"""Degenerate raw text through every tool that reads it: create_pretraining_data.py,
build_vocab.py, prepare_corpus.py (their command lines) and pre-training from
`data.text_files`. Text that is empty or blank, text without a single token, and text the
vocabulary turns mostly into [UNK] each get one line naming the files and what was expected;
an error writes nothing (an older output stays). Before, the tools wrote empty outputs (or a
vocabulary of the 5 special tokens) and exited 0 without a word."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bert_jax.data.features import DataCheckError
from bert_jax.tokenization import VocabError
from data_prep import pipeline
from data_prep.paths import InputError
from tests.data_prep.helpers import REPO, SAMPLE, VOCAB
from tests.train.common import text_config

FORMAT = "expected UTF-8 text, one sentence per line, a blank line between documents"
# 19 documents (too few to hold one out for evaluation) of 5 word pieces, 3 of them [UNK]
# (the uncased vocabulary has no emoji): 60% of 95.
UNKNOWN = "".join(f"\U0001F600 \U0001F680 \U0001F308 cat {i}\n\n" for i in range(19))


def _tool(name: str, *args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "data_prep" / name), *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def _lines(stderr: str, prefix: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(prefix)]


@pytest.fixture()
def blank(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_text("\n  \n\t\n")
    return [tmp_path / "blank.txt", tmp_path / "empty.txt"]


def test_create_refuses_blank_input_and_keeps_the_older_output(tmp_path, blank):
    out = tmp_path / "old.tfrecord"
    out.write_bytes(b"an older output")
    r = _tool("create_pretraining_data.py", f"--input_file={tmp_path}/*.txt",
              f"--output_file={out}", f"--vocab_file={VOCAB}", "--noprogress")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert _lines(r.stderr, "create_pretraining_data: error: ") == [
        f"create_pretraining_data: error: --input_file: {blank[0]}, {blank[1]}: no text "
        f"(empty or blank); {FORMAT}"]
    assert out.read_bytes() == b"an older output"


def test_create_text_without_a_token_writes_nothing(tmp_path):
    src = tmp_path / "control.txt"
    src.write_bytes(b"\x00\x01\n\n\x02\x03\x07\n")
    out = tmp_path / "o.tfrecord"
    out.write_bytes(b"an older output")
    from data_prep import instances as inst

    spec = pipeline.WorkerSpec(VOCAB, None, True, inst.InstanceConfig(dupe_factor=1), 1)
    with pytest.raises(InputError) as e:
        pipeline.run([str(src)], [str(out)], spec, progress=False, require_instances=True)
    assert str(e.value) == (f"no training instances from {src}: no line of their text yields "
                            f"a token (only control characters or invisible characters?); "
                            f"{FORMAT}; nothing written")
    assert out.read_bytes() == b"an older output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control.txt", "o.tfrecord"]


def test_create_warns_naming_blank_files_and_the_unknown_fraction(tmp_path, blank):
    (tmp_path / "emoji.txt").write_text(UNKNOWN, encoding="utf-8")
    out = tmp_path / "o.tfrecord"
    r = _tool("create_pretraining_data.py", f"--input_file={tmp_path}/*.txt",
              f"--output_file={out}", f"--vocab_file={VOCAB}", "--noprogress",
              "--num_workers=1", "--max_seq_length=16", "--max_predictions_per_seq=4")
    assert r.returncode == 0 and out.stat().st_size > 0, r.stderr
    assert _lines(r.stderr, "create_pretraining_data: warning: ") == [
        f"create_pretraining_data: warning: --input_file: 2 of 3 input files hold no text "
        f"(empty or blank), they add nothing: {blank[0]}, {blank[1]}",
        f"create_pretraining_data: warning: --input_file {blank[0]}, "
        f"{tmp_path / 'emoji.txt'}, {blank[1]}: 60.0% of 95 word pieces are [UNK] with the "
        f"vocabulary {VOCAB} (do_lower_case=True), expected under 5% for a vocabulary that "
        f"fits the text: use the model's own vocabulary and its casing (do_lower_case)"]


def test_build_vocab_refuses_text_without_words_and_keeps_the_older_vocab(tmp_path, blank):
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "vocab.txt"
    out.write_text("an older vocabulary\n")
    r = _tool("build_vocab.py", f"--input_file={tmp_path}/*.txt", f"--output={out}",
              "--vocab_size=100")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert _lines(r.stderr, "build_vocab: error: ") == [
        f"build_vocab: error: --input_file: {blank[0]}, {blank[1]}: no text (empty or blank); "
        f"{FORMAT}"]
    from data_prep.build_vocab import train_wordpiece

    control = tmp_path / "control.txt"
    control.write_bytes(b"\x00\x01\n\x02\n")
    with pytest.raises(InputError, match=rf"^--input_file: no word to learn from 1 file\(s\) "
                                         rf".*; {FORMAT}; {out} not written$"):
        train_wordpiece([str(control)], 100, str(out))
    assert out.read_text() == "an older vocabulary\n"


def test_prepare_corpus_refuses_input_without_text_and_names_empty_files(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("\n\n")
    out = tmp_path / "corpus.txt"
    r = _tool("prepare_corpus.py", f"--input={tmp_path / 'in'}", f"--output={out}",
              "--format=sample")
    assert r.returncode == 2 and "Traceback" not in r.stderr and not out.exists(), r.stderr
    assert _lines(r.stderr, "prepare_corpus: error: ") == [
        f"prepare_corpus: error: --input={tmp_path / 'in'}: no text in its 1 .txt file(s) "
        f"({tmp_path / 'in' / 'a.txt'}): empty, blank or only headings; {out} not written"]
    (tmp_path / "in" / "b.txt").write_text(open(SAMPLE[0], encoding="utf-8").read()[:20000])
    r = _tool("prepare_corpus.py", f"--input={tmp_path / 'in'}", f"--output={out}",
              "--format=sample")
    assert r.returncode == 0 and out.stat().st_size > 0, r.stderr
    assert _lines(r.stderr, "prepare_corpus: warning: ") == [
        f"prepare_corpus: warning: 1 of 2 files hold no text (empty, blank or only "
        f"headings): {tmp_path / 'in' / 'a.txt'}"]


def test_text_files_without_text_or_tokens_are_one_line_before_training(tmp_path, blank):
    from bert_jax.tasks.pretraining import data as data_lib

    run = tmp_path / "run"
    with pytest.raises(DataCheckError) as e:
        data_lib.make_train_data(text_config(f"{tmp_path}/*.txt"), str(run))
    assert str(e.value) == (f"data.text_files {blank[0]}, {blank[1]}: no text (empty or "
                            f"blank files); {FORMAT}")
    assert not list(run.glob("text_data/*/*.tfrecord"))

    (tmp_path / "control.txt").write_bytes(b"\x00\x01\n\n\x02\n")
    with pytest.raises(DataCheckError) as e:
        data_lib.make_train_data(text_config(str(tmp_path / "control.txt")), str(run))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(
        f"building TFRecords from data.text_files {tmp_path / 'control.txt'}: no training "
        f"instances from "), msg
    assert msg.endswith(f"yields a token (only control characters or invisible "
                        f"characters?); {FORMAT}; nothing written")


def test_text_files_mostly_unknown_warn_then_fail_before_compile(tmp_path, blank, capsys):
    from bert_jax.tasks.pretraining import data as data_lib

    (tmp_path / "emoji.txt").write_text(UNKNOWN, encoding="utf-8")
    with pytest.raises(VocabError) as e:
        data_lib.make_train_data(text_config(f"{tmp_path}/*.txt"), str(tmp_path / "run"))
    out = capsys.readouterr().out
    what = f"data.text_files {blank[0]}, {tmp_path / 'emoji.txt'}, {blank[1]}"
    assert f"warning: {what}: 2 file(s) hold no text (empty or blank): {blank[0]}, " \
           f"{blank[1]}\n" in out, out
    assert f"warning: {what}: --input_file " in out and "60.0% of 95 word pieces are [UNK]" \
        in out, out
    msg = str(e.value)
    assert "\n" not in msg and "train-000.tfrecord" in msg and "are [UNK] with the " \
        "vocabulary" in msg, msg
