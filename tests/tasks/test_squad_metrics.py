"""SQuAD EM / F1 with the official scripts' semantics, on hand-computed fixtures."""

import pytest

from bert_jax.tasks.squad import metrics as sm


def test_normalization():
    assert sm.normalize_answer("The  Cat, sat!") == "cat sat"
    assert sm.normalize_answer("an apple and A pear") == "apple and pear"
    # Articles only as whole words; punctuation removed before, so "the-end" -> "theend".
    assert sm.normalize_answer("theatre the-end") == "theatre theend"
    assert sm.normalize_answer("  \tCafé\n ") == "café"   # non-ASCII letters are kept
    assert sm.normalize_answer("“quoted”") == "“quoted”"   # only ASCII punctuation is removed
    assert sm.normalize_answer("the") == ""


def test_em_f1_pairs():
    assert sm.exact_match("the Eiffel Tower.", "Eiffel tower") == 1.0
    # pred [eiffel, tower, in, paris], gold [eiffel, tower]: P=2/4 R=1 F1=2/3
    assert sm.f1("Eiffel Tower in Paris", "the Eiffel Tower") == pytest.approx(2 / 3)
    # Repeated tokens count with multiplicity (Counter intersection).
    assert sm.f1("a b b", "b b b c") == pytest.approx(2 * (1.0 * 0.5) / 1.5)
    # Empty prediction: v1.1 gives 0; v2.0 gives 1 iff the gold is also empty.
    assert sm.f1("", "Paris", version="1.1") == 0.0
    assert sm.f1("", "Paris", version="2.0") == 0.0
    assert sm.f1("", "", version="2.0") == 1.0
    assert sm.f1("the", "", version="2.0") == 1.0  # normalizes to nothing
    assert sm.exact_match("", "") == 1.0


def _dataset(qas):
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": [
        {"id": qid, "question": "q", "answers": [{"text": a, "answer_start": 0} for a in answers]}
        for qid, answers in qas]}]}]


def test_evaluate_v1_max_over_golds_and_missing():
    data = _dataset([("q1", ["Paris", "the city of Paris"]), ("q2", ["1066"]), ("q3", ["x y"])])
    preds = {"q1": "city of Paris", "q2": "in 1066 AD"}
    out = sm.evaluate_v1(data, preds)
    # q1: EM 1 (second gold), q2: EM 0 F1 = 2*(1/3*1)/(4/3) = 0.5, q3 missing -> 0.
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 * (1 + 0.5 + 0) / 3)
    assert out["total"] == 3 and out["missing"] == 1


def test_evaluate_v2_threshold_and_splits():
    data = _dataset([("a", ["Paris"]), ("b", ["Rome"]), ("n1", []), ("n2", [])])
    preds = {"a": "Paris", "b": "", "n1": "", "n2": "London"}
    na = {"a": 0.1, "b": 0.9, "n1": 0.8, "n2": 0.3}
    out = sm.evaluate_v2(data, preds, na)  # default threshold 1.0: predictions as given
    assert out["exact"] == pytest.approx(50.0)  # a and n1 right
    assert out["HasAns_exact"] == pytest.approx(50.0) and out["HasAns_total"] == 2
    assert out["NoAns_exact"] == pytest.approx(50.0) and out["NoAns_total"] == 2
    # With threshold 0.2, every question with na_prob > 0.2 becomes "no answer":
    # a stays (Paris, right), b -> no answer (wrong), n1, n2 -> no answer (right).
    out = sm.evaluate_v2(data, preds, na, na_prob_thresh=0.2)
    assert out["exact"] == pytest.approx(75.0)
    # best threshold: sorted by na_prob a(.1) n2(.3) n1(.8) b(.9); start = 2 (no-answer count)
    # a: +1 -> 3 (best, thresh .1); n2: pred non-empty -> 2; n1: pred empty -> 2; b: +0 -> 2.
    assert out["best_exact"] == pytest.approx(75.0) and out["best_exact_thresh"] == 0.1


def test_evaluate_v1_scores_every_occurrence_of_a_repeated_id():
    # evaluate-v1.1.py walks the qas and counts each, against that occurrence's answers:
    # q#1 EM 1, r EM 1, q#2 ("Paris" vs "Rome") 0, m twice missing -> 0; total 5.
    data = _dataset([("q", ["Paris"]), ("r", ["1066"]), ("q", ["Rome"]), ("m", ["x"]),
                     ("m", ["x"])])
    out = sm.evaluate_v1(data, {"q": "Paris", "r": "1066"})
    assert out["total"] == 5 and out["missing"] == 2
    assert out["exact_match"] == pytest.approx(100 * 2 / 5)
    assert out["f1"] == pytest.approx(100 * 2 / 5)


def test_evaluate_v2_scores_a_repeated_id_once_with_its_last_answers():
    # evaluate-v2.0.py keys qid_to_has_ans and the raw scores by id: the last "q" wins.
    data = _dataset([("q", ["Paris"]), ("r", ["1066"]), ("q", ["Rome"])])
    out = sm.evaluate_v2(data, {"q": "Paris", "r": "1066"})
    assert out["total"] == 2 and out["exact"] == pytest.approx(50.0)
    assert out["HasAns_total"] == 2


def test_evaluate_v2_needs_every_prediction_and_na_prob():
    # evaluate-v2.0.py skips "q2" in get_raw_scores, then make_eval_dict's HasAns split
    # looks it up: KeyError, no score. Same for a na_prob missing in apply_no_ans_threshold.
    data = _dataset([("q1", ["Paris"]), ("q2", ["Rome"])])
    with pytest.raises(ValueError, match=r"1 of 2 question\(s\) have no prediction \('q2'\)"):
        sm.evaluate_v2(data, {"q1": "Paris"})
    with pytest.raises(ValueError, match=r"1 of 2 question\(s\) have no na_prob \('q1'\)"):
        sm.evaluate_v2(data, {"q1": "Paris", "q2": "Rome"}, {"q2": 0.5})
    with pytest.raises(ValueError, match="no prediction"):
        sm.evaluate(data, {"q2": "Rome"}, "2.0")


def test_best_threshold_ties_follow_the_na_prob_order():
    # find_best_thresh: start at the no-answer count (1), walk
    # sorted(na_probs, key=na_probs.get), a stable sort over na_probs' own key order.
    # h: has answer, right (+1); n: no answer but answered "London" (-1).
    data = _dataset([("h", ["Paris"]), ("n", [])])
    preds = {"h": "Paris", "n": "London"}
    # Order n, h: 1 -> 0 -> 1, never above 1: best 1 of 2 at the initial threshold 0.0.
    out = sm.evaluate_v2(data, preds, {"n": 0.5, "h": 0.5})
    assert out["best_exact"] == pytest.approx(50.0) and out["best_exact_thresh"] == 0.0
    assert out["best_f1"] == pytest.approx(50.0) and out["best_f1_thresh"] == 0.0
    # Order h, n: 1 -> 2 (best, at h's 0.5) -> 1.
    out = sm.evaluate_v2(data, preds, {"h": 0.5, "n": 0.5})
    assert out["best_exact"] == pytest.approx(100.0) and out["best_exact_thresh"] == 0.5


def test_evaluate_v2_empty_gold_texts_count_as_no_answer():
    data = _dataset([("q", ["the", "."])])  # both normalize to "" -> unanswerable gold [""]
    assert sm.evaluate_v2(data, {"q": ""})["exact"] == 100.0
    assert sm.evaluate_v2(data, {"q": "x"})["f1"] == 0.0


def test_dispatch_and_errors():
    data = _dataset([("q", ["x"])])
    assert sm.evaluate(data, {"q": "x"}, "1.1")["exact"] == 100.0
    assert sm.evaluate(data, {"q": "x"}, "2.0")["f1"] == 100.0
    with pytest.raises(ValueError, match="unknown SQuAD version"):
        sm.evaluate(data, {}, "3")
    with pytest.raises(ValueError, match="no questions"):
        sm.evaluate_v1([], {})
