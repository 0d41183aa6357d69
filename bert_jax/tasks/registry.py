"""Fine-tuning configs and config -> task object.

configs/glue.py, squad.py, ner.py and swag.py start from `base_config()` (the paper's recipe:
batch 32, 3 epochs, lr 2e-5 with 10% warmup and linear decay, dropout 0.1, AdamW) and fill
`config.task`. The shared sections are bert_jax.train.config's; fine-tuning adds `task`,
`sweep` (restarts x learning rates), `model_overrides` (BertConfig fields changed on top of
the checkpoint's config; None keeps the checkpoint's), `tokenizer` (vocab_file: default the
checkpoint's vocab.txt; do_lower_case) and `model` (the architecture when init_checkpoint is
empty: random init from scratch). README.md, "One loop, one config", lists every key.
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from bert_jax.models.config import ConfigError, model_config
from bert_jax.tasks.choice import ChoiceTask
from bert_jax.tasks.glue import GlueTask
from bert_jax.tasks.ner import NerTask
from bert_jax.tasks.squad import SquadTask
from bert_jax.train.config import add_training_sections, sweep_config


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.task = ml_collections.ConfigDict()
    add_training_sections(
        c,
        train=dict(batch_size=32, eval_batch_size=64, steps=-1, epochs=3.0, log_every=10,
                   eval_every=0),
        schedule=dict(lr=2e-5, warmup_steps=-1, warmup_ratio=0.1, decay="linear",
                      end_lr=0.0),
        checkpoint=dict(every=1000, keep=1))
    c.sweep = sweep_config()
    # Run-time options on top of the checkpoint's config; a placeholder left at None keeps
    # the checkpoint's value (keys exist so that --config.model_overrides.<key> parses).
    # dtype is the run's, as in pre-training: "auto" (bfloat16 on GPU / TPU, float32 on
    # CPU) whatever the checkpoint was trained in (model directories written before auto
    # name float32). fp8 (FP8 products) is off unless asked for: a checkpoint carries none.
    c.model_overrides = ml_collections.ConfigDict(dict(
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        dtype="auto", param_dtype=placeholder(str), remat=placeholder(str),
        fp8=placeholder(bool),
        scan_layers=placeholder(bool), scan_unroll=ml_collections.FieldReference(None, field_type=object),
        dropout_rng=placeholder(str),
        attention=placeholder(str), fused_qkv=placeholder(bool),
        pallas_block_q=placeholder(int), pallas_block_k=placeholder(int),
        pallas_bwd_block_q=placeholder(int), pallas_bwd_block_k=placeholder(int),
        pallas_num_warps=placeholder(int), pallas_num_stages=placeholder(int),
        pallas_bwd_num_warps=placeholder(int), pallas_bwd_num_stages=placeholder(int),
        gelu_backward=placeholder(str), residual_norm=placeholder(str)))
    c.tokenizer = ml_collections.ConfigDict(dict(vocab_file="", do_lower_case=True))
    # Used only without init_checkpoint (training from scratch): BERT-Base by default.
    c.model = model_config()
    return c


def task_from_config(config, vocab_file: str = ""):
    t = config.task
    common = dict(tfds_data_dir=t.tfds_data_dir or None, cache_dir=t.cache_dir,
                  vocab_file=vocab_file)
    if t.kind == "glue":
        return GlueTask(t.name, data_dir=t.data_dir, max_seq_length=t.max_seq_length,
                        labels=tuple(t.labels) or None, regression=t.regression,
                        single_sentence=t.single_sentence, eval_test=t.eval_test,
                        dev_split=t.dev_split, **common)
    if t.kind == "squad":
        return SquadTask(t.version, t.train_file, t.predict_file, t.max_seq_length,
                         t.doc_stride, t.max_query_length, t.n_best_size, t.max_answer_length,
                         t.null_score_diff_threshold, **common)
    if t.kind == "ner":
        return NerTask(t.train_file, t.dev_file, t.test_file, tuple(t.labels) or None,
                       t.max_seq_length, t.strict, **common)
    if t.kind == "choice":
        return ChoiceTask(t.name, t.train_file, t.dev_file, t.test_file, t.max_seq_length,
                          **common)
    raise ConfigError(f"config.task.kind={t.kind!r}; expected glue, squad, ner or choice")
