"""Host-side (numpy) metrics of sentence and pair tasks: accuracy, F1, Matthews correlation,
Pearson and Spearman correlation, and the GLUE metric set of each task.

Accuracy, F1 and MCC are a few lines each and written here (scikit-learn is a test-only
dependency); Pearson and Spearman come from scipy.stats (installed with jax), whose NaN and
constant-input rules they keep. tests/tasks/test_metrics.py checks every function against
scikit-learn / scipy, edge cases included (single-class MCC, no positive predictions, ties,
constant inputs, NaN predictions). All functions take 1-D arrays of equal length and return
Python floats.
"""

from __future__ import annotations

import warnings
from typing import Mapping, Optional, Sequence

import numpy as np
from scipy import stats


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


def _correlation(fn, x, y, name: str) -> float:
    x, y = _check(x, y, name)
    if x.size < 2:
        return float("nan")  # one pair is constant on both sides (scipy's pearsonr raises)
    with warnings.catch_warnings():
        # A constant input gives NaN, the documented result; scipy also warns about it.
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        # float64: scipy computes in the input dtype, and STS-B predictions are float32.
        return float(fn(x.astype(np.float64), y.astype(np.float64)).statistic)


def pearson(x, y) -> float:
    """scipy.stats.pearsonr: NaN when either input is constant or holds a NaN (so a
    diverged regression run shows NaN, not a plausible score)."""
    return _correlation(stats.pearsonr, x, y, "pearson")


def spearman(x, y) -> float:
    """scipy.stats.spearmanr (ties get the mean rank): NaN when either input is constant
    or holds a NaN (nan_policy="propagate"), rather than ranking a NaN above every number."""
    return _correlation(stats.spearmanr, x, y, "spearman")


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
