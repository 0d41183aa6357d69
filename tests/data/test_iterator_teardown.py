"""The training and eval pipelines run without tf.data's autotuning model thread unless
data.autotune: destroying a tuned iterator waited out that thread's current optimization
period (doubling up to 60 s, TF 2.21), so a finished run lingered 4-60 s after its last line
(bert_jax/data/tfrecord.py). The slow test below runs `--config.data.autotune=True` against
the default; its measured times are in benchmarks/RESULTS.md ("Input pipeline choices")."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bert_jax.data import pretrain
from tests.conftest import REPO
from tests.data import fixtures


def _config(tmp_path, **overrides):
    fixtures.write_files(tmp_path, 2, 40, seq=32, preds=5)
    return pretrain.data_config(
        train_files=str(tmp_path / "*.tfrecord"), eval_files=str(tmp_path / "*.tfrecord"),
        max_seq_length=32, max_predictions_per_seq=5, shuffle_buffer=64,
        vocab_size=fixtures.VOCAB_SIZE, **overrides)


def test_pipelines_have_no_autotuning_thread_to_wait_for(tmp_path):
    cfg = _config(tmp_path)
    assert cfg.autotune is False
    train = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    evaluation = pretrain.eval_iterator(cfg, 8, process_index=0, process_count=1)
    assert train._dataset.options().autotune.enabled is False
    assert evaluation._dataset.options().autotune.enabled is False
    # ...and they still deliver: a few training batches, the whole eval set once.
    for _ in range(12):
        assert next(train)["input_ids"].shape == (8, 32)
    assert sum(int(b["example_weights"].sum()) for b in evaluation) == 80
    start = time.perf_counter()
    del train
    assert time.perf_counter() - start < 5.0


def test_data_autotune_turns_the_model_back_on(tmp_path):
    cfg = _config(tmp_path, autotune=True)
    train = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    evaluation = pretrain.eval_iterator(cfg, 8, process_index=0, process_count=1)
    assert train._dataset.options().autotune.enabled is True
    assert evaluation._dataset.options().autotune.enabled is True


@pytest.mark.slow  # one 600-step quick-start run, ~50 s on a quiet machine
def test_a_finished_run_exits_right_after_its_last_line(tmp_path):
    """On the code before data.autotune, this run's process lived on 34-38 s after its
    summary line (2 of 2 runs; the wait depends on where the model's sleep is)."""
    # This checkout's packages, whatever is installed (launch/train.py imports the installed).
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "launch/train.py", "--config=configs/bert_tiny.py",
         f"--workdir={tmp_path / 'wd'}", "--config.train.steps=600"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    last = time.monotonic()
    output = b""
    while chunk := proc.stdout.read1(1 << 16):
        output += chunk
        last = time.monotonic()
    assert proc.wait(timeout=600) == 0, output.decode(errors="replace")[-2000:]
    lingered = time.monotonic() - last
    assert b"eval MLM accuracy" in output
    assert lingered < 10.0, f"the process lived {lingered:.1f} s after its last line"
