"""SQuAD fine-tuning (the paper, sections 4.2-4.3): `--config=configs/squad.py:1.1` or `:2.0`.

Data: task.train_file / task.predict_file (SQuAD JSON), else tfds squad/v1.1|v2.0.
Recipe: batch 32, 2 epochs (v1.1: 3e-5 lr as the original run_squad), max_seq_length 384,
doc_stride 128, max_query_length 64, n_best 20, max_answer_length 30; v2 predicts no answer
when null score - best span score > null_score_diff_threshold.
"""

from bert_jax.tasks.registry import base_config


def get_config(arg="1.1"):
    version = (arg or "1.1").removeprefix("version=").removeprefix("v")
    if version not in ("1.1", "2.0"):
        raise ValueError(f"configs/squad.py:{arg}: expected version 1.1 or 2.0")
    config = base_config()
    config.task.kind = "squad"
    config.task.version = version
    config.task.train_file = ""
    config.task.predict_file = ""
    config.task.tfds_data_dir = ""
    config.task.cache_dir = ""
    config.task.max_seq_length = 384
    config.task.doc_stride = 128
    config.task.max_query_length = 64
    config.task.n_best_size = 20
    config.task.max_answer_length = 30
    config.task.null_score_diff_threshold = 0.0
    config.train.epochs = 2.0
    config.schedule.lr = 3e-5 if version == "1.1" else 5e-5
    config.train.eval_batch_size = 32
    return config
