"""Host-side (numpy) metrics of sentence and pair tasks: accuracy, F1, Matthews correlation,
Pearson and Spearman correlation, and the GLUE metric set of each task.

Written by hand rather than imported from scikit-learn / scipy so that the runtime does not
depend on them; tests/tasks/test_metrics.py checks every function against both libraries,
edge cases included (single-class MCC, no positive predictions, ties, constant inputs).
All functions take 1-D arrays of equal length and return Python floats.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np


def _check(labels, preds, name: str):
    labels, preds = np.asarray(labels), np.asarray(preds)
    if labels.shape != preds.shape or labels.ndim != 1:
        raise ValueError(f"{name}: labels {labels.shape} and predictions {preds.shape} must be "
                         "1-D arrays of the same length")
    if labels.size == 0:
        raise ValueError(f"{name}: no examples to score")
    return labels, preds


def accuracy(labels, preds) -> float:
    labels, preds = _check(labels, preds, "accuracy")
    return float(np.mean(labels == preds))


def f1_binary(labels, preds, positive=1) -> float:
    """F1 of the positive class. 0.0 when there are no true positives (including the
    degenerate case with no positives at all), as sklearn's f1_score(zero_division=0)."""
    labels, preds = _check(labels, preds, "f1")
    tp = float(np.sum((preds == positive) & (labels == positive)))
    fp = float(np.sum((preds == positive) & (labels != positive)))
    fn = float(np.sum((preds != positive) & (labels == positive)))
    if tp == 0.0:
        return 0.0
    return 2.0 * tp / (2.0 * tp + fp + fn)


def matthews_corrcoef(labels, preds) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K, as sklearn). 0.0 when either side has
    a single class (the denominator vanishes): the convention of sklearn and of GLUE's CoLA."""
    labels, preds = _check(labels, preds, "matthews_corrcoef")
    classes, idx = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    k, n = len(classes), len(labels)
    conf = np.zeros((k, k), np.float64)
    np.add.at(conf, (idx[:n], idx[n:]), 1.0)
    t = conf.sum(axis=1)  # true count per class
    p = conf.sum(axis=0)  # predicted count per class
    c, s = np.trace(conf), float(n)
    cov_tp = c * s - t @ p
    cov_pp = s * s - p @ p
    cov_tt = s * s - t @ t
    if cov_pp * cov_tt == 0.0:
        return 0.0
    return float(cov_tp / np.sqrt(cov_tt * cov_pp))


def pearson(x, y) -> float:
    """Pearson correlation; NaN when either input is constant (as scipy.stats.pearsonr)."""
    x, y = _check(x, y, "pearson")
    x = x.astype(np.float64) - np.mean(x, dtype=np.float64)
    y = y.astype(np.float64) - np.mean(y, dtype=np.float64)
    denom = np.sqrt(np.sum(x * x) * np.sum(y * y))
    if denom == 0.0:
        return float("nan")
    return float(np.clip(np.sum(x * y) / denom, -1.0, 1.0))


def rankdata(x) -> np.ndarray:
    """Ranks 1..n, ties get the mean of the ranks they span (scipy's method='average')."""
    x = np.asarray(x)
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # Start index of each run of equal values, and the average rank of the run.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    avg = (starts + ends + 1) / 2.0  # mean of ranks starts+1 .. ends
    run_of = np.repeat(np.arange(len(starts)), ends - starts)
    ranks = np.empty(len(x), np.float64)
    ranks[order] = avg[run_of]
    return ranks


def spearman(x, y) -> float:
    """Spearman rank correlation = Pearson of the tie-averaged ranks (scipy.stats.spearmanr)."""
    x, y = _check(x, y, "spearman")
    return pearson(rankdata(x), rankdata(y))


# --- GLUE ---------------------------------------------------------------------------------

# Metric names of each GLUE task, in the order the GLUE leaderboard reports them.
GLUE_METRICS = {
    "cola": ("mcc",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "stsb": ("pearson", "spearman"),
    "qqp": ("f1", "accuracy"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "ax": ("mcc",),
}

_FUNCTIONS = {"accuracy": accuracy, "f1": f1_binary, "mcc": matthews_corrcoef,
              "pearson": pearson, "spearman": spearman}


def compute(names: Sequence[str], labels, preds) -> dict[str, float]:
    """{name: value} for each metric name in `names` (keys of _FUNCTIONS)."""
    unknown = [n for n in names if n not in _FUNCTIONS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {sorted(_FUNCTIONS)}")
    return {n: _FUNCTIONS[n](labels, preds) for n in names}


def glue_metrics(task: str, labels, preds) -> dict[str, float]:
    """The GLUE metrics of `task` plus "score", the task's single leaderboard number (the
    mean when a task has two metrics, as the GLUE leaderboard averages them)."""
    if task not in GLUE_METRICS:
        raise ValueError(f"unknown GLUE task {task!r}; expected one of {sorted(GLUE_METRICS)}")
    out = compute(GLUE_METRICS[task], labels, preds)
    out["score"] = float(np.mean(list(out.values())))
    return out


def summarize_restarts(results: Sequence[Mapping[str, float]],
                       key: str = "score") -> dict[str, Optional[float]]:
    """Over N restarts (the paper's fix for unstable small sets): the index of the best run
    by `key`, and mean / std (population) of every metric."""
    if not results:
        raise ValueError("summarize_restarts: no results")
    best = int(np.nanargmax([r[key] for r in results]))
    out: dict[str, Optional[float]] = {"best_run": best}
    for name in results[0]:
        values = np.array([r[name] for r in results], np.float64)
        out[f"{name}_mean"] = float(np.mean(values))
        out[f"{name}_std"] = float(np.std(values))
        out[f"{name}_best"] = float(values[best])
    return out
