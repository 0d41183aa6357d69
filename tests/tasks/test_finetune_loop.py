"""Fine-tuning runs on the one training loop (bert_jax.train.loop) and so gains what
pre-training has: skipping a non-finite step (and a one-line stop naming the step
without it), a profile of chosen steps, model-FLOPs utilisation and real-token figures.
(SIGTERM: test_finetune_cli.py; a damaged latest checkpoint: test_finetune_resume.py; the
input gate of several processes: test_finetune_mesh.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert_jax.errors import FaultError
from bert_jax.tasks import finetune
from bert_jax.train.loop import NonFiniteError
from tests.tasks.conftest import DATA
from tests.tasks.finetune_common import tiny_pairs_config
from tests.train.common import traced_steps


def _regression_data(tmp_path, bad_row: int):
    """The authored pairs as a regression task (score = label), with one training score
    "nan": a corrupted label that makes the loss of the batch that holds it non-finite."""
    rows = (DATA / "pairs" / "train.tsv").read_text().splitlines()
    header, body = rows[0], rows[1:33]
    body = [r if i != bad_row else "\t".join(r.split("\t")[:-1] + ["nan"])
            for i, r in enumerate(body)]
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("\n".join([header] + body) + "\n")
    (data / "dev.tsv").write_text((DATA / "pairs" / "dev.tsv").read_text())
    config = tiny_pairs_config(steps=4)   # batch 16 over 32 rows: 2 epochs
    config.task.update(dict(data_dir=str(data), regression=True))
    return config


def _log(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_skip_nonfinite_skips_the_batches_with_the_bad_label(tmp_path):
    config = _regression_data(tmp_path, bad_row=5)
    config.train.skip_nonfinite = True
    summary = finetune.run(config, str(tmp_path / "run"), progress=False)
    log = _log(tmp_path / "run" / "run_0")
    flags = [r["train/nonfinite"] for r in log if "train/nonfinite" in r]
    # The bad row is in one batch of each of the 2 epochs: 2 of the 4 steps skipped.
    assert flags.count(1.0) == 2 and flags.count(0.0) == 2, flags
    assert all(np.isfinite(r["train/loss"]) for r, f in zip(log, flags) if not f)
    assert np.isfinite(summary["dev/pearson_mean"])   # the skipped updates never landed


def test_a_nonfinite_step_stops_the_run_in_one_line_naming_it(tmp_path):
    config = _regression_data(tmp_path, bad_row=5)
    with pytest.raises(NonFiniteError) as err:
        finetune.run(config, str(tmp_path / "run"), progress=False)
    msg = str(err.value)
    step = [r["step"] for r in _log(tmp_path / "run" / "run_0")]
    assert isinstance(err.value, FaultError) and "\n" not in msg
    assert msg.startswith(f"non-finite loss or gradient at step {max(step) + 1} "), (msg, step)
    assert "--config.train.skip_nonfinite=True" in msg


def test_profile_mfu_and_real_tokens_of_a_fine_tuning_run(tmp_path, capsys):
    """train.profile_steps=2 from profile_start=1 traces steps 2 and 3 of the run; from step
    2 on the log has perf/mfu and the real-token figures of each batch: the padding fraction
    is that of the step's own rows."""
    from bert_jax.tasks.inputs import FeatureBatches
    from bert_jax.tasks.registry import task_from_config
    from bert_jax.tokenization import load_tokenizer
    from tests.tasks.conftest import VOCAB

    config = tiny_pairs_config(steps=4)
    config.train.profile_start, config.train.profile_steps = 1, 2
    finetune.run(config, str(tmp_path / "run"), progress=False)
    run = tmp_path / "run" / "run_0"
    assert traced_steps(run / "profile") == [2, 3]
    assert "profile of steps 2..3 in" in capsys.readouterr().out

    log = [r for r in _log(run) if "train/loss" in r]
    assert "perf/mfu" not in log[0] and all(0 < r["perf/mfu"] < 1 for r in log[1:])
    assert all(0 < r["perf/real_mfu"] < r["perf/mfu"] for r in log[1:])
    features = task_from_config(config, vocab_file=str(VOCAB)).train_features(
        load_tokenizer(vocab_file=str(VOCAB), do_lower_case=True))
    batches = FeatureBatches(features, 16, seed=0)
    pads = [1.0 - next(batches)["input_mask"].mean() for _ in range(4)]
    assert [r["data/padding_fraction"] for r in log] == pytest.approx(pads, rel=1e-6)
    assert all(r["data/sequences_per_row"] == 1.0 for r in log)


@pytest.mark.parametrize("key, value, message", [
    ("train.eval_steps", 3, r"config.train.eval_steps=3: fine-tuning scores every example"),
    ("train.init_state", "full", r"config.train.init_state='full': fine-tuning takes the "
                                 r"encoder's params only"),
    ("schedule.warmup_ratio", 1.5, r"config.schedule.warmup_ratio=1.5: expected 0 <= ratio "
                                   r"<= 1")])
def test_keys_a_fine_tuning_run_cannot_use_are_errors_before_any_data(key, value, message,
                                                                      tmp_path):
    """Refused before the task's files are read (task.data_dir does not exist)."""
    from bert_jax.models.config import ConfigError

    config = tiny_pairs_config()
    config.schedule.warmup_steps = -1   # the ratio decides
    config.update_from_flattened_dict({key: value})
    config.task.data_dir = str(tmp_path / "no_such_dir")
    with pytest.raises(ConfigError, match=message):
        finetune.run(config, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()


def test_no_steps_and_no_epochs_is_an_error_before_any_data(tmp_path):
    """train.steps <= 0 with no epochs: named when the config is checked, before the task's
    files are read and tokenized (task.data_dir does not exist)."""
    from bert_jax.models.config import ConfigError

    config = tiny_pairs_config()
    config.train.steps, config.train.epochs = 0, 0.0
    config.task.data_dir = str(tmp_path / "no_such_dir")
    with pytest.raises(ConfigError, match=r"config.train.steps=0 and train.epochs=0.0: set "
                                          r"train.steps > 0 or train.epochs > 0$"):
        finetune.run(config, str(tmp_path / "run"), progress=False)


def test_a_sweep_checks_its_config_once(monkeypatch, tmp_path):
    """finetune.run checks the config once (bert_jax/train/checked.py) and hands every run of
    the sweep the same Checked; the runs differ in schedule.lr and train.seed only. The loop
    here is a stand-in that records what it is given."""
    from bert_jax.train import checked as checked_lib
    from bert_jax.train import loop

    checks, runs = [], []

    def counted(config):
        checks.append(config)
        return checked_lib.check(config)

    def stand_in(config, workdir, task, *, checked=None, **kwargs):
        runs.append((float(config.schedule.lr), int(config.train.seed), checked))
        scores = {f"{e.name}/{task.main_metric}": 0.5 + 0.1 * len(runs)
                  for e in task.eval_data}
        return loop.Outcome(dict(scores, train_seconds=0.0, step=4), None, False)

    monkeypatch.setattr(finetune, "check", counted)
    monkeypatch.setattr(loop, "check", counted)
    monkeypatch.setattr(loop, "train", stand_in)
    config = tiny_pairs_config(restarts=2, cache_dir=str(tmp_path / "cache"))
    config.sweep.lrs = (5e-3, 1e-3)
    config.sweep.save_best_model = False
    summary = finetune.run(config, str(tmp_path / "run"), progress=False)
    assert len(checks) == 1 and summary["runs"] == 4 and summary["best_run"] == 3
    assert [(lr, seed) for lr, seed, _ in runs] == [(5e-3, 0), (5e-3, 1), (1e-3, 0), (1e-3, 1)]
    assert all(isinstance(c, checked_lib.Checked) and c is runs[0][2] for _, _, c in runs)
