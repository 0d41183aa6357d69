"""GLUE fine-tuning (the paper, section 4.1): `--config=configs/glue.py:mrpc`.

Tasks: cola, sst2, mrpc, stsb (regression), qqp, mnli (dev/test matched + mismatched),
qnli, rte, wnli; and "tsv" for your own sentence(-pair) TSVs (sentence1, sentence2, label).
Data: `task.data_dir` = the task's directory of GLUE TSVs as distributed, else tfds glue/*.
Recipe: batch 32, 3 epochs, lr from {5e-5, 3e-5, 2e-5} (`sweep.lrs`), 10% warmup,
dropout 0.1; `sweep.restarts=5` for the small, unstable sets (the paper's fix).
"""

from bert_jax.tasks.glue import GLUE_TASKS
from bert_jax.tasks.registry import base_config


def get_config(arg="mrpc"):
    name = (arg or "mrpc").removeprefix("task=")
    if name not in GLUE_TASKS:
        raise ValueError(f"configs/glue.py:{name}: unknown task; expected one of "
                         f"{sorted(GLUE_TASKS)}")
    config = base_config()
    config.task.kind = "glue"
    config.task.name = name
    config.task.data_dir = ""
    config.task.tfds_data_dir = ""
    config.task.cache_dir = ""           # e.g. <data_dir>/cache: TFRecord feature cache
    config.task.max_seq_length = 128
    config.task.labels = ()              # "tsv": label strings, in id order (default 0, 1)
    config.task.regression = False       # "tsv": a score, not classes
    config.task.single_sentence = False  # "tsv": only sentence1
    config.task.eval_test = False        # also predict test.tsv -> GLUE submission file
    config.task.dev_split = ""           # default: dev (MNLI: dev_matched + dev_mismatched)
    return config
