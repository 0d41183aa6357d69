"""Runs bert_jax_colab.ipynb top to bottom on this machine's CPU and saves it with its
outputs, so that a reader sees the results before running it:

    python notebooks/refresh_outputs.py      # from a checkout, with its bert_jax importable

PARAMETERS are put in after the parameters cell for the run (as papermill would) and taken
out again before saving, so the saved parameters cell keeps the Colab defaults; the
notebook's first cell points here for them (update its device, date and figures). WORKDIR
is the notebook's default outside Colab, emptied first. Progress-bar redraws are cut to their
last state and no timing metadata is kept, so that the file reads and diffs well. matplotlib,
where installed, draws the loss curve."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbclient
import nbformat

NOTEBOOK = Path(__file__).resolve().parent / "bert_jax_colab.ipynb"
WORKDIR = "/tmp/bert_jax_runs"
# A short CPU run. SST-2 would be downloaded by tensorflow-datasets; the repository's own
# small sentence-pair task needs no network (tests/tasks/data/make_task_data.py).
PARAMETERS = dict(
    WORKDIR=WORKDIR,
    PRETRAIN_STEPS=1000,
    FINETUNE_TASK="tsv",
    FINETUNE_DATA_DIR="tests/tasks/data/pairs",  # relative to the checkout, the kernel's cwd
    FINETUNE_EPOCHS=10.0,
    FINETUNE_LR=1e-3,
    FINETUNE_OVERRIDES={"task.max_seq_length": 64},
)
# TensorFlow's C++ start-up chatter from the data workers (timestamps, process ids).
NOISE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\).*"
                   r"|I\d{4} [\d:.]+ +\d+ \S+:\d+\] .*)$")


def _joined(outputs: list) -> list:
    """Joins consecutive pieces of one stream into one output."""
    kept = []
    for out in outputs:
        if (out.output_type == "stream" and kept and kept[-1].output_type == "stream"
                and kept[-1].name == out.name):
            kept[-1].text += out.text
        else:
            kept.append(out)
    return kept


def _clean_streams(outputs: list) -> list:
    """Keeps each line's last carriage-return segment (a progress bar's final state) and drops
    NOISE lines and the streams they leave empty."""
    kept = []
    for out in _joined(outputs):
        if out.output_type == "stream":
            lines = (line.rsplit("\r", 1)[-1] for line in out.text.split("\n"))
            out.text = "\n".join(line for line in lines if not NOISE.match(line))
            if not out.text.strip():
                continue
        kept.append(out)
    return _joined(kept)


def main() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    at = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(at) == 1, "expected one cell tagged 'parameters'"
    injected = nbformat.v4.new_code_cell(
        "\n".join(f"{k} = {v!r}" for k, v in PARAMETERS.items()))
    nb.cells.insert(at[0] + 1, injected)
    shutil.rmtree(WORKDIR, ignore_errors=True)
    nbclient.NotebookClient(
        nb, timeout=1800, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    nb.cells.remove(injected)
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = _clean_streams(cell.outputs)
            count += 1
            cell.execution_count = count
    nbformat.validate(nb)
    nbformat.write(nb, NOTEBOOK)
    print(f"wrote {NOTEBOOK} ({NOTEBOOK.stat().st_size // 1024} KiB)")


if __name__ == "__main__":
    main()
