"""SQuAD start/end logits -> answer texts, n-best lists and no-answer odds (run_squad.py's
write_predictions), with answers sliced from the original context by character offsets.

Per example, over all its doc_stride windows:
  * candidates: the n_best_size highest start and end logits of each window; kept if both
    are context tokens, the start has its max context in this window, start <= end and the
    span is at most max_answer_length tokens;
  * score = start_logit + end_logit, added as Python floats (float64) from the float32
    logits, as run_squad.py does: a float32 sum rounds off differences below about 6e-8 of
    the score, which can tie or reorder near-equal spans that the original ranks apart;
  * the null score is the lowest [CLS] start+end over windows (v2); the n-best list is
    deduplicated by text, probabilities = softmax of scores (run_squad.py's
    _compute_softmax);
  * v2: score_diff = null score - start_logit - end_logit of the best non-null answer goes
    to null_odds.json, and the prediction is "" when score_diff > null_score_diff_threshold.
"""

from __future__ import annotations

import collections
import json
import math
from typing import Mapping, Sequence

import numpy as np

from bert_jax import paths
from bert_jax.tasks.squad.reader import SquadExample


def _top(logits: np.ndarray, n: int) -> np.ndarray:
    return np.argsort(-logits, kind="stable")[:n]


def postprocess(examples: Sequence[SquadExample], features: Mapping[str, np.ndarray],
                start_logits: np.ndarray, end_logits: np.ndarray, version_2: bool,
                n_best_size: int = 20, max_answer_length: int = 30,
                null_score_diff_threshold: float = 0.0):
    """start_logits, end_logits: <float>[num_features, L], row i = features row i.
    Returns (predictions {qid: text}, nbest {qid: [{text, probability, start_logit,
    end_logit}]}, null_odds {qid: score_diff} (v2 only, else empty))."""
    by_example = collections.defaultdict(list)
    for row, ex_i in enumerate(features["example_index"]):
        by_example[int(ex_i)].append(row)
    predictions, nbest_json, null_odds = {}, {}, {}
    for ex_i, ex in enumerate(examples):
        candidates = []  # (score, start_logit, end_logit, char_start, char_end)
        null_score, null_start, null_end = None, 0.0, 0.0
        for row in by_example.get(ex_i, []):
            s_log, e_log = start_logits[row], end_logits[row]
            cs, ce = features["char_start"][row], features["char_end"][row]
            mc = features["max_context"][row]
            if version_2:
                sl, el = float(s_log[0]), float(e_log[0])
                if null_score is None or sl + el < null_score:
                    null_score, null_start, null_end = sl + el, sl, el
            for s in _top(s_log, n_best_size):
                if cs[s] < 0 or not mc[s]:
                    continue
                for e in _top(e_log, n_best_size):
                    if ce[e] < 0 or e < s or e - s + 1 > max_answer_length:
                        continue
                    sl, el = float(s_log[s]), float(e_log[e])
                    candidates.append((sl + el, sl, el, int(cs[s]), int(ce[e])))
        if null_score is not None:  # the [CLS] "no answer" competes as a candidate
            candidates.append((null_score, null_start, null_end, -1, -1))
        candidates.sort(key=lambda c: -c[0])
        nbest, seen = [], set()
        for score, sl, el, c0, c1 in candidates:
            if len(nbest) >= n_best_size:
                break
            text = ex.context[c0:c1] if c0 >= 0 else ""
            if text in seen:
                continue
            seen.add(text)
            nbest.append({"text": text, "start_logit": sl, "end_logit": el, "score": score})
        if null_score is not None and "" not in seen:
            # As run_squad.py: the null answer is always listed, after the n best if needed.
            nbest.append({"text": "", "start_logit": null_start, "end_logit": null_end,
                          "score": null_score})
        if not nbest:
            # No window had a valid span (e.g. an empty context): the original's fallback.
            nbest = [{"text": "empty" if not version_2 else "", "start_logit": 0.0,
                      "end_logit": 0.0, "score": 0.0}]
        top = max(x["score"] for x in nbest)
        exps = [math.exp(x["score"] - top) for x in nbest]
        total = sum(exps)
        probs = [x / total for x in exps]
        nbest_json[ex.qid] = [{"text": x["text"], "probability": float(p),
                               "start_logit": x["start_logit"], "end_logit": x["end_logit"]}
                              for x, p in zip(nbest, probs)]
        best_non_null = next((x for x in nbest if x["text"]), None)
        if not version_2:
            predictions[ex.qid] = nbest[0]["text"]
            continue
        if best_non_null is None:
            predictions[ex.qid] = ""
            null_odds[ex.qid] = float("inf") if null_score is None else 0.0
            continue
        diff = ((null_score if null_score is not None else -math.inf)
                - best_non_null["start_logit"] - best_non_null["end_logit"])
        null_odds[ex.qid] = diff
        predictions[ex.qid] = "" if diff > null_score_diff_threshold else best_non_null["text"]
    return predictions, nbest_json, null_odds


def write_json(path: str, obj) -> None:
    with paths.write_atomic(path) as f:
        f.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def write_outputs(out_dir: str, predictions, nbest, null_odds, prefix: str = "") -> list[str]:
    """predictions.json, nbest_predictions.json (+ null_odds.json for v2) in out_dir."""
    written = []
    for name, obj in (("predictions.json", predictions), ("nbest_predictions.json", nbest),
                      ("null_odds.json", null_odds)):
        if name == "null_odds.json" and not null_odds:
            continue
        path = paths.join(out_dir, prefix + name)
        write_json(path, obj)
        written.append(path)
    return written
