"""NER: CoNLL reader, first-sub-token labelling, loss, decoding back to word tags."""

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.tasks.ner import reader as readers
from bert_jax.tasks.readers import DataError
from bert_jax.tokenization import load_tokenizer
from bert_jax.tasks import ner
from bert_jax.tasks.base import EvalSet

from tests.tasks.conftest import DATA, VOCAB


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(vocab_file=str(VOCAB), do_lower_case=True)


def test_read_conll(tmp_path):
    path = tmp_path / "eng.testa"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\n"
                    "German JJ I-NP I-MISC\n\nPeter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\n")
    ex = readers.read_conll(str(path))
    assert [e.words for e in ex] == [("EU", "rejects", "German"), ("Peter", "Blackburn")]
    assert ex[1].tags == ("I-PER", "I-PER")
    path.write_text("EU I-ORG\nbroken\n")
    with pytest.raises(DataError, match=r"eng.testa: line 2"):
        readers.read_conll(str(path))


def test_first_subtoken_labels(tok):
    labels = ner.CONLL2003_LABELS
    ex = readers.NerExample("0", ("Unaffable", "Blackburn", "wins"), ("O", "B-PER", "O"))
    f = ner.convert_examples([ex], tok, 16, labels)
    pieces = [tok.encode(w) for w in ex.words]
    assert len(pieces[0]) == 3  # una ##ffa ##ble
    ids = [tok.cls_id] + sum(pieces, []) + [tok.sep_id]
    np.testing.assert_array_equal(f["input_ids"][0, :len(ids)], ids)
    first = [1, 1 + len(pieces[0]), 1 + len(pieces[0]) + len(pieces[1])]
    assert np.flatnonzero(f["label_weights"][0]).tolist() == first
    assert f["label_ids"][0, first].tolist() == [0, labels.index("B-PER"), 0]
    assert f["word_index"][0, first].tolist() == [0, 1, 2]
    with pytest.raises(DataError, match="tag 'B-FOO'"):
        ner.convert_examples([readers.NerExample("1", ("x",), ("B-FOO",))], tok, 8, labels)


def test_truncation_predicts_o_for_cut_words(tok):
    ex = readers.NerExample("0", tuple(["Paris"] * 10), tuple(["I-LOC"] * 10))
    f = ner.convert_examples([ex], tok, 6, ner.CONLL2003_LABELS)  # room for 4 words
    assert f["label_weights"].sum() == 4
    pred = ner.decode([ex], f, f["label_ids"], ner.CONLL2003_LABELS)
    assert pred[0] == ["I-LOC"] * 4 + ["O"] * 6


def test_token_loss_by_hand():
    logits = np.zeros((1, 3, 2), np.float32)
    logits[0, 1] = [0.0, 2.0]
    batch = {"label_ids": np.array([[0, 1, 0]]), "label_weights": np.array([[0, 1, 1]]),
             "example_weights": np.array([1.0])}
    loss, m = ner.token_loss(jnp.asarray(logits), batch)
    want = (np.log(1 + np.exp(-2.0)) + np.log(2.0)) / 2
    assert float(loss) == pytest.approx(want, rel=1e-6) and float(m["count"]) == 2


def test_authored_set_gold_round_trip(tok, tmp_path):
    """Gold label ids pushed through decode give back every gold tag: entity F1 = 1."""
    task = ner.NerTask(train_file=str(DATA / "conll" / "train.txt"),
                       dev_file=str(DATA / "conll" / "dev.txt"), max_seq_length=96)
    (dev,) = task.eval_sets(tok)
    assert len(dev.examples) == 100
    kept = {"pred_ids": dev.features["label_ids"], "example_index": dev.features["example_index"]}
    out = task.score(dev, kept)
    assert out["f1"] == 1.0 and out["token_accuracy"] == 1.0
    # All-"O" predictions: no entity found.
    none = {"pred_ids": np.zeros_like(dev.features["label_ids"]),
            "example_index": dev.features["example_index"]}
    assert task.score(dev, none)["f1"] == 0.0
    (path,) = task.write_predictions(EvalSet("dev", dev.features, dev.examples), kept,
                                     str(tmp_path))
    first = open(path, encoding="utf-8").readline().split()
    assert first == [dev.examples[0].words[0], dev.examples[0].tags[0], dev.examples[0].tags[0]]
