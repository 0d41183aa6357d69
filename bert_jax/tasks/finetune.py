"""The fine-tuning driver: a thin sweep over the one training loop (bert_jax.train.loop).
`launch/train.py` calls `run` for configs with a task section:

    python launch/train.py --config=configs/glue.py:mrpc --workdir=/tmp/mrpc \
        --config.train.init_checkpoint=<model dir | HF dir | pre-training workdir> \
        --config.task.data_dir=glue_data/MRPC

Each run is `loop.train` in WORKDIR/run_<i> (checkpoints, resume, SIGTERM, the gates,
profiling and MFU as pre-training). `sweep.restarts` seeds times each of `sweep.lrs` run in
order; runs of one rate share their compiled step. The best on the first dev set by the
task's main metric is kept in WORKDIR/best_model (a model directory), and WORKDIR/metrics.jsonl
gets one line per finished run, then a summary line (mean, std, best run). The same command
again reads the finished runs back and resumes the interrupted one; SIGTERM saves it and
returns {"preempted": True, ...}. `train.do_train=False` evaluates and predicts with a
fine-tuned model instead: bert_jax/tasks/predict.py, which starts from the same `setup`.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import jax
import numpy as np
from absl import logging
from etils import epath

from bert_jax import paths
from bert_jax.convert import model_dir
from bert_jax.convert.model_dir import save_model_dir
from bert_jax.models.config import ConfigError
from bert_jax.tasks import metrics as metrics_lib
from bert_jax.tasks.inputs import num_rows
from bert_jax.tasks.registry import task_from_config
from bert_jax.tokenization import load_tokenizer
from bert_jax.train import loop
from bert_jax.train.checked import Checked, check


# --- restarts, summary -------------------------------------------------------------------

def finished_runs(workdir: str, plan: list[tuple[float, int]]) -> list[dict]:
    """Runs of `plan` ((lr, seed) per run) already recorded in WORKDIR/metrics.jsonl, in
    order, as {"run", "seed", "lr", "results": {eval set: {metric: value}}}. A record that
    does not match the plan (another sweep in this workdir) is an error."""
    path = paths.join(workdir, "metrics.jsonl")
    if not paths.is_file(path):
        return []
    done = []
    with paths.open_text(path) as f:
        for n, line in enumerate(f, 1):
            record = json.loads(line) if line.strip() else {}
            if "run" not in record or record.get("summary"):
                continue
            i = int(record["run"])
            if i != len(done) or i >= len(plan) or (
                    float(record["lr"]), int(record["seed"])) != (float(plan[i][0]), plan[i][1]):
                raise ConfigError(
                    f"{path}: line {n}: run {i} (lr {record['lr']}, seed {record['seed']}) is "
                    f"not run {len(done)} of this config's sweep {plan}; use a new workdir")
            results: dict = {}
            for key, value in record.items():
                if "/" in key:
                    name, metric = key.split("/", 1)
                    results.setdefault(name, {})[metric] = value
            done.append({"run": i, "seed": record["seed"], "lr": record["lr"],
                         "results": results})
    return done


def setup(config, workdir: str) -> tuple[str, Checked, Any]:
    """What fine-tuning and predicting (bert_jax.tasks.predict) start from: (WORKDIR made
    absolute and checked, check(config) with its RunModel, the tokenizer). Each then builds
    config's task (`task_from_config`) and makes WORKDIR."""
    workdir = paths.resolve(workdir)  # a local path made absolute, or gs://... as it is
    paths.check_dir(workdir)
    # Keys, model, optimizer, mesh and batch sizes, once for every run: before any data is
    # read.
    checked = check(config)
    tokenizer = load_tokenizer(vocab_file=checked.model.vocab,
                               do_lower_case=config.tokenizer.do_lower_case)
    return workdir, checked, tokenizer


def run(config, workdir: str, progress: bool = True, after_step=None) -> dict:
    """Every run of the config (restarts x learning rates), resuming what a previous call
    left; returns the summary dict ({"preempted": True, ...} if SIGTERM stopped a run)."""
    if not config.train.do_train:
        raise ConfigError("train.do_train=False predicts with a fine-tuned model: "
                          "bert_jax.tasks.predict.run (launch/train.py picks it)")
    workdir, checked, tokenizer = setup(config, workdir)
    task = task_from_config(config, vocab_file=checked.model.vocab)
    paths.makedirs(workdir)  # once the checkpoint, vocabulary and task are known to be there
    train_features = task.train_features(tokenizer)
    eval_sets = task.eval_sets(tokenizer)
    logging.info("%d training features; eval sets %s", num_rows(train_features),
                 {e.name: num_rows(e.features) for e in eval_sets})
    labeled = [e.name for e in eval_sets if e.labeled]
    if not labeled:
        raise ConfigError("no labelled eval set to pick the best run on (dev data missing?)")
    task.prepare(config, checked.model.config, train_features, eval_sets,
                 checked.model.source)
    return _sweep(config, checked, workdir, task, labeled, checked.model.vocab, progress,
                  after_step)


def plan_of(config) -> list[tuple[float, int]]:
    """(learning rate, seed) of each run of the sweep, in order."""
    lrs = [float(x) for x in (list(config.sweep.lrs) or [config.schedule.lr])]
    return [(lr, int(config.train.seed) + r) for lr in lrs
            for r in range(int(config.sweep.restarts))]


def run_config(config, lr: float, seed: int):
    """The config of one run of the sweep: `config` with this run's rate and seed."""
    c = config.copy_and_resolve_references()
    c.schedule.lr, c.train.seed = float(lr), int(seed)
    return c


def _sweep(config, checked, workdir, task, labeled, vocab, progress, after_step) -> dict:
    is_main = jax.process_index() == 0
    plan = plan_of(config)
    heads = task_record(config, task)  # best_model/task.json, and each run's
    runs = finished_runs(workdir, plan)
    if runs and is_main:
        print(f"{workdir}: {len(runs)} of {len(plan)} runs already done", flush=True)
    programs: dict = {}   # learning rate -> the loop's compiled programs, shared by restarts
    metrics_path = paths.join(workdir, "metrics.jsonl")
    main_set, kind = labeled[0], task.title
    for i in range(len(runs), len(plan)):
        lr, seed = plan[i]
        run_dir = paths.join(workdir, f"run_{i}")
        task.title = f"{kind} run {i} (seed {seed}, lr {lr:g})"
        if jax.process_index() == 0:  # what the run's heads are, for the exporters
            paths.makedirs(run_dir)
            model_dir.write_task(run_dir, heads)
        outcome = loop.train(run_config(config, lr, seed), run_dir, task, checked=checked,
                             programs=programs.get(lr), progress=progress,
                             after_step=after_step)
        programs[lr] = outcome.programs
        if outcome.preempted:
            return {"preempted": True, "runs_done": len(runs), "runs": len(plan)}
        results = run_results(outcome.summary, task.eval_data)
        runs.append({"run": i, "seed": seed, "lr": lr, "results": results})
        key = task.main_metric
        score = results[main_set].get(key, float("nan"))
        best_so_far = all(score > x["results"][main_set].get(key, float("nan"))
                          for x in runs[:-1])
        if best_so_far and config.sweep.save_best_model:
            _save_best(workdir, outcome.params, task.model_config, vocab, heads)
        if is_main:
            record = {"run": i, "seed": seed, "lr": lr}
            record.update({f"{name}/{k}": v for name, m in results.items()
                           for k, v in m.items()})
            _append_line(metrics_path, record)
            if config.sweep.delete_finished and jax.process_count() == 1:
                paths.rmtree(paths.join(run_dir, "checkpoints"))
        logging.info("run %d (seed %d, lr %g): %s %s", i, seed, lr, main_set,
                     results[main_set])
    task.title = kind
    summary = summarize(runs, labeled, task.main_metric)
    if is_main:
        if summary != _last_record(metrics_path):  # not again when nothing was left to do
            _append_line(metrics_path, summary)
        for name in labeled:
            print(results_table(runs, name, task.main_metric, best=summary["best_run"]))
    return summary


def run_results(summary: dict, eval_sets) -> dict:
    """A run's {eval set: metrics} from the loop's summary, plus "train": seconds, steps
    and the last logged loss."""
    results = {e.name: {k.split("/", 1)[1]: v for k, v in summary.items()
                        if k.startswith(f"{e.name}/")} for e in eval_sets}
    results["train"] = {"seconds": summary["train_seconds"], "steps": summary["step"],
                        "final_loss": summary.get("train/loss", float("nan"))}
    return results


def _append_line(path: str, record: dict) -> None:
    # epath: a local file, or gfile's append on gs:// (the file is uploaded again on close).
    with epath.Path(path).open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _last_record(path: str) -> Optional[dict]:
    with paths.open_text(path) as f:
        lines = [line for line in f if line.strip()]
    return json.loads(lines[-1]) if lines else None


def summarize(runs: list[dict], labeled: list[str], key: str) -> dict:
    """The summary line: mean / std / best of the main metric over runs on the first labelled
    set (best_run, best_seed, best_lr), and the other labelled sets' mean / std / values at
    the best run."""
    main_set = labeled[0]
    s = metrics_lib.summarize_restarts([x["results"][main_set] for x in runs], key=key)
    best = s["best_run"]
    summary = {"summary": True, "selected_on": main_set, "runs": len(runs),
               "best_seed": runs[best]["seed"], "best_lr": runs[best]["lr"],
               **{k if k == "best_run" else f"{main_set}/{k}": v for k, v in s.items()}}
    for other in labeled[1:]:  # e.g. MNLI mismatched: its mean / std / value at best
        extra = metrics_lib.summarize_restarts([x["results"][other] for x in runs], key=key)
        summary.update({f"{other}/{k}": v for k, v in extra.items()
                        if k.endswith(("_mean", "_std"))})
        summary.update({f"{other}/{k}_best": float(v)
                        for k, v in runs[best]["results"][other].items()})
    return summary


def task_record(config, task) -> dict:
    """What best_model/task.json records (model_dir.task_record): the task kind, the class
    names in the order of the head's outputs (sentence and token classifiers; None for a
    regression) and the tokenizer's casing, so that an export needs no flags. `task`:
    config's task object."""
    kind = str(config.task.kind)
    labels = getattr(task, "labels", None) if kind in ("glue", "ner") else None
    return model_dir.task_record(kind, labels, bool(config.tokenizer.do_lower_case),
                                 name=str(config.task.get("name", "") or ""))


def _save_best(workdir, params, bert_config, vocab, task: Optional[dict] = None) -> None:
    """best_model/ as a model directory. Every process calls this: with several, the params
    are sharded across hosts, so each process gathers the full tree (one host copy of the
    params; fine-tuning sizes) and process 0 alone writes it, the others waiting at a
    barrier until it is in place."""
    from jax.experimental import multihost_utils

    if jax.process_count() > 1:
        host = multihost_utils.process_allgather(params, tiled=True)
    else:
        host = jax.device_get(params)
    if jax.process_index() == 0:
        # Written beside the previous best and swapped in, so a crash never loses both.
        path = paths.join(workdir, "best_model")
        paths.rmtree(path + ".new")
        save_model_dir(path + ".new", jax.tree_util.tree_map(np.asarray, host), bert_config,
                       vocab, task=task)
        paths.rmtree(path)
        paths.rename(path + ".new", path)
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices("bert_jax best_model written")


def results_table(runs, main_set: str, key: str, best: Optional[int] = None) -> str:
    """Per-run metrics on one eval set, then mean and std, and which run is best."""
    names = [k for k, v in runs[0]["results"][main_set].items() if isinstance(v, float)][:6]
    lines = [f"{'run':>3} {'seed':>5} {'lr':>8} " + " ".join(f"{n:>12}" for n in names)]
    for x in runs:
        m = x["results"][main_set]
        lines.append(f"{x['run']:>3} {x['seed']:>5} {x['lr']:>8.1e} "
                     + " ".join(f"{m[n]:>12.4f}" for n in names))
    vals = np.array([[x["results"][main_set][n] for n in names] for x in runs])
    lines.append(f"{'mean':>18} " + " ".join(f"{v:>12.4f}" for v in vals.mean(0)))
    lines.append(f"{'std':>18} " + " ".join(f"{v:>12.4f}" for v in vals.std(0)))
    if best is None:
        best = int(np.nanargmax([x["results"][main_set][key] for x in runs]))
    lines.insert(0, f"== {main_set} (best run by {key} on the first dev set: {best}) ==")
    return "\n".join(lines)
