"""`data.text_files`: pre-training straight from raw text. launch/train.py makes TFRecords of
it once (data_prep.create_pretraining_data in process, the config's lengths and vocabulary, 1
document in 20 held out), caches them in the workdir under a hash of the inputs, and trains
on them; the quick start is the same path with the sample corpus."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bert_jax.data.features import DataCheckError
from bert_jax.tasks.pretraining import data as data_lib
from bert_jax.tokenization import load_tokenizer
from tests.conftest import REPO
from tests.train.common import text_config

SONNETS_AND_SCENES = REPO / "data_prep" / "sample_corpus" / "shakespeare.txt"


def _documents(n: int) -> list[str]:
    docs = SONNETS_AND_SCENES.read_text(encoding="utf-8").split("\n\n")
    return [d.strip("\n") for d in docs if d.strip()][:n]


def _files(directory) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}


def test_text_files_become_tfrecords_once(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = _documents(45)
    (corpus / "a.txt").write_text("\n\n".join(docs[:30]) + "\n", encoding="utf-8")
    (corpus / "b.txt").write_text("\n\n".join(docs[30:]) + "\n", encoding="utf-8")
    config = text_config(f"{corpus}/a.txt, {corpus}/b*.txt")
    # Built in this process, which runs JAX: data_prep's workers must be spawned, not forked.
    from data_prep import pipeline
    methods = []
    get_context = pipeline.mp.get_context
    monkeypatch.setattr(pipeline.mp, "get_context",
                        lambda method=None: methods.append(method) or get_context(method))
    source = data_lib.make_train_data(config, str(tmp_path / "run"))
    assert methods == ["spawn", "spawn"]  # the train part, then the held-out part
    built = next((tmp_path / "run" / "text_data").iterdir())
    assert built.name.startswith("len16_pred4_")
    assert config.data.train_files == str(built / "train-*.tfrecord")
    assert config.data.eval_files == str(built / "eval.tfrecord")  # 2 of 45 held out
    assert config.data.vocab_file == data_lib.SAMPLE_VOCAB
    assert sorted(p.name for p in built.glob("*.tfrecord")) == [
        "eval.tfrecord", "train-000.tfrecord", "train-001.tfrecord", "train-002.tfrecord",
        "train-003.tfrecord"]

    # The masked-out tokens (the labels) are pieces of this corpus, in its casing.
    tok = load_tokenizer(vocab_file=data_lib.SAMPLE_VOCAB, do_lower_case=True)
    corpus_ids = set(tok.encode(" ".join(docs)))
    batch = next(source)
    assert batch["input_ids"].shape == (8, 16)
    labels = batch["masked_lm_ids"][batch["masked_lm_weights"] > 0]
    assert labels.size and set(labels.tolist()) <= corpus_ids

    # A restart reuses the files; a changed corpus gets its own directory.
    before = _files(built)
    data_lib.make_train_data(text_config(f"{corpus}/a.txt, {corpus}/b*.txt"),
                             str(tmp_path / "run"))
    assert _files(built) == before
    with open(corpus / "b.txt", "a", encoding="utf-8") as f:
        f.write("\nOne more line.\n")
    os.utime(corpus / "b.txt", ns=(1, 1))
    data_lib.make_train_data(text_config(f"{corpus}/*.txt"), str(tmp_path / "run"))
    assert len(list((tmp_path / "run" / "text_data").iterdir())) == 2


def test_too_few_documents_for_a_held_out_set_and_bad_globs(tmp_path):
    (tmp_path / "small.txt").write_text("\n\n".join(_documents(12)) + "\n", encoding="utf-8")
    config = text_config(str(tmp_path / "small.txt"))
    data_lib.make_train_data(config, str(tmp_path / "run"))
    assert config.data.eval_files == ""  # < 20 documents: none held out, no evaluation
    with pytest.raises(FileNotFoundError, match=r"data.text_files: no file matches "
                                                r"'.*/nothing\*.txt'"):
        data_lib.make_train_data(text_config(f"{tmp_path}/small.txt,{tmp_path}/nothing*.txt"),
                                 str(tmp_path / "run"))


def test_text_files_with_pack_train_on_packed_rows_and_evaluate_unpacked(tmp_path):
    """data.pack (packed pre-training): the training TFRecords hold packed rows (data_prep
    --pack), the held-out ones stay unpacked; a packed build has a directory of its own."""
    (tmp_path / "t.txt").write_text("\n\n".join(_documents(45)) + "\n", encoding="utf-8")
    config = text_config(str(tmp_path / "t.txt"))
    config.data.max_seq_length, config.data.max_predictions_per_seq = 48, 7
    config.data.pack, config.data.max_sequences_per_pack = True, 2
    source = data_lib.make_train_data(config, str(tmp_path / "run"))
    [built] = (tmp_path / "run" / "text_data").iterdir()
    assert built.name.startswith("len48_pred7_pack2_")
    batch = next(source)
    assert batch["masked_lm_ids"].shape == (8, 9) and batch["next_sentence_labels"].shape == (8, 2)
    assert (batch["input_mask"] == (batch["sequence_ids"] > 0)).all()
    from bert_jax.data import inspect as doctor
    r = doctor.report(config.data.train_files, num_records=2000)
    assert r["problems"] == [] and r["max_sequences_per_pack"] == 2
    assert r["sequences_per_row"] > 1  # some rows hold two sequences
    eval_batch = next(iter(data_lib.make_eval_data(config, str(tmp_path / "run"))))
    assert "sequence_ids" not in eval_batch and eval_batch["masked_lm_ids"].shape[1] == 7

    # data.pack with TFRecords of one's own (unpacked): one line saying what to do.
    config = text_config("")
    config.data.train_files, config.data.pack = str(built / "../../eval-like.tfrecord"), True
    (tmp_path / "run" / "eval-like.tfrecord").write_bytes(
        (built / "eval.tfrecord").read_bytes())
    config.data.max_seq_length, config.data.max_predictions_per_seq = 48, 7
    config.data.vocab_file = data_lib.SAMPLE_VOCAB
    with pytest.raises(DataCheckError, match=r"config.data.pack=True, but data.train_files "
                                             r".*eval-like.tfrecord hold unpacked rows"):
        data_lib.make_train_data(config, str(tmp_path / "run"))


def test_the_run_trains_and_records_its_vocabulary(tmp_path):
    """Through the loop: the saved config names the text's TFRecords and the vocabulary, so
    `convert from-workdir` can carry it."""
    from bert_jax.convert import sources
    from bert_jax.tasks import pretraining

    (tmp_path / "t.txt").write_text("\n\n".join(_documents(25)) + "\n", encoding="utf-8")
    config = text_config(str(tmp_path / "t.txt"))
    config.train.steps, config.train.tensorboard, config.train.eval_every = 2, False, 0
    summary = pretraining.run(config, str(tmp_path / "run"))
    assert summary["step"] == 2 and np.isfinite(summary["eval/loss"])
    vocab = sources.open_source(str(tmp_path / "run")).vocab
    assert vocab == data_lib.SAMPLE_VOCAB


def test_conflicting_or_unfit_settings_fail_before_anything_is_built(tmp_path):
    (tmp_path / "t.txt").write_text("\n\n".join(_documents(25)) + "\n", encoding="utf-8")
    config = text_config(str(tmp_path / "t.txt"))
    config.data.train_files = "/data/train-*.tfrecord"
    with pytest.raises(ValueError, match=r"text_files='.*t.txt' is set together with "
                                         r"data.train_files='/data/train-\*.tfrecord'"):
        data_lib.make_train_data(config, str(tmp_path / "run"))
    config = text_config(str(tmp_path / "t.txt"))
    config.data.source = "synthetic"
    with pytest.raises(ValueError, match=r"together with data.source='synthetic'"):
        data_lib.make_train_data(config, str(tmp_path / "run"))
    config = text_config(str(tmp_path / "t.txt"))
    config.model.vocab_size = 1000   # BERT's vocabulary has 30,522 tokens
    with pytest.raises(ValueError, match=r"vocabulary has 30522 tokens .* "
                                         r"config.model.vocab_size=1000"):
        data_lib.make_train_data(config, str(tmp_path / "run"))
    config = text_config(str(tmp_path / "t.txt"))
    config.data.vocab_file = str(tmp_path / "missing_vocab.txt")
    with pytest.raises(FileNotFoundError, match="missing_vocab.txt"):
        data_lib.make_train_data(config, str(tmp_path / "run"))
    assert not (tmp_path / "run" / "text_data").exists()  # nothing was built


def test_text_files_and_workdir_in_a_bucket(tmp_path, monkeypatch, own_tempdir):
    """data.text_files and the workdir in a bucket (the fake one of tests/test_paths.py): the
    TFRecords are built in a local temporary folder and uploaded next to a DONE marker, the
    same bytes as a local build of the same text, and a restart reuses them. (Reading them
    back is TensorFlow's own gs:// support, which no fake reaches.) Nothing is left in this
    test's own temp folder."""
    from tests.test_paths import fake_gcs

    monkeypatch.chdir(tmp_path)  # a URI taken for a local path would land here
    root = tmp_path / "bucket_root"
    (root / "b" / "corpus").mkdir(parents=True)
    text = "\n\n".join(_documents(45)) + "\n"
    (root / "b" / "corpus" / "a.txt").write_text(text, encoding="utf-8")
    (tmp_path / "a.txt").write_text(text, encoding="utf-8")
    def config(text_files):  # as make_train_data completes it before building
        c = text_config(text_files)
        c.data.vocab_file = data_lib.SAMPLE_VOCAB
        return c

    local_train, local_eval = data_lib.build_text_data(config(str(tmp_path / "a.txt")),
                                                       str(tmp_path / "run"))
    with fake_gcs(str(root)):
        train, eval_file = data_lib.build_text_data(config("gs://b/corpus/*.txt"),
                                                    "gs://b/run/")
        built = next((root / "b" / "run" / "text_data").iterdir())
        assert train == f"gs://b/run/text_data/{built.name}/train-*.tfrecord"
        assert eval_file == f"gs://b/run/text_data/{built.name}/eval.tfrecord"
        assert sorted(os.listdir(built)) == ["DONE", "eval.tfrecord"] + [
            f"train-00{i}.tfrecord" for i in range(4)]
        local = os.path.dirname(local_train)
        for name in os.listdir(built):
            if name.endswith(".tfrecord"):
                assert (built / name).read_bytes() == open(os.path.join(local, name),
                                                           "rb").read(), name
        before = _files(built)
        monkeypatch.setattr(data_lib.cpd, "create", lambda *a, **k: 1 / 0)  # no rebuild
        assert data_lib.build_text_data(config("gs://b/corpus/*.txt"), "gs://b/run") == (
            train, eval_file)
        assert _files(built) == before
    assert local_eval and not (tmp_path / "gs:").exists()
    assert os.listdir(own_tempdir) == []


def test_a_file_that_is_not_text_is_one_line_naming_it(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n\n".join(_documents(30)) + "\n", encoding="utf-8")
    (corpus / "b.txt").write_bytes(b"a line\n\xff\xfe binary \x00\n")
    config = text_config(f"{corpus}/*.txt")
    with pytest.raises(DataCheckError) as e:
        data_lib.make_train_data(config, str(tmp_path / "run"))
    assert str(e.value).startswith(f"config.data.text_files: {corpus / 'b.txt'}: near line 1: "
                                   f"not UTF-8 text (invalid start byte)"), e.value
    assert "\n" not in str(e.value)
    assert not list((tmp_path / "run" / "text_data").iterdir())  # nothing half-built kept


def test_a_full_disk_while_building_is_one_line_and_keeps_nothing(tmp_path, monkeypatch):
    """data_prep writes the first shard, then the disk is full: one TextDataError (a fault,
    exit 1) naming the file, and none of the build's files stay (no DONE, no shard, no
    text): the same command builds it all again."""
    import errno

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("\n\n".join(_documents(30)) + "\n", encoding="utf-8")
    config = text_config(f"{corpus}/a.txt")

    def full(options):
        first = options.output_file.format(shard=0)
        open(first, "wb").write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), first)

    monkeypatch.setattr(data_lib.cpd, "create", full)
    with pytest.raises(data_lib.TextDataError) as e:
        data_lib.make_train_data(config, str(tmp_path / "run"))
    built = tmp_path / "run" / "text_data"
    out = str(e.value).split(" into ")[1].split(" failed")[0]
    assert str(e.value) == (
        f"building TFRecords from data.text_files {corpus / 'a.txt'} into {out} failed: "
        f"{out}/train-000.tfrecord: no space left on device; nothing of it was kept; free the "
        f"space (or fix the cause) and run the same command again"), e.value
    assert e.value.exit_code == 1 and os.path.dirname(out) == str(built)
    assert list(built.iterdir()) == []
