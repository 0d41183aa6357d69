"""notebooks/*.ipynb run top to bottom on CPU in a real Jupyter kernel (nbclient), with the
parameters cell's values replaced by small ones (as papermill would), and leave what they
promise: a pre-training run with a falling loss and checkpoints, a model directory and a
Hugging Face export that transformers agrees with, and a fine-tuned best_model/. They are
committed with the outputs of a CPU run (notebooks/refresh_outputs.py), and the Colab one finds
or clones the code by itself."""

from __future__ import annotations

import ast
import configparser
import importlib.util
import json
import os
import subprocess
import sys

import nbclient
import nbformat
import pytest

from tests.conftest import REPO

DATA = REPO / "tests" / "tasks" / "data"


def _run(name: str, parameters: dict, tmp_path) -> list[str]:
    """Executes notebooks/<name> with `parameters` injected after its "parameters" cell;
    returns every code cell's text output (stdout, stderr and results), in order."""
    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    at = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(at) == 1, f"{name}: expected one cell tagged 'parameters'"
    injected = nbformat.v4.new_code_cell(
        "\n".join(f"{k} = {v!r}" for k, v in parameters.items()))
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at[0] + 1, injected)
    client = nbclient.NotebookClient(
        nb, timeout=900, kernel_name="python3",
        resources={"metadata": {"path": str(REPO / "notebooks")}})
    try:
        client.execute()
    finally:
        nbformat.write(nb, str(tmp_path / f"executed_{name}"))  # for reading a failure
    outputs = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            text = []
            for out in cell.get("outputs", []):
                text.append(out.get("text", "") or "".join(out.get("data", {}).get(
                    "text/plain", "")))
            outputs.append("".join(text))
    return outputs


@pytest.mark.slow
def test_colab_notebook(tmp_path):
    work = tmp_path / "runs"
    outputs = _run("bert_jax_colab.ipynb", dict(
        WORKDIR=str(work), PRETRAIN_STEPS=60,
        PRETRAIN_OVERRIDES={"train.log_every": 10, "checkpoint.every": 30},
        FINETUNE_TASK="tsv", FINETUNE_DATA_DIR=str(DATA / "pairs"), FINETUNE_EPOCHS=1.0,
        FINETUNE_OVERRIDES={"task.max_seq_length": 48}), tmp_path)
    text = "\n".join(outputs)

    with open(work / "pretrain" / "metrics.jsonl") as f:
        losses = [row["train/loss"] for row in map(json.loads, f) if "train/loss" in row]
    assert len(losses) == 6 and losses[-1] < losses[0] - 1.0, losses
    assert sorted(p.name for p in (work / "pretrain" / "checkpoints").iterdir()) == ["30", "60"]
    assert "held-out MLM accuracy" in text
    assert (work / "model" / "vocab.txt").read_bytes() == (
        REPO / "data_prep" / "bert_uncased_vocab.txt").read_bytes()
    assert (work / "hf" / "model.safetensors").is_file()
    if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
        assert "OK: largest difference" in text, text[-3000:]
    assert "'to be, or not to [MASK]: that is the question.': [" in text
    assert (work / "finetune_tsv" / "best_model" / "bert_config.json").is_file()
    assert "dev/accuracy" in text, text[-3000:]
    if importlib.util.find_spec("matplotlib"):  # the loss curve
        executed = nbformat.read(tmp_path / "executed_bert_jax_colab.ipynb", as_version=4)
        assert any("image/png" in out.get("data", {})
                   for cell in executed.cells if cell.cell_type == "code"
                   for out in cell.outputs)


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("*.ipynb")),
                         ids=lambda p: p.name)
def test_notebooks_are_valid_and_saved_with_clean_outputs(path):
    """One parameters cell, every code cell plain Python; saved run top to bottom with outputs
    (every cell but the parameters one shows some, none an error), without progress-bar
    redraws or timing metadata, and small."""
    assert path.stat().st_size < 300_000
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    for i, cell in enumerate(code):
        compile(cell.source, f"{path.name} code cell {i}", "exec")
        assert "execution" not in cell.metadata, f"cell {i} keeps timing metadata"
        if "parameters" in cell.metadata.get("tags", []):
            continue
        assert cell.outputs, f"cell {i} has no saved output"
        for out in cell.outputs:
            assert out.output_type != "error", f"cell {i} saved an error"
            text = out.get("text", "")
            assert "\r" not in text and max(map(len, text.split("\n"))) < 2000, (
                f"cell {i} keeps progress-bar redraws")


def _colab():
    return nbformat.read(REPO / "notebooks" / "bert_jax_colab.ipynb", as_version=4)


def test_colab_notebook_shows_its_results():
    """The saved outputs show what the notebook is for, and its first cell says where they
    came from."""
    nb = _colab()
    assert "outputs saved below come from a CPU run" in nb.cells[0].source
    text, images = [], 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text.append(out.get("text", "") or out.get("data", {}).get("text/plain", ""))
            images += "image/png" in out.get("data", {})
    text = "\n".join(text)
    for shown in ("held-out MLM accuracy", "OK: largest difference",
                  "'to be, or not to [MASK]: that is the question.': [", "dev/accuracy"):
        assert shown in text, shown
    assert images == 1  # the loss curve
    losses = [float(line.split()[3]) for line in text.splitlines()
              if line.startswith("step ") and " loss " in line]
    assert len(losses) >= 5 and losses[-1] < losses[0] - 1.0, losses


def _parameter(name):
    cell = next(c for c in _colab().cells if "parameters" in c.metadata.get("tags", []))
    for node in ast.parse(cell.source).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} is not set in the parameters cell")


def test_colab_clones_the_repository_named_in_setup_cfg():
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    assert _parameter("BERT_JAX_GIT") == setup["metadata"]["url"]
    assert setup["metadata"]["url"].startswith("https://")


def _run_setup_cell(monkeypatch, cwd, git):
    """Runs the Colab notebook's setup cell in this process from `cwd`, with subprocess.run
    recorded (a `git clone` makes the folder) and bert_jax not importable; returns the
    commands and the REPO it settled on."""
    if os.path.isdir("/content"):  # CLONE_DIR would be /content/bert_jax
        pytest.skip("in Colab")
    source = next(c.source for c in _colab().cells if "def find_checkout" in c.source)
    commands = []

    def run(command, check):
        commands.append(command)
        if command[:2] == ["git", "clone"]:
            (cwd.parent / "home" / "bert_jax").mkdir(parents=True)

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "bert_jax" else find_spec(name, *a))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("HOME", str(cwd.parent / "home"))
    monkeypatch.chdir(cwd)
    namespace = {"BERT_JAX_GIT": git}
    exec(compile(source, "setup cell", "exec"), namespace)
    return commands, namespace["REPO"]


def test_colab_setup_clones_and_installs_when_no_checkout_is_at_hand(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    url = _parameter("BERT_JAX_GIT")
    commands, repo = _run_setup_cell(monkeypatch, tmp_path / "elsewhere", url)
    clone = str(tmp_path / "home" / "bert_jax")
    assert repo == clone
    assert commands[0] == ["git", "clone", "--depth=1", url, clone]
    assert commands[1][:6] == [sys.executable, "-m", "pip", "install", "-q", "-e"]
    assert commands[1][6] == clone and len(commands) == 2


def test_colab_setup_finds_the_checkout_it_sits_in(tmp_path, monkeypatch):
    commands, repo = _run_setup_cell(monkeypatch, REPO / "notebooks", "")
    assert repo == str(REPO)
    assert [c[:4] for c in commands] == [[sys.executable, "-m", "pip", "install"]]


def test_colab_setup_without_a_checkout_or_url_says_what_to_set(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(RuntimeError, match="BERT_JAX_GIT"):
        _run_setup_cell(monkeypatch, tmp_path / "elsewhere", "")
