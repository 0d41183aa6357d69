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
`launch/train.py` runs it for a fine-tuning config with train.do_train=False.
"""

from __future__ import annotations

import jax

from bert_jax import paths
from bert_jax.models.config import ConfigError
from bert_jax.tasks.finetune import setup
from bert_jax.tasks.registry import task_from_config
from bert_jax.train import loop
from bert_jax.train.warm_start import task_params


def run(config, workdir: str) -> dict:
    """Evaluates every eval set of config's task with train.init_checkpoint's weights, head
    included; returns {"predict": True, "<set>/<metric>": value, ...}. The checkpoint
    (check(config): a fine-tuned one) and its tensors (warm_start.task_params) are checked
    before any eval data is read."""
    workdir, checked, tokenizer = setup(config, workdir)
    task = task_from_config(config, vocab_file=checked.model.vocab)
    paths.makedirs(workdir)  # once the checkpoint, vocabulary and task are known to be there
    model = checked.model
    # The params' shapes do not depend on the sequence length: the checkpoint is checked
    # before any eval data is read or tokenised.
    task.prepare(config, model.config, None, [], model.source)
    programs = loop.build_eval(task, checked)  # no optimizer, no train step
    params = task_params(model.source, programs.abstract_params, programs.param_shardings,
                         f"task.kind={config.task.kind}")
    task.eval_data = task.eval_sets(tokenizer)
    if not task.eval_data:
        raise ConfigError("train.do_train=False: the task has no eval set to predict")
    scalars = loop.evaluate_params(config, workdir, task, params, programs, checked)
    if jax.process_index() == 0:
        for e in task.eval_data:
            shown = ", ".join(f"{k.split('/', 1)[1]} {v:.4f}" for k, v in scalars.items()
                              if k.startswith(f"{e.name}/"))
            print(f"{e.name}: {len(e.examples)} examples predicted"
                  + (f"; {shown}" if shown else " (unlabelled)"), flush=True)
    return {"predict": True, **scalars}
