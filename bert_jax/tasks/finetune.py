"""A small, single-host fine-tuning driver: task + pretrained encoder -> trained head, dev
metrics, prediction files, N restarts summarised. Meant to be folded into launch/train.py's
loop (which adds meshes, checkpoints and TensorBoard); until then this is the entry point:

    python -m bert_jax.tasks.finetune --config=configs/glue.py:mrpc \
        --config.train.init_checkpoint=/path/to/model_dir_or_hf_dir --workdir=/tmp/mrpc

Per run: AdamW (bert_jax.optim, decay masked off LayerNorm/bias), linear warmup over
`schedule.warmup_ratio` of the steps then linear decay, dropout from the model config, one
jitted train step and one jitted eval step. Evaluation visits every example (the last batch
is padded with zero-weight rows). `train.num_restarts` runs seeds seed..seed+N-1 (times each
lr of `schedule.lr_grid`, if set), keeps the best on the first dev set by the task's main
metric, and reports mean and std. Writes, in workdir:
    metrics.jsonl          one line per run ("dev/accuracy", "train/seconds", ...), then a
                           "summary" line ("dev/accuracy_mean", "_std", "_best", best_run)
    run_<i>/...            each run's prediction files, its metrics.jsonl (train/loss every
                           log_every steps, final eval) and TensorBoard events
    best_model/            the best run as a model directory (config + params + vocab)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from bert_jax import optim
from bert_jax.data.tasks_input import eval_batches, num_rows, train_batches
from bert_jax.models.config import BertConfig
from bert_jax.tasks import metrics as metrics_lib
from bert_jax.tasks.base import collect, model_inputs


# --- initial weights -------------------------------------------------------------------

def load_init_checkpoint(path: str) -> tuple[dict, BertConfig, Optional[str]]:
    """(numpy params with the encoder under "bert", config, vocab file or None) from one of
    our model directories (bert_config.json + params/) or a Hugging Face directory
    (config.json + model.safetensors / pytorch_model.bin). Google TF checkpoints: convert
    first with `python -m bert_jax.convert from-tf`."""
    from bert_jax.convert import model_dir

    if model_dir.is_model_dir(path):
        params, config = model_dir.load_model_dir(path)
        vocab = os.path.join(path, model_dir.VOCAB_NAME)
        return params, config, vocab if os.path.isfile(vocab) else None
    if os.path.isfile(os.path.join(path, "config.json")):
        from bert_jax.convert.hf_files import read_hf_dir

        params, config, _, vocab = read_hf_dir(path)
        return params, config, vocab
    raise FileNotFoundError(
        f"train.init_checkpoint={path!r} is neither a model directory (bert_config.json + "
        "params/) nor a Hugging Face directory (config.json + weights)")


def merge_encoder(fresh: dict, pretrained: dict, source: str) -> dict:
    """fresh (random init, encoder + new head) with its "bert" subtree replaced by the
    pretrained one; every tensor's path and shape must match (errors name the tensor)."""
    want = flax.traverse_util.flatten_dict(fresh["bert"])
    got = flax.traverse_util.flatten_dict(pretrained["bert"])
    missing = sorted("/".join(k) for k in want if k not in got)
    if missing:
        raise ValueError(f"{source}: encoder tensors missing: {missing[:5]} "
                         f"({len(missing)} in all)")
    for k, v in want.items():
        if tuple(got[k].shape) != tuple(v.shape):
            raise ValueError(f"{source}: bert/{'/'.join(k)} has shape {tuple(got[k].shape)}, "
                             f"the model expects {tuple(v.shape)}")
    bert = flax.traverse_util.unflatten_dict(
        {k: jnp.asarray(got[k], v.dtype) for k, v in want.items()})
    return {**fresh, "bert": bert}


# --- one run -----------------------------------------------------------------------------

def _schedule_section(config, lr: float, total_steps: int):
    s = config.schedule
    warmup = int(s.warmup_steps) if s.warmup_steps >= 0 else int(
        round(float(s.warmup_ratio) * total_steps))
    return ml_collections.ConfigDict(dict(lr=lr, warmup_steps=warmup, decay=s.decay,
                                          end_lr=float(s.end_lr)))


def _host(tree):
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def make_steps(task, model, tx):
    """(train_step, eval_step), jitted. Built once per (model, optimizer) and reused by every
    restart, so seeds after the first cost no compilation.

    train_step(params, opt_state, batch, dropout_rng, step) -> (params, opt_state, metrics)
    eval_step(params, batch) -> task.keep(outputs, batch)
    """

    def loss_fn(p, batch, step_rng):
        out = model.apply({"params": p}, *model_inputs(batch), deterministic=False,
                          rngs={"dropout": step_rng})
        return task.loss(out, batch)

    @jax.jit
    def train_step(p, o, batch, dropout_rng, step):
        step_rng = jax.random.fold_in(dropout_rng, step)
        (loss, m), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, batch, step_rng)
        updates, o = tx.update(grads, o, p)
        m = dict(m, grad_norm=optax.tree.norm(grads))
        return optax.apply_updates(p, updates), o, m

    @jax.jit
    def eval_step(p, batch):
        out = model.apply({"params": p}, *model_inputs(batch), deterministic=True)
        return task.keep(out, batch)

    return train_step, eval_step


def total_train_steps(config, n_train: int) -> int:
    if config.train.max_steps > 0:
        return int(config.train.max_steps)
    return max(1, int(math.ceil(n_train * float(config.train.num_epochs)
                                / int(config.train.batch_size))))


def train_and_evaluate(task, bert_config: BertConfig, init_params: Optional[dict],
                       train_features, eval_sets, config, seed: int, lr: float,
                       out_dir: Optional[str] = None, progress: bool = True,
                       steps_cache: Optional[dict] = None):
    """One fine-tuning run. Returns (results {eval set name: metrics}, params, train_log).
    steps_cache: a dict shared by the runs of one config (compiled steps per lr)."""
    batch_size = int(config.train.batch_size)
    n_train = num_rows(train_features)
    steps_per_epoch = max(1, n_train // batch_size)
    total_steps = total_train_steps(config, n_train)
    steps_cache = {} if steps_cache is None else steps_cache
    if lr not in steps_cache:
        model = task.model(bert_config)
        tx = optim.make_optimizer(config.optimizer, _schedule_section(config, lr, total_steps),
                                  total_steps)
        steps_cache[lr] = (model, tx) + make_steps(task, model, tx)
    model, tx, train_step, eval_step = steps_cache[lr]

    rng = jax.random.PRNGKey(seed)
    init_rng, dropout_rng = jax.random.split(rng)
    length = train_features["input_ids"].shape[1]
    dummy = jnp.zeros((1, length), jnp.int32)
    params = flax.linen.meta.unbox(model.init(init_rng, dummy, dummy, dummy)["params"])
    if init_params is not None:
        params = merge_encoder(params, init_params, str(config.train.init_checkpoint))
    opt_state = tx.init(params)

    writer = None
    if out_dir:
        from bert_jax.train.metrics import MetricWriter

        writer = MetricWriter(out_dir, tensorboard=bool(config.train.tensorboard))
    bar = None
    if progress and jax.process_index() == 0:
        from tqdm import tqdm

        bar = tqdm(total=total_steps, desc=f"fine-tune seed={seed} lr={lr:g}", leave=False)
    log, t0 = [], time.time()
    batches = train_batches(train_features, batch_size, seed,
                            num_epochs=math.ceil(total_steps / steps_per_epoch) + 1)
    for step in range(total_steps):
        batch = next(batches)
        params, opt_state, m = train_step(params, opt_state, batch, dropout_rng, step)
        if (step + 1) % int(config.train.log_every) == 0 or step + 1 == total_steps:
            m = {k: float(v) for k, v in _host(m).items()}
            if not np.isfinite(m["loss"]):
                raise FloatingPointError(f"loss is {m['loss']} at step {step + 1}")
            log.append({"step": step + 1, "loss": m["loss"], "grad_norm": m["grad_norm"]})
            if writer is not None:
                writer.write(step + 1, {"train/loss": m["loss"],
                                        "train/grad_norm": m["grad_norm"]})
            if bar is not None:
                bar.set_postfix(loss=f"{m['loss']:.4f}")
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    train_seconds = time.time() - t0

    results = {}
    eval_bs = int(config.train.eval_batch_size)
    for eval_set in eval_sets:
        kept = collect([_host(eval_step(params, b))
                        for b in eval_batches(eval_set.features, eval_bs)])
        results[eval_set.name] = task.evaluate(eval_set, kept)
        if out_dir:
            task.write_predictions(eval_set, kept, out_dir)
        if writer is not None and results[eval_set.name]:
            writer.write(total_steps, {f"{eval_set.name}/{k}": v
                                       for k, v in results[eval_set.name].items()})
    results["train"] = {"seconds": train_seconds, "steps": total_steps,
                        "final_loss": log[-1]["loss"] if log else float("nan")}
    if writer is not None:
        writer.close()
    return results, params, log


# --- restarts, summary -------------------------------------------------------------------

def run(config, workdir: str, progress: bool = True) -> dict:
    """Every run of the config (restarts x lr grid); returns the summary dict."""
    from bert_jax.data.tokenization import load_tokenizer
    from bert_jax.tasks.registry import task_from_config

    os.makedirs(workdir, exist_ok=True)
    init_params, bert_config, vocab = None, None, None
    if config.train.init_checkpoint:
        init_params, bert_config, vocab = load_init_checkpoint(config.train.init_checkpoint)
        if config.train.random_init:  # the control run: same architecture, no weights
            init_params = None
    else:
        from bert_jax.models.config import from_config_dict

        bert_config = from_config_dict(config.model)
    overrides = {k: v for k, v in config.model_overrides.to_dict().items()}
    bert_config = bert_config.replace(**overrides, scan_layers=False)
    vocab = config.tokenizer.vocab_file or vocab
    if not vocab:
        raise ValueError("no vocabulary: set tokenizer.vocab_file (the checkpoint has none)")
    tokenizer = load_tokenizer(vocab_file=vocab, do_lower_case=config.tokenizer.do_lower_case)
    task = task_from_config(config, vocab_file=vocab)
    train_features = task.train_features(tokenizer)
    eval_sets = task.eval_sets(tokenizer)
    logging.info("%d training features; eval sets %s", num_rows(train_features),
                 {e.name: num_rows(e.features) for e in eval_sets})

    lrs = list(config.schedule.lr_grid) or [float(config.schedule.lr)]
    labeled = [e.name for e in eval_sets if e.labeled]
    if not labeled:
        raise ValueError("no labelled eval set to pick the best run on (dev data missing?)")
    main_set = labeled[0]
    runs, steps_cache = [], {}
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    with open(metrics_path, "a", encoding="utf-8") as mf:
        for lr in lrs:
            for r in range(int(config.train.num_restarts)):
                i = len(runs)
                seed = int(config.train.seed) + r
                results, params, log = train_and_evaluate(
                    task, bert_config, init_params, train_features, eval_sets, config, seed,
                    float(lr), os.path.join(workdir, f"run_{i}"), progress, steps_cache)
                runs.append({"run": i, "seed": seed, "lr": float(lr), "results": results})
                record = {"run": i, "seed": seed, "lr": float(lr)}
                record.update({f"{name}/{k}": v for name, m in results.items()
                               for k, v in m.items()})
                mf.write(json.dumps(record) + "\n")
                mf.flush()
                key = task.main_metric
                score = results[main_set].get(key, float("nan"))
                best_so_far = i == 0 or score > max(x["results"][main_set][key] for x in runs[:-1])
                if best_so_far and config.train.save_best_model:
                    _save_best(workdir, params, bert_config, vocab)
                logging.info("run %d (seed %d, lr %g): %s %s", i, seed, lr, main_set,
                             results[main_set])
        summary = metrics_lib.summarize_restarts(
            [x["results"][main_set] for x in runs], key=task.main_metric)
        summary = {"summary": True, "selected_on": main_set, "runs": len(runs),
                   "best_seed": runs[summary["best_run"]]["seed"],
                   "best_lr": runs[summary["best_run"]]["lr"],
                   **{k if k == "best_run" else f"{main_set}/{k}": v
                      for k, v in summary.items()}}
        for other in labeled[1:]:  # e.g. MNLI mismatched: its mean / std / value at best
            extra = metrics_lib.summarize_restarts([x["results"][other] for x in runs],
                                                   key=task.main_metric)
            best = summary["best_run"]
            summary.update({f"{other}/{k}": v for k, v in extra.items()
                            if k.endswith(("_mean", "_std"))})
            summary.update({f"{other}/{k}_best": float(v)
                            for k, v in runs[best]["results"][other].items()})
        mf.write(json.dumps(summary) + "\n")
    for name in labeled:
        print(results_table(runs, name, task.main_metric, best=summary["best_run"]))
    return summary


def _save_best(workdir, params, bert_config, vocab):
    from bert_jax.convert.model_dir import save_model_dir

    # Written beside the previous best and swapped in, so a crash never loses both.
    path = os.path.join(workdir, "best_model")
    shutil.rmtree(path + ".new", ignore_errors=True)
    save_model_dir(path + ".new", _host(params), bert_config, vocab)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(path + ".new", path)


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


def main(argv: Any) -> None:
    from absl import app, flags

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:  # orbax logs every save at INFO
        logging.set_verbosity(logging.WARNING)
    config = flags.FLAGS.config
    run(config, flags.FLAGS.workdir)


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "fine-tuning config file", lock_config=True)
    flags.DEFINE_string("workdir", None, "output directory")
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(main)
