"""GLUE / pair tasks: TSV readers, feature layout, loss, submission files, eval padding,
the TFRecord feature cache and the configs."""

import os

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.tasks import classification, glue
from bert_jax.tasks import inputs as tasks_input
from bert_jax.tasks.base import EvalSet, collect
from bert_jax.tasks.glue import reader as readers
from bert_jax.tasks.readers import DataError
from bert_jax.tokenization import load_tokenizer
from tests.conftest import load_script
from tests.tasks.conftest import DATA, VOCAB


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(vocab_file=str(VOCAB), do_lower_case=True)


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_read_cola_without_header_and_test_with_header(tmp_path):
    train = _write(tmp_path / "train.tsv", "gj04\t1\t\tOur friends won't buy this.\n"
                                            "gj04\t0\t*\tThey drank the pub.\n")
    ex = readers.read_glue_tsv(train, "cola")
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [
        ("Our friends won't buy this.", None, "1"), ("They drank the pub.", None, "0")]
    test = _write(tmp_path / "test.tsv", "index\tsentence\n0\tBill left.\n7\tA \"quoted\" one.\n")
    ex = readers.read_glue_tsv(test, "cola", labeled=False)
    assert [(e.guid, e.text_a, e.label) for e in ex] == [("0", "Bill left.", None),
                                                         ("7", 'A "quoted" one.', None)]


def test_read_mnli_by_header_names(tmp_path):
    header = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
              "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n")
    path = _write(tmp_path / "dev_matched.tsv",
                  header + "0\t1\t2\tfiction\t(x)\t(y)\t(x)\t(y)\tA man sleeps.\tHe naps.\t"
                           "entailment\tentailment\n")
    (ex,) = readers.read_glue_tsv(path, "mnli")
    assert (ex.text_a, ex.text_b, ex.label) == ("A man sleeps.", "He naps.", "entailment")


def test_reader_errors_name_file_and_line(tmp_path):
    bad = _write(tmp_path / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\tonly two\n")
    with pytest.raises(DataError, match=r"dev.tsv: line 2: 2 columns"):
        readers.read_glue_tsv(bad, "rte")
    wrong = _write(tmp_path / "x.tsv", "a\tb\n1\t2\n")
    with pytest.raises(DataError, match=r"x.tsv: line 1: no column 'sentence1'"):
        readers.read_glue_tsv(wrong, "rte")
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        readers.read_glue_tsv(str(tmp_path / "nope.tsv"), "rte")


def test_truncate_pair_pops_the_longer_side():
    a, b = list(range(5)), list(range(10, 13))
    classification.truncate_pair(a, b, 6)
    assert a == [0, 1, 2] and b == [10, 11, 12]
    a, b = [1, 2], [3, 4, 5, 6, 7]
    classification.truncate_pair(a, b, 4)
    assert a == [1, 2] and b == [3, 4]
    # A tie costs B its token, as google-research/bert's _truncate_seq_pair
    # (`if len(tokens_a) > len(tokens_b): tokens_a.pop() else: tokens_b.pop()`).
    a, b = [1, 2, 3], [4, 5, 6]
    classification.truncate_pair(a, b, 5)
    assert a == [1, 2, 3] and b == [4, 5]
    a, b = [1, 2, 3, 4], [5, 6, 7]
    classification.truncate_pair(a, b, 5)
    assert a == [1, 2, 3] and b == [5, 6]
    a = [1, 2, 3]
    classification.truncate_pair(a, None, 2)
    assert a == [1, 2]


def test_pair_features_layout(tok):
    ex = [classification.PairExample("0", "Hello world", "unaffable x", "1"),
          classification.PairExample("1", "single", None, "0")]
    f = classification.convert_examples(ex, tok, 10, ("0", "1"))
    cls, sep = tok.cls_id, tok.sep_id
    want = [cls] + tok.encode("hello world") + [sep] + tok.encode("unaffable x") + [sep]
    assert len(want) == 9
    np.testing.assert_array_equal(f["input_ids"][0], want + [0])
    np.testing.assert_array_equal(f["segment_ids"][0], [0, 0, 0, 0, 1, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(f["input_mask"][0], [1] * 9 + [0])
    np.testing.assert_array_equal(f["input_ids"][1][:3], [cls, tok.encode("single")[0], sep])
    assert f["label_ids"].tolist() == [1, 0] and f["input_ids"].dtype == np.int32
    with pytest.raises(DataError, match="label 'maybe' is not one of"):
        classification.convert_examples([classification.PairExample("9", "a", "b", "maybe")], tok, 8,
                                        ("0", "1"))
    reg = classification.convert_examples([classification.PairExample("0", "a", "b", "3.8")], tok, 8,
                                          None)
    assert reg["label_ids"].dtype == np.float32 and reg["label_ids"][0] == pytest.approx(3.8)


def test_classification_loss_by_hand():
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [5.0, -5.0]], np.float32)
    batch = {"label_ids": np.array([0, 0, 1]), "example_weights": np.array([1.0, 1.0, 0.0])}
    loss, m = classification.classification_loss(jnp.asarray(logits), batch)
    want = np.mean([np.log(1 + np.exp(-2.0)), np.log(1 + np.exp(1.0))])
    assert float(loss) == pytest.approx(want, rel=1e-6)
    assert float(m["correct"]) == 1.0 and float(m["count"]) == 2.0
    reg, _ = classification.classification_loss(
        jnp.array([[1.0], [3.0]]), {"label_ids": np.array([2.0, 3.5]),
                                    "example_weights": np.ones(2)})
    assert float(reg) == pytest.approx((1.0 + 0.25) / 2)


def test_eval_batches_pad_with_zero_weights_and_collect_drops_them():
    feats = {"x": np.arange(5, dtype=np.int32), "example_index": np.arange(5, dtype=np.int32)}
    batches = list(tasks_input.eval_batches(feats, 2))
    assert [b["example_weights"].tolist() for b in batches] == [[1, 1], [1, 1], [1, 0]]
    assert all(len(b["x"]) == 2 for b in batches)
    kept = collect([{"x": b["x"] * 10, "example_weights": b["example_weights"]} for b in batches])
    assert kept["x"].tolist() == [0, 10, 20, 30, 40]


def test_train_batches_cover_each_epoch_and_resume_exactly():
    feats = {"x": np.arange(10, dtype=np.int32)}
    it = tasks_input.FeatureBatches(feats, 4, seed=0)
    seen = np.concatenate([next(it)["x"] for _ in range(5)])   # 20 rows: 2 epochs
    assert sorted(seen.tolist()) == sorted(list(range(10)) * 2)
    state = it.get_state()
    after = [next(it)["x"].tolist() for _ in range(3)]
    again = tasks_input.FeatureBatches(feats, 4, seed=0)
    again.set_state(state)
    assert [next(again)["x"].tolist() for _ in range(3)] == after
    # Two processes take the two halves of the same global batches.
    halves = [tasks_input.FeatureBatches(feats, 4, seed=0, process_index=p, process_count=2)
              for p in (0, 1)]
    assert np.concatenate([next(h)["x"] for h in halves]).tolist() == seen[:4].tolist()
    with pytest.raises(ValueError, match="not of feature batches with seed 1"):
        tasks_input.FeatureBatches(feats, 4, seed=1).set_state(state)


def test_feature_cache_round_trip(tmp_path):
    feats = {"ids": np.arange(24, dtype=np.int32).reshape(3, 8) - 5,
             "pos": np.arange(3 * 2 * 4, dtype=np.int32).reshape(3, 2, 4),
             "score": np.array([0.5, -1.25, 3.0], np.float32)}
    calls = []

    def build():
        calls.append(1)
        return feats

    first = tasks_input.cached_features(str(tmp_path), "t", "k1", build)
    second = tasks_input.cached_features(str(tmp_path), "t", "k1", build)
    assert len(calls) == 1
    for k in feats:
        np.testing.assert_array_equal(second[k], feats[k])
        assert second[k].dtype == feats[k].dtype and first[k] is feats[k]
    assert not list(tmp_path.glob("*.tmp*"))


def test_feature_cache_at_a_uri(tmp_path, monkeypatch):
    """A cache_dir in a bucket: TensorFlow's own file systems write and read it (its
    in-memory ram:// stands in for gs:// here), and the key of a data file there follows the
    file's size and modification time."""
    import tensorflow as tf

    monkeypatch.chdir(tmp_path)  # a URI taken for a local path would land here
    feats = {"ids": np.arange(12, dtype=np.int32).reshape(3, 4),
             "score": np.array([0.5, -1.25, 3.0], np.float32)}
    calls = []

    def build():
        calls.append(1)
        return feats

    tasks_input.cached_features("ram://bucket/cache/", "t", "k1", build)
    again = tasks_input.cached_features("ram://bucket/cache", "t", "k1", build)
    assert len(calls) == 1
    for k in feats:
        np.testing.assert_array_equal(again[k], feats[k])
    assert sorted(tf.io.gfile.listdir("ram://bucket/cache")) == ["t-k1.tfrecord",
                                                                  "t-k1.tfrecord.json"]
    assert not os.path.exists(tmp_path / "ram:")


def test_cache_key_follows_a_bucket_file(tmp_path, monkeypatch):
    from tests.test_paths import fake_gcs

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "bucket_root"
    (root / "b").mkdir(parents=True)
    data = root / "b" / "train.tsv"
    data.write_text("a\tb\n")
    with fake_gcs(str(root)):
        key = tasks_input.cache_key(source="gs://b/train.tsv", n=1)
        assert tasks_input.cache_key(source="gs://b/train.tsv", n=1) == key
        data.write_text("a\tb\nc\td\n")  # another size: another key
        assert tasks_input.cache_key(source="gs://b/train.tsv", n=1) != key
        # A name that is not a file keys by the name alone.
        assert tasks_input.cache_key(source="gs://b/none.tsv", n=1) != key


def test_glue_task_evaluate_and_submission(tmp_path, tok):
    task = glue.GlueTask("tsv", data_dir=str(DATA / "pairs"), max_seq_length=32)
    (dev,) = task.eval_sets(tok)
    n = len(dev.examples)
    assert n == 200 and len(dev.features["input_ids"]) == n
    gold = dev.features["label_ids"]
    logits = np.stack([gold == 0, gold == 1], -1).astype(np.float32)
    logits[:10] = logits[:10, ::-1]  # 10 wrong
    order = np.random.default_rng(0).permutation(n)  # rows come back in any order
    kept = {"logits": logits[order], "example_index": dev.features["example_index"][order]}
    out = task.score(dev, kept)
    assert out["accuracy"] == pytest.approx((n - 10) / n)
    test = EvalSet("test", dev.features, dev.examples, labeled=False)
    (path,) = task.write_predictions(test, kept, str(tmp_path))
    lines = open(path, encoding="utf-8").read().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == n + 1
    assert lines[1] == f"{dev.examples[0].guid}\t{'0' if logits[0, 0] else '1'}"


def test_submission_format_stsb_and_mnli(tmp_path):
    glue.write_submission(str(tmp_path / "STS-B.tsv"), ["0", "1"], np.array([5.7, 2.25]), None,
                          clip=(0.0, 5.0))
    assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t5.000\n1\t2.250\n"
    labels = glue.GLUE_TASKS["mnli"].labels
    glue.write_submission(str(tmp_path / "MNLI-m.tsv"), ["3"], np.array([2]), labels)
    assert (tmp_path / "MNLI-m.tsv").read_text() == "index\tprediction\n3\tneutral\n"


def _load_config(name):
    return load_script(f"configs/{name}.py")


def test_every_glue_config_builds_its_task():
    from bert_jax.tasks.registry import task_from_config

    cfg = _load_config("glue")
    for name in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"):
        c = cfg.get_config(name)
        assert c.train.batch_size == 32 and c.schedule.warmup_ratio == 0.1
        assert c.model_overrides.hidden_dropout_prob == 0.1 and c.train.epochs == 3
        task = task_from_config(c)
        assert task.num_labels == {"stsb": 1, "mnli": 3}.get(name, 2)
    assert task_from_config(cfg.get_config("task=mnli")).dev_splits == (
        "dev_matched", "dev_mismatched")
    with pytest.raises(ValueError, match="unknown task"):
        cfg.get_config("squad")
    sq = _load_config("squad")
    for v in ("1.1", "2.0"):
        t = task_from_config(sq.get_config(v))
        assert (t.max_seq_length, t.doc_stride, t.max_query_length, t.n_best_size,
                t.max_answer_length) == (384, 128, 64, 20, 30)
        assert t.version == v
    assert task_from_config(_load_config("ner").get_config()).labels[0] == "O"


@pytest.mark.slow  # ~60 s: tfds import and mock generation
def test_tfds_readers_on_mock_data():
    """tfds glue/* through tfds' mock data (random text, the real feature specs):
    field names, MNLI's by-name label mapping, unlabeled test splits."""
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
        mnli = readers.read_glue("mnli", "dev_matched")
        assert len(mnli) == 3 and all(e.label in glue.GLUE_TASKS["mnli"].labels for e in mnli)
        assert all(e.text_b is not None for e in mnli)
        cola = readers.read_glue("cola", "dev")
        assert all(e.label in ("0", "1") and e.text_b is None for e in cola)
        stsb = readers.read_glue("stsb", "dev")
        assert all(0.0 <= float(e.label) <= 5.0 for e in stsb)
        assert all(e.label is None for e in readers.read_glue("qnli", "test"))


def test_mnli_test_sets_and_ax_submission_files(tmp_path, tok):
    """MNLI with eval_test: matched/mismatched dev scored, test_matched/mismatched and the
    diagnostic set (beside the MNLI directory, as glue_data/ lays them out) predicted into
    MNLI-m.tsv, MNLI-mm.tsv and AX.tsv."""
    mnli, ax = tmp_path / "MNLI", tmp_path / "diagnostic"
    mnli.mkdir()
    ax.mkdir()
    head = "index\tsentence1\tsentence2\tgold_label\n"
    for split in ("train", "dev_matched", "dev_mismatched"):
        (mnli / f"{split}.tsv").write_text(head + "0\tA cat.\tAn animal.\tentailment\n"
                                           "1\tA dog.\tNo dog.\tcontradiction\n")
    for split in ("test_matched", "test_mismatched"):
        (mnli / f"{split}.tsv").write_text("index\tsentence1\tsentence2\n5\tA.\tB.\n")
    (ax / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n0\tX.\tY.\n1\tZ.\tW.\n")
    task = glue.GlueTask("mnli", data_dir=str(mnli), max_seq_length=16, eval_test=True)
    sets = task.eval_sets(tok)
    assert [s.name for s in sets] == ["dev_matched", "dev_mismatched", "test_matched",
                                      "test_mismatched", "test_ax"]
    written = []
    for s in sets:
        n = len(s.examples)
        kept = {"logits": np.tile([0.0, 0.0, 1.0], (n, 1)).astype(np.float32),
                "example_index": s.features["example_index"]}
        if s.labeled:
            assert task.score(s, kept)["accuracy"] == 0.0  # all "neutral"
        written += task.write_predictions(s, kept, str(tmp_path / "out"))
    names = sorted(p.rsplit("/", 1)[1] for p in written)
    assert names == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "dev_predictions-dev_matched.tsv",
                     "dev_predictions-dev_mismatched.tsv"]
    assert (tmp_path / "out" / "AX.tsv").read_text() == "index\tprediction\n0\tneutral\n1\tneutral\n"
    assert (tmp_path / "out" / "MNLI-mm.tsv").read_text() == "index\tprediction\n5\tneutral\n"


def test_own_single_sentence_tsv(tmp_path):
    path = _write(tmp_path / "train.tsv", "sentence1\tlabel\nGood play.\tpos\nDull.\tneg\n")
    ex = readers.read_glue_tsv(path, "tsv")
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [("Good play.", None, "pos"),
                                                           ("Dull.", None, "neg")]
