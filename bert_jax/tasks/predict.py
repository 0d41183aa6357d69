"""`train.do_train=False`: evaluate and predict with an already fine-tuned model, its task head
included (google-research/bert's `--do_train=false --do_predict=true`, transformers'
`--do_predict` on a fine-tuned model):

    python launch/train.py --config=configs/glue.py:mrpc --workdir=/tmp/mrpc_test \
        --config.train.do_train=False --config.train.init_checkpoint=/tmp/mrpc/best_model \
        --config.task.data_dir=glue_data/MRPC --config.task.eval_test=True

`train.init_checkpoint` is a fine-tuning run's best_model/ (or any of our model directories
holding this task's head), or a Hugging Face directory of this task's model
(BertForSequenceClassification / TokenClassification / QuestionAnswering / MultipleChoice:
labels in the order of the task's `labels`). Every tensor the task model needs, head
included, must be there with the model's shape (checked before any data is read; a
pre-training checkpoint has no task head and is refused). No training data is read.

Writes, in WORKDIR (process 0): every eval set's prediction files (as a training run's), and
one metrics.jsonl line `{"step": 0, "<set>/<metric>": ...}` for the labelled sets.
"""

from __future__ import annotations

from typing import Any, Optional

import jax

from bert_jax.models.config import ConfigError
from bert_jax.models.params import stack_layers
from bert_jax.tasks.init_checkpoint import InitSource, _flat_shapes, place_numpy


def _numpy_params(source: InitSource, scan_layers: bool, num_layers: int) -> dict:
    params = dict(source.params)
    if scan_layers and "bert" in params:
        params["bert"] = stack_layers({"bert": params["bert"]}, num_layers)["bert"]
    return params


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


def check_task_params(source: InitSource, abstract_params: Any, bert_config,
                      task_name: str) -> None:
    """Every tensor of the task model (`abstract_params`: ShapeDtypeStructs) is in `source`
    with the same shape; else a ValueError naming the head or key and both shapes."""
    require_task_checkpoint(source, task_name)
    got = _flat_shapes(_numpy_params(source, bert_config.scan_layers,
                                     bert_config.num_hidden_layers))
    want = _flat_shapes(abstract_params)
    heads = sorted({k.split("/")[0] for k in want} - {"bert"})
    for head in heads:
        if not any(k.split("/")[0] == head for k in got):
            raise ConfigError(
                f"train.init_checkpoint={source.path} has no {head!r} head (it holds "
                f"{sorted(source.params)}), which {task_name} predicts with "
                f"(train.do_train=False): pass a model fine-tuned on this task, e.g. a "
                f"fine-tuning run's best_model/")
    for key, shape in sorted(want.items()):
        if key not in got:
            raise ConfigError(f"train.init_checkpoint={source.path}: tensor {key} missing "
                             f"(the model expects shape {tuple(shape)})")
        if tuple(got[key]) != tuple(shape):
            raise ConfigError(
                f"train.init_checkpoint={source.path}: {key} has shape {tuple(got[key])} in "
                f"the checkpoint, the {task_name} model expects {tuple(shape)}"
                + (" (another number of labels?)" if key.split("/")[0] != "bert" else ""))


def predict(config, workdir: str, task, tokenizer, bert_config, source) -> dict:
    """Evaluates every eval set of `task` with `source`'s weights; returns
    {"predict": True, "<set>/<metric>": value, ...}."""
    from bert_jax.tasks.finetune_run import MeshSetup, evaluate
    from bert_jax.train import metrics as metrics_lib

    task_name = f"task.kind={config.task.kind}"
    require_task_checkpoint(source, task_name, bool(config.train.random_init))
    # The params' shapes do not depend on the sequence length: the checkpoint is checked
    # before any eval data is read or tokenised.
    setup = MeshSetup.from_config(config, task, bert_config, int(config.task.max_seq_length))
    steps = setup.steps_for(config, float(config.schedule.lr), 1)  # the eval step only
    check_task_params(source, steps.abstract.params, bert_config, task_name)
    eval_sets = task.eval_sets(tokenizer)
    if not eval_sets:
        raise ConfigError("train.do_train=False: the task has no eval set to predict")
    params = place_numpy(_numpy_params(source, bert_config.scan_layers,
                                       bert_config.num_hidden_layers),
                         steps.abstract.params, steps.shardings.params)
    writer = metrics_lib.MetricWriter(workdir, tensorboard=bool(config.train.tensorboard))
    try:
        results = evaluate(setup, steps, params, eval_sets, config, workdir, writer, 0)
    finally:
        writer.close()
    out = {"predict": True, **{f"{name}/{k}": v for name, m in results.items()
                               for k, v in m.items()}}
    if jax.process_index() == 0:
        for e in eval_sets:
            shown = ", ".join(f"{k} {v:.4f}" for k, v in results[e.name].items()
                              if isinstance(v, float))
            print(f"{e.name}: {len(e.examples)} examples predicted"
                  + (f"; {shown}" if shown else " (unlabelled)"), flush=True)
    return out
