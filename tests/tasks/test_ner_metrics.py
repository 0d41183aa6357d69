"""Entity-level NER F1 matches seqeval (default mode = conlleval; strict IOB2 mode)."""

import random

import pytest

from bert_jax.tasks import ner_metrics

seqeval_metrics = pytest.importorskip("seqeval.metrics")


def test_iob1_and_iob2_read_the_same_entities():
    iob1 = ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"]
    iob2 = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "B-ORG"]
    want = [("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 4), ("ORG", 5, 5)]
    assert ner_metrics.get_entities(iob1) == want
    assert ner_metrics.get_entities(iob2) == want


def test_strict_mode_drops_stray_inside_tags():
    tags = ["I-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-ORG"]
    assert ner_metrics.get_entities_strict_iob2(tags) == [("LOC", 3, 4)]
    assert ner_metrics.get_entities(tags) == [("PER", 0, 1), ("LOC", 3, 4), ("ORG", 5, 5)]


def test_hand_computed_f1():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["O", "B-ORG", "O"]]
    out = ner_metrics.entity_f1(gold, pred)
    # gold 3 entities, pred 2, 1 correct (PER): P = 1/2, R = 1/3, F1 = 0.4
    assert out["precision"] == pytest.approx(0.5)
    assert out["recall"] == pytest.approx(1 / 3)
    assert out["f1"] == pytest.approx(0.4)
    assert out["f1_PER"] == 1.0 and out["f1_LOC"] == 0.0 and out["f1_ORG"] == 0.0
    assert ner_metrics.entity_f1([["O"]], [["O"]])["f1"] == 0.0


def _random_tags(rng, n, scheme):
    kinds = ["PER", "LOC", "ORG", "MISC"]
    prefixes = {"IOB1": ["I", "I", "B"], "IOB2": ["B", "I"], "any": ["B", "I", "E", "S"]}[scheme]
    return ["O" if rng.random() < 0.4 else f"{rng.choice(prefixes)}-{rng.choice(kinds)}"
            for _ in range(n)]


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "any"])
def test_matches_seqeval_default_mode(scheme):
    rng = random.Random(scheme)
    gold = [_random_tags(rng, rng.randint(1, 15), scheme) for _ in range(200)]
    pred = [[t if rng.random() < 0.7 else rng.choice(["O", "B-PER", "I-LOC", "I-PER"])
             for t in g] for g in gold]
    out = ner_metrics.entity_f1(gold, pred)
    assert out["f1"] == pytest.approx(seqeval_metrics.f1_score(gold, pred), abs=1e-12)
    assert out["precision"] == pytest.approx(seqeval_metrics.precision_score(gold, pred), abs=1e-12)
    assert out["recall"] == pytest.approx(seqeval_metrics.recall_score(gold, pred), abs=1e-12)
    for s in range(50):
        assert ner_metrics.get_entities(gold[s]) == sorted(
            [(t, b, e) for t, b, e in seqeval_metrics.sequence_labeling.get_entities(gold[s])],
            key=lambda x: x[1])


def test_matches_seqeval_strict_iob2():
    from seqeval.scheme import IOB2

    rng = random.Random(7)
    gold = [_random_tags(rng, rng.randint(1, 15), "IOB2") for _ in range(200)]
    pred = [[t if rng.random() < 0.7 else rng.choice(["O", "B-PER", "I-LOC", "I-PER"])
             for t in g] for g in gold]
    out = ner_metrics.entity_f1(gold, pred, strict=True)
    want = seqeval_metrics.f1_score(gold, pred, mode="strict", scheme=IOB2)
    assert out["f1"] == pytest.approx(want, abs=1e-12)


def test_length_mismatch_names_the_sentence():
    with pytest.raises(ValueError, match="sentence 1"):
        ner_metrics.entity_f1([["O"], ["O", "O"]], [["O"], ["O"]])
