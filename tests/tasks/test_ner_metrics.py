"""Entity-level NER F1 matches seqeval (default mode = conlleval; strict IOB2 mode)."""

import random

import pytest

from bert_jax.tasks.ner import metrics as ner_metrics

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


# conlleval.pl's rules for B/I/E/O tags (its ".", "[" and "]" left out), re-stated: a tag
# splits at its first "-", else it is the whole chunk tag with type "" (O's type); these
# (previous, current) tag pairs end / start a chunk, and so does a change of type next to
# any tag but O.
_CONLL_END = {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
_CONLL_START = {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"),
                ("O", "E")}


def _conll_split(tag):
    prefix, sep, kind = tag.partition("-")
    return (prefix, kind) if sep else (tag, "")


def _conlleval_counts(gold, pred):
    """(correct, found guessed, found correct) as conlleval.pl counts them; sentences are
    separated by a boundary line, read as O O."""
    def end(prev, cur):
        return (prev[0], cur[0]) in _CONLL_END or (prev[0] != "O" and prev[1] != cur[1])

    def start(prev, cur):
        return (prev[0], cur[0]) in _CONLL_START or (cur[0] != "O" and prev[1] != cur[1])

    correct = found_guessed = found_correct = 0
    in_correct, last_c, last_g = False, ("O", ""), ("O", "")
    lines = [pair for g, p in zip(gold, pred) for pair in list(zip(g, p)) + [("O", "O")]]
    for c_tag, g_tag in lines:
        c, g = _conll_split(c_tag), _conll_split(g_tag)
        if in_correct:
            end_c, end_g = end(last_c, c), end(last_g, g)
            if end_c and end_g and last_g[1] == last_c[1]:
                in_correct, correct = False, correct + 1
            elif end_c != end_g or g[1] != c[1]:
                in_correct = False
        start_c, start_g = start(last_c, c), start(last_g, g)
        if start_c and start_g and g[1] == c[1]:
            in_correct = True
        found_correct += start_c
        found_guessed += start_g
        last_c, last_g = c, g
    return correct + in_correct, found_guessed, found_correct


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2"])
def test_matches_conlleval_rules_on_iob(scheme):
    rng = random.Random(f"conll-{scheme}")
    gold = [_random_tags(rng, rng.randint(1, 15), scheme) for _ in range(300)]
    pred = [[t if rng.random() < 0.7 else rng.choice(["O", "B-PER", "I-LOC", "I-PER"])
             for t in g] for g in gold]
    correct, n_pred, n_gold = _conlleval_counts(gold, pred)
    assert 0 < correct < min(n_pred, n_gold)
    out = ner_metrics.entity_f1(gold, pred)
    assert out["precision"] == correct / n_pred and out["recall"] == correct / n_gold


@pytest.mark.parametrize("tags,conlleval_phrases,ours", [
    # conlleval.pl has no S- rules and no E-X B-X end: one phrase where we (and seqeval) see two.
    (["S-PER", "S-PER"], 1, [("PER", 0, 0), ("PER", 1, 1)]),
    (["E-PER", "B-PER"], 1, [("PER", 0, 0), ("PER", 1, 1)]),
    # Bare tags: type "" opens nothing after O; after a typed tag it opens a typeless phrase.
    (["O", "PER", "PER", "O"], 0, [("PER", 1, 2)]),
    (["B-LOC", "PER", "O", "LOC"], 2, [("LOC", 0, 0), ("PER", 1, 1), ("LOC", 3, 3)]),
])
def test_where_conlleval_differs_as_documented(tags, conlleval_phrases, ours):
    assert _conlleval_counts([tags], [tags])[2] == conlleval_phrases
    assert ner_metrics.get_entities(tags) == ours


def test_bare_tags_in_seqeval_split_off_the_first_letter():
    with pytest.warns(UserWarning, match="PER seems not to be NE tag"):
        assert seqeval_metrics.sequence_labeling.get_entities(["O", "PER", "PER", "O"]) == [
            ("ER", 1, 2)]
    assert ner_metrics.get_entities(["O", "PER", "PER", "O"]) == [("PER", 1, 2)]
