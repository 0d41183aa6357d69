"""Multiple-choice fine-tuning (the paper, section 4.4: SWAG): `--config=configs/swag.py`.

    configs/swag.py        SWAG as distributed (github.com/rowanz/swagaf, data/):
                           --config.task.train_file=train.csv --config.task.dev_file=val.csv
                           [--config.task.test_file=test.csv: predicted, labels are hidden]
    configs/swag.py:hellaswag   HellaSwag: tfds `hellaswag`, or its hellaswag_*.jsonl files
    configs/swag.py:jsonl  your own questions, one JSON object per line: {"context": ...,
                           "endings": [...], "label": i} (optional "start", "id")

Each choice is `[CLS] context [SEP] start ending [SEP]`; one vector scores each pooled [CLS]
and a softmax over the choices is trained. Recipe (the paper): 3 epochs, lr 2e-5, batch 16.
Metric: accuracy; choice_predictions-<set>.tsv holds every choice's probability.
"""

from bert_jax.tasks.choice import CHOICE_FORMATS
from bert_jax.tasks.registry import base_config


def get_config(arg="swag"):
    name = (arg or "swag").removeprefix("task=")
    if name not in CHOICE_FORMATS:
        raise ValueError(f"configs/swag.py:{name}: unknown format; expected one of "
                         f"{list(CHOICE_FORMATS)}")
    config = base_config()
    config.task.kind = "choice"
    config.task.name = name
    config.task.train_file = ""
    config.task.dev_file = ""
    config.task.test_file = ""
    config.task.max_seq_length = 128
    config.task.tfds_data_dir = ""
    config.task.cache_dir = ""
    config.train.batch_size = 16
    config.schedule.lr = 2e-5
    return config
