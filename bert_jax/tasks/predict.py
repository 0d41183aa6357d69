"""`train.do_train=False`: evaluate and predict with an already fine-tuned model, its task head
included (google-research/bert's `--do_train=false --do_predict=true`):

    python launch/train.py --config=configs/glue.py:mrpc --workdir=/tmp/mrpc_test \
        --config.train.do_train=False --config.train.init_checkpoint=/tmp/mrpc/best_model \
        --config.task.data_dir=glue_data/MRPC --config.task.eval_test=True

`train.init_checkpoint`: a fine-tuning run's best_model/ (or any model directory holding this
task's head), or a Hugging Face directory of this task's model (labels in the order of the
task's `labels`). Every tensor the task model needs is checked before any data is read; a
pre-training checkpoint has no task head and is refused. No training data is read. Writes
every eval set's prediction files and one metrics.jsonl line `{"step": 0, "<set>/<metric>"}`.
"""

from __future__ import annotations

from typing import Any, Optional

import jax

from bert_jax.convert.sources import InitSource
from bert_jax.models.config import ConfigError
from bert_jax.train import loop
from bert_jax.train.checked import Checked
from bert_jax.train.warm_start import check_shapes, numpy_params, place_numpy


def require_task_checkpoint(source: Optional[InitSource], task_name: str,
                            random_init: bool = False) -> None:
    """A checkpoint that may hold a task head: not none, not a pre-training run."""
    if source is None:
        raise ConfigError(
            "train.do_train=False predicts with a fine-tuned model: set train.init_checkpoint "
            "to it (e.g. a fine-tuning run's best_model/)"
            + (", and drop train.random_init" if random_init else ""))
    if source.kind == "workdir":
        raise ConfigError(
            f"train.init_checkpoint={source.path} is a pre-training run: it has no {task_name} "
            f"head to predict with (train.do_train=False); fine-tune it first and pass that "
            f"run's best_model/")


def check_task_params(source: InitSource, abstract_params: Any, task_name: str) -> None:
    """Every tensor of the task model (`abstract_params`: ShapeDtypeStructs), head included,
    is in `source` with the same shape; else an error naming the head, or the key and both
    shapes (warm_start.check_shapes)."""
    require_task_checkpoint(source, task_name)
    for head in sorted(set(abstract_params) - {"bert"}):
        if head not in source.top_keys():
            raise ConfigError(
                f"train.init_checkpoint={source.path} has no {head!r} head (it holds "
                f"{source.top_keys()}), which {task_name} predicts with "
                f"(train.do_train=False): pass a model fine-tuned on this task, e.g. a "
                f"fine-tuning run's best_model/")
    check_shapes(source, abstract_params, list(abstract_params))


def predict(config, checked: Checked, workdir: str, task, tokenizer, bert_config,
            source) -> dict:
    """Evaluates every eval set of `task` with `source`'s weights; returns
    {"predict": True, "<set>/<metric>": value, ...}. `checked`: check(config)."""
    task_name = f"task.kind={config.task.kind}"
    require_task_checkpoint(source, task_name, bool(config.train.random_init))
    # The params' shapes do not depend on the sequence length: the checkpoint is checked
    # before any eval data is read or tokenised.
    task.prepare(config, bert_config, None, [], source)
    programs = loop.build_eval(task, checked)  # no optimizer, no train step
    check_task_params(source, programs.abstract_params, task_name)
    task.eval_data = task.eval_sets(tokenizer)
    if not task.eval_data:
        raise ConfigError("train.do_train=False: the task has no eval set to predict")
    params = place_numpy(numpy_params(source, programs.abstract_params),
                         programs.abstract_params, programs.param_shardings)
    scalars = loop.evaluate_params(config, workdir, task, params, programs, checked)
    if jax.process_index() == 0:
        for e in task.eval_data:
            shown = ", ".join(f"{k.split('/', 1)[1]} {v:.4f}" for k, v in scalars.items()
                              if k.startswith(f"{e.name}/"))
            print(f"{e.name}: {len(e.examples)} examples predicted"
                  + (f"; {shown}" if shown else " (unlabelled)"), flush=True)
    return {"predict": True, **scalars}
