"""`pip install .` (not editable) into a fresh virtual environment, then the quick start from
another working directory: what runs is the installed bert_jax and data_prep, and the sample
corpus and vocabulary come with data_prep as package data (before, they were found through
the source tree, which an installed copy does not have)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow  # a fresh venv, an install and 20 steps of BERT-Tiny: ~35 s on 2 cores
def test_installed_package_pretrains_on_its_sample_corpus_from_elsewhere(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    # No network: the dependencies are this environment's, on PYTHONPATH. Its .pth files
    # do not run from there, so an editable install of bert_jax in it stays invisible.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=os.pathsep.join(site.getsitepackages()), JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="2")
    # Built from a copy: pip builds in the source tree, and would leave build/ and *.egg-info
    # in the checkout (and pack a stale build/lib into the next wheel).
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", "__pycache__", "*.egg-info", "build", "dist", ".venv*", ".pytest_cache",
        ".hypothesis"))
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--no-input", str(src)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    installed = subprocess.run(
        [python, "-c", "import site, bert_jax, data_prep; print(site.getsitepackages()[0]); "
                       "print(bert_jax.__file__); print(data_prep.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    packages, bert_jax_file, data_prep_file = installed.stdout.split()
    assert packages.startswith(str(venv))
    assert bert_jax_file == os.path.join(packages, "bert_jax", "__init__.py")
    assert data_prep_file == os.path.join(packages, "data_prep", "__init__.py")

    workdir = tmp_path / "run"
    r = subprocess.run(
        [python, str(REPO / "launch" / "train.py"), f"--config={REPO / 'configs' / 'bert_tiny.py'}",
         f"--workdir={workdir}", "--config.train.steps=20", "--config.train.log_every=10",
         "--config.checkpoint.every=0"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"no data.train_files: building TFRecords from the sample corpus (256 train / 13 "
            f"held-out documents) into {workdir}/sample_data/len64_pred10") in r.stdout, r.stdout
    assert "done at step 20: train/loss=" in r.stdout and "eval MLM accuracy" in r.stdout
    assert os.listdir(workdir / "checkpoints") == ["20"]
    assert not os.listdir(elsewhere)
    # The run recorded its vocabulary: the installed data_prep's package data.
    from bert_jax.convert import sources

    vocab = sources.open_source(str(workdir)).vocab
    assert vocab == os.path.join(packages, "data_prep", "bert_uncased_vocab.txt")
