"""notebooks/*.ipynb run top to bottom on CPU in a real Jupyter kernel (nbclient), with the
parameters cell's values replaced by small ones (as papermill would), and leave what they
promise: a pre-training run with a falling loss and checkpoints, a model directory and a
Hugging Face export that transformers agrees with, and a fine-tuned best_model/."""

from __future__ import annotations

import importlib.util
import json

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


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("*.ipynb")),
                         ids=lambda p: p.name)
def test_notebooks_are_valid_clean_and_compile(path):
    """Committed without outputs, one parameters cell, every code cell plain Python."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1
    for i, cell in enumerate(code):
        assert not cell.outputs and cell.execution_count is None, f"cell {i} has outputs"
        compile(cell.source, f"{path.name} code cell {i}", "exec")
