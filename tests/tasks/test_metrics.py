"""Sentence / pair metrics agree with scikit-learn and scipy, edge cases included."""

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from bert_jax.tasks import metrics

sklearn_metrics = pytest.importorskip("sklearn.metrics")
stats = pytest.importorskip("scipy.stats")


def _random_cases(n_cases=40, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(n_cases):
        n = int(rng.integers(1, 60))
        k = int(rng.integers(2, 4))
        yield rng.integers(0, k, n), rng.integers(0, k, n)


@pytest.mark.filterwarnings("ignore:A single label was found")  # sklearn on one class
@pytest.mark.parametrize("labels,preds", [
    ([1, 1, 1, 1], [1, 1, 1, 1]),          # single class on both sides
    ([0, 0, 0, 0], [0, 1, 0, 1]),          # single gold class
    ([0, 1, 0, 1], [1, 1, 1, 1]),          # single predicted class
    ([0, 1, 1, 0, 1], [0, 1, 0, 0, 1]),
    ([0, 1, 1, 0, 1], [1, 0, 0, 1, 0]),    # perfectly wrong: -1
    ([2, 0, 1, 2, 1, 0], [2, 1, 1, 0, 1, 0]),
])
def test_fixed_cases_match_sklearn(labels, preds):
    labels, preds = np.array(labels), np.array(preds)
    assert metrics.accuracy(labels, preds) == pytest.approx(
        sklearn_metrics.accuracy_score(labels, preds), abs=1e-12)
    assert metrics.matthews_corrcoef(labels, preds) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(labels, preds), abs=1e-12)
    if set(labels) | set(preds) <= {0, 1}:
        assert metrics.f1_binary(labels, preds) == pytest.approx(
            sklearn_metrics.f1_score(labels, preds, zero_division=0), abs=1e-12)


def test_single_class_mcc_is_zero_and_perfect_is_one():
    assert metrics.matthews_corrcoef([1, 1, 1], [1, 1, 1]) == 0.0
    assert metrics.matthews_corrcoef([0, 1, 0], [0, 1, 0]) == pytest.approx(1.0)
    assert metrics.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)


def test_f1_without_positives_is_zero():
    assert metrics.f1_binary([0, 0, 0], [0, 0, 0]) == 0.0
    assert metrics.f1_binary([1, 0, 1], [0, 0, 0]) == 0.0
    # tp=2, fp=1, fn=1 -> 2*2 / (4 + 1 + 1)
    assert metrics.f1_binary([1, 1, 0, 1], [1, 1, 1, 0]) == pytest.approx(4 / 6)


def test_random_cases_match_sklearn():
    for labels, preds in _random_cases():
        assert metrics.accuracy(labels, preds) == pytest.approx(
            sklearn_metrics.accuracy_score(labels, preds), abs=1e-12)
        assert metrics.matthews_corrcoef(labels, preds) == pytest.approx(
            sklearn_metrics.matthews_corrcoef(labels, preds), abs=1e-10)
        assert metrics.f1_binary(labels, preds) == pytest.approx(
            sklearn_metrics.f1_score(labels == 1, preds == 1, zero_division=0), abs=1e-12)


def test_correlations_match_scipy_with_ties():
    rng = np.random.default_rng(1)
    for trial in range(30):
        n = int(rng.integers(3, 50))
        # Few distinct values -> many ties, as STS-B gold scores (0.0 .. 5.0 in 0.2 steps).
        x = rng.integers(0, 6, n) / 1.0 if trial % 2 else rng.normal(size=n)
        y = x + rng.normal(scale=1.0, size=n)
        if trial % 3 == 0:
            y = np.round(y)
        if np.ptp(x) == 0 or np.ptp(y) == 0:
            continue
        assert metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-10)
        assert metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-10)


def test_constant_input_correlation_is_nan_like_scipy():
    x, y = np.ones(5), np.arange(5.0)
    with pytest.warns(Warning):
        ref = stats.pearsonr(x, y)[0]
    assert np.isnan(ref) and np.isnan(metrics.pearson(x, y)) and np.isnan(metrics.spearman(x, y))


def test_constant_input_is_nan_without_warning_or_global_filter():
    # The float64 mean of [0.1] * 3 is not 0.1: deviations of ~1e-17 are not zero, and a
    # hand-written Pearson returned 0.0 here. scipy checks for a constant array first.
    x, y = [1.0, 2.0, 3.0], [0.1] * 3
    with pytest.warns(stats.ConstantInputWarning):
        assert np.isnan(stats.pearsonr(x, y).statistic)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning that escaped would raise here
        for a, b in ((x, y), (y, x)):
            assert np.isnan(metrics.pearson(a, b)) and np.isnan(metrics.spearman(a, b))
    # Suppressed around the call only: neither importing the module nor calling it leaves a
    # filter installed (a fresh process: pytest resets the filters an import sets).
    code = ("import warnings, scipy.stats as st; from bert_jax.tasks import metrics; "
            "metrics.pearson([1.0, 2.0, 3.0], [0.1] * 3); "
            "assert not [f for f in warnings.filters if f[2] is st.ConstantInputWarning]")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[2])


def test_nan_prediction_gives_nan():
    labels = np.array([0.0, 1.0, 2.5, 5.0])
    preds = np.array([0.1, 0.9, np.nan, 4.0])  # e.g. a diverged regression head
    assert np.isnan(stats.spearmanr(labels, preds).statistic)
    # Ranking the NaN as the largest value (ranks 1, 2, 4, 3) would give rho = 0.8.
    assert np.isnan(metrics.spearman(labels, preds))
    assert np.isnan(metrics.pearson(labels, preds))
    stsb = metrics.glue_metrics("stsb", labels, preds)
    assert np.isnan(stsb["spearman"]) and np.isnan(stsb["pearson"]) and np.isnan(stsb["score"])


def test_correlations_in_float64_and_of_one_pair():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(2, 40)).astype(np.float32)
    want = stats.pearsonr(x.astype(np.float64), y.astype(np.float64)).statistic
    assert metrics.pearson(x, y) == pytest.approx(want, abs=1e-14)
    assert stats.pearsonr(x, y).statistic != pytest.approx(want, abs=1e-14)  # float32 math
    # One pair is constant on both sides: NaN (scipy's pearsonr raises on fewer than two).
    assert np.isnan(metrics.pearson([1.0], [2.0])) and np.isnan(metrics.spearman([1.0], [2.0]))


def test_glue_metric_sets():
    labels, preds = np.array([1, 0, 1, 1]), np.array([1, 0, 0, 1])
    mrpc = metrics.glue_metrics("mrpc", labels, preds)
    assert mrpc["accuracy"] == 0.75 and mrpc["f1"] == pytest.approx(0.8)
    assert mrpc["score"] == pytest.approx((0.75 + 0.8) / 2)
    assert set(metrics.glue_metrics("cola", labels, preds)) == {"mcc", "score"}
    stsb = metrics.glue_metrics("stsb", np.array([0.0, 1.0, 2.5, 5.0]), np.array([0.1, 0.9, 3.0, 4.0]))
    assert stsb["spearman"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown GLUE task"):
        metrics.glue_metrics("squad", labels, preds)
    with pytest.raises(ValueError, match="same length"):
        metrics.accuracy([1, 2], [1])


def test_summarize_restarts():
    out = metrics.summarize_restarts([{"score": 0.5, "acc": 0.5}, {"score": 0.7, "acc": 0.7},
                                      {"score": 0.6, "acc": 0.6}])
    assert out["best_run"] == 1
    assert out["score_mean"] == pytest.approx(0.6)
    assert out["score_std"] == pytest.approx(np.std([0.5, 0.7, 0.6]))
    assert out["acc_best"] == 0.7
