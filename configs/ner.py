"""NER fine-tuning on CoNLL-2003-format column files (the paper, section 5.3):
`--config=configs/ner.py --config.task.train_file=eng.train --config.task.dev_file=eng.testa`.

First sub-token of each word carries its label (others ignored); entity-level F1 with
conlleval / seqeval semantics (IOB1 and IOB2; `task.strict=True` for seqeval's strict IOB2).
Without files: tfds conll2003.
"""

from bert_jax.tasks.registry import base_config


def get_config(arg=None):
    del arg
    config = base_config()
    config.task.kind = "ner"
    config.task.train_file = ""
    config.task.dev_file = ""
    config.task.test_file = ""
    config.task.labels = ()              # default: the CoNLL-2003 tags
    config.task.max_seq_length = 128
    config.task.strict = False
    config.task.tfds_data_dir = ""
    config.task.cache_dir = ""
    config.schedule.lr = 5e-5
    return config
