"""The tensorflow-datasets readers against hand-built datasets in the real tfds feature
structure: each test takes the real builder's FeaturesDict (shipped with tfds, no download),
yields a few examples through a tf.data.Dataset with exactly its tensor spec, and checks the
examples the reader makes of them, field by field."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")

from bert_jax.tasks.choice.reader import ChoiceExample, read_hellaswag_tfds  # noqa: E402
from bert_jax.tasks.classification import PairExample  # noqa: E402
from bert_jax.tasks.glue.reader import read_glue  # noqa: E402
from bert_jax.tasks.ner.reader import NerExample, read_conll_tfds  # noqa: E402
from bert_jax.tasks.readers import DataError  # noqa: E402
from bert_jax.tasks.squad.reader import SquadExample, read_squad_tfds  # noqa: E402
from bert_jax.tasks.choice import ChoiceTask  # noqa: E402
from bert_jax.tasks.glue import GlueTask  # noqa: E402


def _dataset(features, rows):
    """rows (dicts of python values) -> tf.data.Dataset with features' tensor spec."""
    spec = features.get_tensor_spec()
    return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=spec)


@pytest.fixture
def fake_tfds(monkeypatch, tmp_path):
    """fake_tfds(name, {tfds split: rows}): tfds.builder(name) / tfds.load(name, split=...)
    serve `rows` through the real builder's features, as prepared data (nothing to
    download); records the calls."""
    real_builder = tfds.builder
    served, calls = {}, []

    def builder(name, data_dir=None, **kwargs):
        b = real_builder(name, data_dir=str(tmp_path / "tfds"))
        calls.append(("builder", name, data_dir))

        def as_dataset(split, **kw):
            calls.append(("as_dataset", name, split))
            return _dataset(b.info.features, served[name][split])

        b.as_dataset = as_dataset
        b.is_prepared = lambda: True
        return b

    def load(name, split, data_dir=None, **kwargs):
        calls.append(("load", name, split, data_dir))
        return builder(name).as_dataset(split)

    monkeypatch.setattr(tfds, "builder", builder)
    monkeypatch.setattr(tfds, "load", load)

    def serve(name, splits):
        served[name] = splits
        return calls

    return serve


def test_glue_mnli_labels_go_through_names(fake_tfds):
    # tfds orders MNLI's labels (entailment, neutral, contradiction), the TSVs by name.
    calls = fake_tfds("glue/mnli", {"validation_matched": [
        {"premise": "A man plays.", "hypothesis": "Nobody plays.", "label": 2, "idx": 7},
        {"premise": "Rain fell.", "hypothesis": "It rained.", "label": 0, "idx": 8},
        {"premise": "Cats nap.", "hypothesis": "Cats are old.", "label": 1, "idx": 9}]})
    got = read_glue("mnli", "dev_matched", tfds_data_dir="/data/tfds")
    assert got == [PairExample("7", "A man plays.", "Nobody plays.", "contradiction"),
                   PairExample("8", "Rain fell.", "It rained.", "entailment"),
                   PairExample("9", "Cats nap.", "Cats are old.", "neutral")]
    assert ("builder", "glue/mnli", "/data/tfds") in calls
    assert ("as_dataset", "glue/mnli", "validation_matched") in calls
    # ...and on to the task's label ids (contradiction, entailment, neutral = 0, 1, 2).
    task = GlueTask("mnli")
    assert [task.labels.index(e.label) for e in got] == [0, 1, 2]


def test_glue_binary_regression_single_and_test_splits(fake_tfds):
    fake_tfds("glue/mrpc", {
        "train": [{"sentence1": "He said so.", "sentence2": "So he said.", "label": 1,
                   "idx": 0}],
        "test": [{"sentence1": "Unlabelled \u00e9t\u00e9.", "sentence2": "B", "label": -1,
                  "idx": 41}]})
    fake_tfds("glue/stsb", {"validation": [
        {"sentence1": "a", "sentence2": "b", "label": 3.8, "idx": 3},
        {"sentence1": "c", "sentence2": "d", "label": 0.0, "idx": 4}]})
    fake_tfds("glue/cola", {"train": [{"sentence": "The book was read.", "label": 1,
                                       "idx": 5}]})
    fake_tfds("glue/qqp", {"validation": [
        {"question1": "Why?", "question2": "How come?", "label": 0, "idx": 11}]})
    # MRPC: tfds ids are the TSV's Quality column (1 = equivalent), not the names.
    assert read_glue("mrpc", "train") == [
        PairExample("0", "He said so.", "So he said.", "1")]
    assert read_glue("mrpc", "test") == [
        PairExample("41", "Unlabelled \u00e9t\u00e9.", "B", None)]
    assert read_glue("stsb", "dev") == [PairExample("3", "a", "b", "3.8"),
                                               PairExample("4", "c", "d", "0")]
    assert read_glue("cola", "train") == [
        PairExample("5", "The book was read.", None, "1")]
    assert read_glue("qqp", "dev") == [PairExample("11", "Why?", "How come?", "0")]


def test_squad_v1_and_v2(fake_tfds):
    context = "Romeo loves Juliet. Juliet loves Romeo."
    calls = fake_tfds("squad/v1.1", {"validation": [
        {"id": b"q1", "title": "Verona", "context": context, "question": "Who loves Juliet?",
         "answers": {"text": ["Romeo", "Romeo"], "answer_start": [0, 33]}}]})
    fake_tfds("squad/v2.0", {"train": [
        {"id": b"q2", "title": "Verona", "context": context, "question": "Who loves Tybalt?",
         "is_impossible": True, "answers": {"text": [], "answer_start": []},
         "plausible_answers": {"text": ["Juliet"], "answer_start": [12]}},
        {"id": b"q3", "title": "Verona", "context": context, "question": "Who loves Romeo?",
         "is_impossible": False, "answers": {"text": ["Juliet"], "answer_start": [20]},
         "plausible_answers": {"text": [], "answer_start": []}}]})
    examples, data = read_squad_tfds("1.1", "dev", tfds_data_dir="/d")
    assert examples == [SquadExample("q1", "Who loves Juliet?", context,
                                     (("Romeo", 0), ("Romeo", 33)), False, "Verona")]
    assert ("builder", "squad/v1.1", "/d") in calls
    assert ("as_dataset", "squad/v1.1", "validation") in calls
    assert data[0]["paragraphs"][0]["qas"][0]["answers"] == [
        {"text": "Romeo", "answer_start": 0}, {"text": "Romeo", "answer_start": 33}]
    examples, _ = read_squad_tfds("2.0", "train")
    assert examples == [
        SquadExample("q2", "Who loves Tybalt?", context, (), True, "Verona"),
        SquadExample("q3", "Who loves Romeo?", context, (("Juliet", 20),), False, "Verona")]


def test_squad_answer_not_at_its_offset_is_an_error(fake_tfds):
    fake_tfds("squad/v1.1", {"train": [
        {"id": b"bad", "title": "", "context": "abc def", "question": "?",
         "answers": {"text": ["def"], "answer_start": [1]}}]})
    with pytest.raises(DataError, match=r"tfds squad/v1.1:train.*bad.*'def'"):
        read_squad_tfds("1.1", "train")


def test_conll2003_tags_by_name(fake_tfds):
    calls = fake_tfds("conll2003", {"dev": [
        {"tokens": ["EU", "rejects", "German", "call"], "pos": [22, 42, 16, 21],
         "chunks": [11, 21, 11, 12], "ner": [3, 0, 7, 0]},
        {"tokens": ["Peter", "Blackburn"], "pos": [22, 22], "chunks": [11, 12],
         "ner": [1, 2]}]})
    assert read_conll_tfds("dev", tfds_data_dir="/t") == [
        NerExample("0", ("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O")),
        NerExample("1", ("Peter", "Blackburn"), ("B-PER", "I-PER"))]
    assert ("builder", "conll2003", "/t") in calls and ("as_dataset", "conll2003", "dev") in calls


def test_hellaswag_splits_and_hidden_test_labels(fake_tfds):
    row = dict(context="A man is sitting on a roof. He", activity_label="Roof shingle removal",
               split_type="indomain", source_id="activitynet~v_-JhWjGDPHMY")
    calls = fake_tfds("hellaswag", {
        "validation": [dict(row, endings=["starts pulling up roofing.", "is ripping level tiles.",
                                          "is holding a rubik's cube.", "sits, then stands."],
                            label=0)],
        "test": [dict(row, endings=["a", "b", "c", "d"], label=-1)]})
    assert read_hellaswag_tfds("dev", tfds_data_dir="/t") == [ChoiceExample(
        "0", "A man is sitting on a roof. He", "",
        ("starts pulling up roofing.", "is ripping level tiles.", "is holding a rubik's cube.",
         "sits, then stands."), 0)]
    assert read_hellaswag_tfds("test")[0].label is None
    assert ("builder", "hellaswag", "/t") in calls
    assert ("as_dataset", "hellaswag", "validation") in calls
    # configs/swag.py:hellaswag without files reads tfds (no file needed).
    task = ChoiceTask("hellaswag", tfds_data_dir="/t")
    assert task.read("dev")[0].endings[0] == "starts pulling up roofing."


@pytest.fixture
def offline_tfds(monkeypatch, tmp_path):
    """tfds.builder(name) is the real builder over an empty data_dir (nothing prepared),
    and its download fails as it does without a network; records the calls."""
    real_builder = tfds.builder
    calls = []

    def builder(name, data_dir=None, **kwargs):
        b = real_builder(name, data_dir=str(tmp_path / "tfds"))
        calls.append(("builder", name, data_dir))

        def download_and_prepare(*args, **kw):
            calls.append(("download_and_prepare", name))
            raise ConnectionError("Failed to establish a new connection: [Errno -3] "
                                  "Temporary failure in name resolution")

        b.download_and_prepare = download_and_prepare
        return b

    monkeypatch.setattr(tfds, "builder", builder)
    return calls


def test_glue_without_data_dir_downloads_then_says_what_to_set(offline_tfds):
    """No task.data_dir: the data is downloaded through tfds when missing (as users with a
    network expect); when that fails, one line says where to get the files and which flag
    to set, not tfds' own advice."""
    with pytest.raises(DataError) as e:
        read_glue("mrpc", "train")
    assert ("download_and_prepare", "glue/mrpc") in offline_tfds
    message = str(e.value)
    assert "\n" not in message and "tfds glue/mrpc is not in" in message
    assert "ConnectionError: Failed to establish a new connection" in message
    assert "--config.task.data_dir=glue_data/MRPC" in message
    assert "--config.task.tfds_data_dir" in message


@pytest.mark.parametrize("read, name, flag", [
    (lambda: read_squad_tfds("2.0", "train"), "squad/v2.0", "--config.task.train_file"),
    (lambda: read_conll_tfds("dev"), "conll2003", "--config.task.train_file=eng.train"),
    (lambda: read_hellaswag_tfds("dev"), "hellaswag", "--config.task.dev_file")])
def test_other_tfds_readers_say_what_to_set_when_the_download_fails(offline_tfds, read, name,
                                                                  flag):
    with pytest.raises(DataError, match=f"tfds {name} is not in .*{flag}"):
        read()
    assert ("download_and_prepare", name) in offline_tfds
