"""Multiple choice (SWAG / HellaSwag / your own JSON lines): readers, the feature layout and
the scores against Hugging Face transformers (goldens by tests/goldens/make_goldens.py),
and the fine-tuning driver end to end on the authored SWAG-format set."""

import csv
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from bert_jax.convert.hf import config_from_hf, hf_to_params
from bert_jax.tasks.choice import reader as readers
from bert_jax.tasks.choice.reader import ChoiceExample
from bert_jax.tasks.readers import DataError
from bert_jax.tokenization import load_tokenizer
from bert_jax.models import BertForMultipleChoice
from bert_jax.tasks import choice, finetune
from bert_jax.train.config import load_config
from tests.conftest import GOLDENS
from tests.tasks.conftest import DATA, VOCAB


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(vocab_file=str(VOCAB), do_lower_case=True)


@pytest.fixture(scope="module")
def golden():
    g = np.load(GOLDENS / "minilm_multiple_choice.npz")
    examples = [ChoiceExample(str(i), ctx, start, tuple(ends), label)
                for i, (ctx, start, ends, label) in enumerate(json.loads(str(g["questions"])))]
    return g, examples


# --- readers ------------------------------------------------------------------------------

SWAG_HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
               "ending0", "ending1", "ending2", "ending3", "label"]


def _swag(path, rows, header=SWAG_HEADER):
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def test_read_swag_csv(tmp_path):
    path = _swag(tmp_path / "val.csv", [
        [17, "lsmdc1", 5, "x", "She smiles, then waves.", "She", "gold", "runs.", "sits, quietly.",
         'says "hi".', "leaves.", 2],
        [18, "lsmdc1", 6, "x", "A man, a plan.", "The man", "gen", "a", "b", "c", "d", 0]])
    ex = readers.read_swag_csv(path)
    assert ex == [ChoiceExample("17", "She smiles, then waves.", "She",
                                ("runs.", "sits, quietly.", 'says "hi".', "leaves."), 2),
                  ChoiceExample("18", "A man, a plan.", "The man", ("a", "b", "c", "d"), 0)]
    # test.csv: no label column, unlabelled questions.
    test = _swag(tmp_path / "test.csv", [[0, "v", 1, "x", "s1", "s2", "g", "a", "b", "c", "d"]],
                 SWAG_HEADER[:-1])
    assert readers.read_swag_csv(test, labeled=False)[0].label is None
    # A test file with labels (e.g. val.csv predicted as a test set) keeps them.
    assert [e.label for e in readers.read_swag_csv(path, labeled=False)] == [2, 0]
    with pytest.raises(DataError, match=r"test.csv: line 1: .*lacks \['label'\]"):
        readers.read_swag_csv(test)


@pytest.mark.parametrize("row, message", [
    ([0, "v", 1, "x", "s1", "s2", "g", "a", "b", "c", "d", 4],
     r"bad.csv: line 2: label 4 is not an index of its 4 endings"),
    ([0, "v", 1, "x", "s1", "s2", "g", "a", "b", "c", "d", "two"],
     r"bad.csv: line 2: label 'two' is not an ending index"),
    ([0, "v", 1, "x", "s1", "s2", "g", "a", "b", "c", "d", ""], r"bad.csv: line 2: empty label"),
    ([0, "v", 1, "x", "s1", "s2", "g", "a", "b", 1], r"bad.csv: line 2: 10 columns, expected 12"),
])
def test_swag_csv_errors_name_file_and_line(tmp_path, row, message):
    path = _swag(tmp_path / "bad.csv", [row])
    with pytest.raises(DataError, match=message):
        readers.read_swag_csv(path)


def test_swag_csv_header_without_sent1(tmp_path):
    path = _swag(tmp_path / "h.csv", [], ["sent2", "ending0", "ending1", "label"])
    with pytest.raises(DataError, match=r"h.csv: line 1: .*lacks \['sent1'\]"):
        readers.read_swag_csv(path)
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        readers.read_swag_csv(str(tmp_path / "nope.csv"))


def test_read_choice_jsonl_hellaswag_and_own_layouts(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(o) for o in [
        {"ind": 24, "ctx": "A man is sitting. He", "ctx_a": "A man is sitting.", "ctx_b": "He",
         "endings": ["stands", "sings", "sleeps", "sits"], "label": 3},
        {"context": "Pick one.", "endings": ["x", "y"], "label": 0, "id": "q7"},
        {"context": "Unlabelled.", "start": "Then", "endings": ["x", "y"]},
    ]) + "\n\n", encoding="utf-8")
    assert readers.read_choice_jsonl(str(path)) == [
        ChoiceExample("24", "A man is sitting.", "He", ("stands", "sings", "sleeps", "sits"), 3),
        ChoiceExample("q7", "Pick one.", "", ("x", "y"), 0),
        ChoiceExample("2", "Unlabelled.", "Then", ("x", "y"), None)]


@pytest.mark.parametrize("line, message", [
    ('{"question": "q", "endings": ["a", "b"]}', r"line 2: no 'context'"),
    ('{"context": "q", "endings": ["a"]}', r"line 2: 'endings' must be a list of at least 2"),
    ('{"context": "q", "endings": ["a", "b"], "label": 2}', r"line 2: label 2 is not an index"),
    ('{"context": "q", "endings": ["a", "b"]', r"line 2: not JSON"),
    ('["context"]', r"line 2: expected a JSON object, got list"),
])
def test_choice_jsonl_errors_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"context": "ok", "endings": ["a", "b"], "label": 1}\n' + line + "\n")
    with pytest.raises(DataError, match="bad.jsonl: " + message):
        readers.read_choice_jsonl(str(path))


# --- features and scores against transformers ----------------------------------------------

def test_features_match_transformers(golden, tok):
    """Our features of the golden questions are exactly the ids, mask and segments HF's
    tokenizer gives run_swag's (context, start + ending) pairs, truncation included: the
    second question fills all 40 positions of every choice."""
    g, examples = golden
    f = choice.convert_examples(examples, tok, int(g["max_length"]))
    assert (g["attention_mask"][1].sum(-1) == 40).all()  # every choice of it was cut
    np.testing.assert_array_equal(f["input_ids"], g["input_ids"])
    np.testing.assert_array_equal(f["input_mask"], g["attention_mask"])
    np.testing.assert_array_equal(f["segment_ids"], g["token_type_ids"])
    np.testing.assert_array_equal(f["label_ids"], g["labels"])
    np.testing.assert_array_equal(f["example_index"], [0, 1])


def test_feature_layout_by_hand(tok):
    ex = ChoiceExample("0", "hello world", "the", ("unaffable x", "x"), 1)
    f = choice.convert_examples([ex], tok, 9)
    cls, sep = tok.cls_id, tok.sep_id
    a, b0, b1 = tok.encode("hello world"), tok.encode("the unaffable x"), tok.encode("the x")
    assert len(a) == 2 and len(b0) == 5 and len(b1) == 2
    # Choice 0 is cut longest-first to 9 (6 pieces + 3 specials): B (5) loses its last
    # piece; choice 1 fits and is padded.
    np.testing.assert_array_equal(f["input_ids"][0, 0], [cls, *a, sep, *b0[:4], sep])
    np.testing.assert_array_equal(f["input_ids"][0, 1], [cls, *a, sep, *b1, sep, 0, 0])
    np.testing.assert_array_equal(f["segment_ids"][0, 1], [0, 0, 0, 0, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(f["input_mask"][0, 1], [1] * 7 + [0, 0])
    assert f["input_ids"].shape == (1, 2, 9) and f["label_ids"].tolist() == [1]
    with pytest.raises(DataError, match=r"dev.csv: example b has 3 endings, example 0 has 2"):
        choice.convert_examples([ex, ChoiceExample("b", "q", "", ("1", "2", "3"), 0)], tok, 9,
                                source="dev.csv")


def test_scores_and_loss_match_transformers(golden, minilm_dir):
    """The MiniLM encoder plus the golden classifier: BertForMultipleChoice's scores and the
    task's loss equal HF BertForMultipleChoice's logits and loss."""
    g, _ = golden
    config = config_from_hf(json.loads((minilm_dir / "config.json").read_text()))
    state = dict(load_file(minilm_dir / "model.safetensors"))
    state["classifier.weight"] = g["classifier_weight"]
    state["classifier.bias"] = g["classifier_bias"]
    params, report = hf_to_params(state, config)
    assert "classifier" in report["heads"]
    scores = jax.jit(BertForMultipleChoice(config).apply)(
        {"params": params}, g["input_ids"], g["attention_mask"], g["token_type_ids"])
    assert scores.shape == (2, 4)
    np.testing.assert_allclose(np.asarray(scores), g["logits"], atol=1e-4)
    task = choice.ChoiceTask("jsonl", train_file="t", dev_file="d")
    batch = {"label_ids": jnp.asarray(g["labels"]), "example_weights": jnp.ones([2])}
    loss, m = task.objective(scores, batch)
    assert float(loss) == pytest.approx(float(g["loss"]), abs=1e-5)
    assert float(m["correct"]) == float((g["logits"].argmax(-1) == g["labels"]).sum())
    # A zero-weight (filler) row changes nothing.
    padded = {"label_ids": jnp.asarray([*g["labels"], 3]),
              "example_weights": jnp.asarray([1.0, 1.0, 0.0])}
    loss2, _ = task.objective(jnp.concatenate([scores, jnp.asarray([[9.0, 0, 0, 0]])]), padded)
    assert float(loss2) == pytest.approx(float(loss), abs=1e-6)


# --- the task and the driver ----------------------------------------------------------------

def test_task_needs_its_files(tok):
    with pytest.raises(ValueError, match=r"'swag' reads files: set task.train_file "
                                         r"\(tfds has no SWAG\)"):
        choice.ChoiceTask("swag").train_features(tok)
    with pytest.raises(ValueError, match=r"'jsonl' reads files: set task.dev_file$"):
        choice.ChoiceTask("jsonl", train_file="t.jsonl").eval_sets(tok)
    with pytest.raises(ValueError, match=r"'hellaswag' reads files: set task.train_file"):
        choice.ChoiceTask("hellaswag", dev_file="d.jsonl").train_features(tok)
    # A missing dev or test file is named before the training set is read and tokenised.
    train = str(DATA / "choice" / "train.csv")
    with pytest.raises(FileNotFoundError, match=r"task.dev_file=nope/val.csv: no such file"):
        choice.ChoiceTask("swag", train, "nope/val.csv").train_features(tok)
    with pytest.raises(FileNotFoundError, match=r"task.test_file=nope/test.csv: no such file"):
        choice.ChoiceTask("swag", train, train, "nope/test.csv").train_features(tok)
    with pytest.raises(ValueError, match=r"unknown multiple-choice task 'race'"):
        choice.ChoiceTask("race")
    with pytest.raises(ValueError, match=r"configs/swag.py:race: unknown format"):
        load_config("configs/swag.py:race")


def test_dev_set_needs_labels(tmp_path, tok):
    path = tmp_path / "dev.jsonl"
    path.write_text('{"context": "q", "endings": ["a", "b"]}\n')
    task = choice.ChoiceTask("jsonl", train_file=str(path), dev_file=str(path))
    with pytest.raises(DataError, match=r"dev.jsonl: the dev set picks the best run"):
        task.eval_sets(tok)
    with pytest.raises(DataError, match=r"dev.jsonl: 1 training questions have no label"):
        task.train_features(tok)


def test_finetune_swag_csv_tiny_model(tmp_path, compile_cache):
    """configs/swag.py on the authored SWAG-format set (tests/tasks/data/choice): a tiny
    random BERT, 6 steps; the dev predictions cover every question in order with
    probabilities that sum to 1, the run's accuracy is computed from them, and val.csv is
    also predicted (and, having labels, scored) as a test file."""
    c = load_config("configs/swag.py", {
        "task.train_file": str(DATA / "choice" / "train.csv"),
        "task.dev_file": str(DATA / "choice" / "val.csv"),
        "task.test_file": str(DATA / "choice" / "val.csv"),
        "task.max_seq_length": 40, "task.cache_dir": str(tmp_path / "cache"),
        "tokenizer.vocab_file": str(VOCAB), "train.steps": 6, "train.log_every": 3,
        "train.eval_batch_size": 48, "train.tensorboard": False,
        "schedule.lr": 1e-3, "model.hidden_size": 32, "model.num_hidden_layers": 1,
        "model.num_attention_heads": 2, "model.intermediate_size": 64,
        "model.max_position_embeddings": 64})
    assert c.train.batch_size == 16 and c.task.kind == "choice"  # the paper's SWAG batch
    summary = finetune.run(c, str(tmp_path / "work"), progress=False)
    run = tmp_path / "work" / "run_0"
    rows = [l.split("\t") for l in (run / "choice_predictions-dev.tsv").read_text().splitlines()]
    assert rows[0] == ["index", "prediction", "prob_0", "prob_1", "prob_2", "prob_3"]
    gold = readers.read_swag_csv(str(DATA / "choice" / "val.csv"))
    assert len(rows) == 161 and [r[0] for r in rows[1:]] == [e.guid for e in gold]
    probs = np.array([[float(x) for x in r[2:]] for r in rows[1:]])
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    preds = np.array([int(r[1]) for r in rows[1:]])
    # The chosen ending has the highest probability (rounded to 6 decimals, near-uniform
    # probabilities of this barely trained model tie, so not necessarily the first maximum).
    np.testing.assert_array_equal(probs[np.arange(len(preds)), preds], probs.max(1))
    accuracy = float(np.mean(preds == [e.label for e in gold]))
    assert summary["dev/accuracy_mean"] == pytest.approx(accuracy)
    assert (run / "choice_predictions-test.tsv").read_text() == \
        (run / "choice_predictions-dev.tsv").read_text()
    # val.csv as the test file has its labels: scored too, the same accuracy as dev.
    assert summary["test/accuracy_mean"] == pytest.approx(accuracy)
    assert (tmp_path / "work" / "best_model" / "bert_config.json").exists()
    assert len(list((tmp_path / "cache").glob("choice-swag-*.tfrecord"))) == 3
    # The cached [N, 4, 40] features read back as built.
    task = choice.ChoiceTask("swag", str(DATA / "choice" / "train.csv"),
                             str(DATA / "choice" / "val.csv"), max_seq_length=40,
                             cache_dir=str(tmp_path / "cache"), vocab_file=str(VOCAB))
    tok = load_tokenizer(vocab_file=str(VOCAB), do_lower_case=True)
    cached = task.train_features(tok)
    fresh = choice.convert_examples(task.read("train"), tok, 40)
    assert cached["input_ids"].shape == (320, 4, 40)
    for k in fresh:
        np.testing.assert_array_equal(cached[k], fresh[k])
