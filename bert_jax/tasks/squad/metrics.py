"""SQuAD v1.1 / v2.0 scoring with the semantics of the official evaluation scripts
(evaluate-v1.1.py, evaluate-v2.0.py), re-implemented so predictions are scored in-process.

Answer normalization (both versions): lowercase, drop ASCII punctuation
(`string.punctuation`), drop the articles a/an/the as whole words, collapse whitespace.

Differences between the two scripts that matter and are kept here:
  * v1.1 F1 of an empty prediction is 0; v2.0 F1 is 1 when both prediction and gold
    normalize to nothing (the "no answer" case), else 0.
  * v2.0 drops gold answers that normalize to "" and uses [""] when none is left
    (unanswerable question); it applies `na_prob > na_prob_thresh` => predict no answer,
    and reports HasAns_* / NoAns_* splits and best_exact / best_f1 thresholds.
  * v1.1 walks the dataset's qas and counts each one, so an id that occurs twice is
    scored twice (each time against that occurrence's answers); v2.0 keys its scores by
    id, so it counts such an id once, with the answers of its last occurrence.
  * A question without a prediction: v1.1 prints "Unanswered question <id> will receive
    score 0." and scores it 0; so do we, and count it under "missing". v2.0 prints
    "Missing prediction for <id>" and leaves it out of the raw scores (exact / f1 / total
    would cover the answered questions only), then its HasAns / NoAns split looks the id
    up and stops with a KeyError: it reports no score. We raise ValueError naming the
    ids. Likewise a question without a na_prob (KeyError in apply_no_ans_threshold).
Scores are percentages, as the scripts print them.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Mapping, Optional

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, version: str = "2.0") -> float:
    pred, ref = _tokens(prediction), _tokens(gold)
    if version == "2.0" and (not pred or not ref):
        return float(pred == ref)
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def iter_questions(dataset: Iterable[Mapping]):
    """Yields (qid, [gold texts]) from SQuAD JSON's `data` list (articles -> paragraphs -> qas)."""
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                yield qa["id"], [a["text"] for a in qa.get("answers", [])]


def evaluate_v1(dataset, predictions: Mapping[str, str]) -> dict:
    """{"exact_match", "f1", "total", "missing"} as evaluate-v1.1.py (percentages); total
    and missing count occurrences in the dataset."""
    questions = list(iter_questions(dataset))
    if not questions:
        raise ValueError("evaluate_v1: the dataset has no questions")
    exact = f1_sum = 0.0
    missing = 0
    for qid, answers in questions:
        if qid not in predictions:
            missing += 1
            continue
        pred = predictions[qid]
        exact += max(exact_match(pred, a) for a in answers)
        f1_sum += max(f1(pred, a, "1.1") for a in answers)
    n = len(questions)
    return {"exact_match": 100.0 * exact / n, "f1": 100.0 * f1_sum / n, "total": n,
            "missing": missing}


def _mean(scores: Mapping[str, float], qids) -> float:
    qids = list(qids)
    return 100.0 * sum(scores[q] for q in qids) / len(qids)


def _best_threshold(predictions, scores, na_probs, has_answer):
    """Threshold on na_prob maximising the score when every question with na_prob above it
    is answered "no answer" (evaluate-v2.0.py's find_best_thresh). Questions are taken in
    a stable sort of na_probs by value, so equal na_probs keep na_probs' own key order (the
    na_prob file's): within a run of equal na_probs, that order decides where the running
    score peaks, so best_* can depend on it."""
    score = best = sum(1 for q in has_answer if not has_answer[q])
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            score += scores[qid]
        else:
            score -= 1 if predictions[qid] else 0
        if score > best:
            best, best_thresh = score, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def _require_every(golds, mapping, what: str):
    absent = [q for q in golds if q not in mapping]
    if absent:
        shown = ", ".join(repr(q) for q in absent[:5])
        raise ValueError(f"evaluate_v2: {len(absent)} of {len(golds)} question(s) have no "
                         f"{what} ({shown}{', ...' if len(absent) > 5 else ''}); "
                         "evaluate-v2.0.py reports no score for such a set")


def evaluate_v2(dataset, predictions: Mapping[str, str],
                na_probs: Optional[Mapping[str, float]] = None,
                na_prob_thresh: float = 1.0) -> dict:
    """evaluate-v2.0.py's output dict: exact, f1, total, HasAns_*, NoAns_*, and with na_probs
    best_exact(_thresh), best_f1(_thresh). An empty prediction means "no answer". Every
    question needs a prediction, and a na_prob when na_probs is given (ValueError)."""
    golds = dict(iter_questions(dataset))  # a repeated id: last answers, first position
    if not golds:
        raise ValueError("evaluate_v2: the dataset has no questions")
    _require_every(golds, predictions, "prediction")
    if na_probs is not None:
        _require_every(golds, na_probs, "na_prob")
    probs = na_probs if na_probs is not None else dict.fromkeys(golds, 0.0)
    has_answer = {q: bool(a) for q, a in golds.items()}
    exact_raw, f1_raw = {}, {}
    for qid, answers in golds.items():
        answers = [a for a in answers if normalize_answer(a)] or [""]
        pred = predictions[qid]
        exact_raw[qid] = max(exact_match(pred, a) for a in answers)
        f1_raw[qid] = max(f1(pred, a, "2.0") for a in answers)

    def thresholded(raw):
        return {q: (float(not has_answer[q]) if probs[q] > na_prob_thresh else s)
                for q, s in raw.items()}

    exact, f1s = thresholded(exact_raw), thresholded(f1_raw)
    out = {"exact": _mean(exact, golds), "f1": _mean(f1s, golds), "total": len(golds)}
    for name, flag in (("HasAns", True), ("NoAns", False)):
        qids = [q for q in golds if has_answer[q] == flag]
        if qids:
            out.update({f"{name}_exact": _mean(exact, qids), f"{name}_f1": _mean(f1s, qids),
                        f"{name}_total": len(qids)})
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _best_threshold(
            predictions, exact_raw, na_probs, has_answer)
        out["best_f1"], out["best_f1_thresh"] = _best_threshold(
            predictions, f1_raw, na_probs, has_answer)
    return out


def evaluate(dataset, predictions, version: str, na_probs=None, na_prob_thresh: float = 1.0):
    """Dispatch on version "1.1" / "2.0"; both results also carry "exact" and "f1" keys."""
    if version in ("1.1", "v1.1", "1"):
        out = evaluate_v1(dataset, predictions)
        out["exact"] = out["exact_match"]
        return out
    if version in ("2.0", "v2.0", "2"):
        return evaluate_v2(dataset, predictions, na_probs, na_prob_thresh)
    raise ValueError(f"unknown SQuAD version {version!r}; expected '1.1' or '2.0'")
