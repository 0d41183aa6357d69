"""Fine-tuning configs: the shared sections (the paper's recipe) and config -> task object.

configs/glue.py, configs/squad.py, configs/ner.py and configs/swag.py start from
`base_config()` and fill `config.task`. Sections:

    task        kind: glue | squad | ner | choice, plus that task's fields (see the configs)
    train       init_checkpoint (model dir, HF dir, pre-training workdir, or its
                checkpoints/<step>), random_init (control run: same architecture, fresh
                weights), do_train (False: only evaluate / predict with the fine-tuned
                model of init_checkpoint, its task head included; see tasks/predict.py),
                batch_size 32, accum_steps (gradient accumulation: batch_size stays the
                batch of one update, split into accum_steps micro-batches scanned in the
                step), eval_batch_size, num_epochs 3, max_steps (-1: from epochs),
                num_restarts, seed, log_every, save_best_model (workdir/best_model as a model
                directory), tensorboard (per-run events)
    optimizer   bert_jax.optim: adamw, b1 0.9, b2 0.999, eps 1e-6, weight_decay 0.01,
                clip_norm 1.0, layer_decay 1.0 (< 1: layer-wise learning-rate decay)
    schedule    lr (peak), lr_grid (optional sweep, e.g. (5e-5, 3e-5, 2e-5)), warmup_ratio 0.1
                (or warmup_steps >= 0), linear decay to end_lr 0
    model_overrides  BertConfig fields changed on top of the checkpoint's config: dropout
                0.1 (both), and dtype, param_dtype, remat, scan_layers, dropout_rng,
                attention, fused_qkv (None: the checkpoint's); also applied over `model`
                without a checkpoint
    tokenizer   vocab_file (default: the checkpoint's vocab.txt), do_lower_case
    model       the architecture when init_checkpoint is empty (random init from scratch)
    mesh        data, fsdp, tensor (one may be -1: the rest of the devices), rules: as
                pre-training (bert_jax/train/config.py); the batch is split over data x fsdp
    checkpoint  every (steps; 0: at the end only), keep, async_save, delete_finished (drop
                run_<i>/checkpoints once the run's results are recorded; best_model/ keeps
                the best weights)
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from bert_jax.models.config import ConfigError, model_config
from bert_jax.train.config import checkpoint_config, mesh_config, optimizer_config


def base_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.task = ml_collections.ConfigDict()
    c.train = ml_collections.ConfigDict(dict(
        init_checkpoint="", random_init=False, do_train=True, batch_size=32, accum_steps=1,
        eval_batch_size=64, num_epochs=3.0, max_steps=-1, num_restarts=1, seed=0,
        log_every=10, save_best_model=True, tensorboard=True))
    c.optimizer = optimizer_config()
    c.schedule = ml_collections.ConfigDict(dict(
        lr=2e-5, lr_grid=(), warmup_ratio=0.1, warmup_steps=-1, decay="linear", end_lr=0.0))
    # Run-time options on top of the checkpoint's config; a placeholder left at None keeps
    # the checkpoint's value (keys exist so that --config.model_overrides.<key> parses).
    c.model_overrides = ml_collections.ConfigDict(dict(
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        dtype=placeholder(str), param_dtype=placeholder(str), remat=placeholder(str),
        scan_layers=placeholder(bool), dropout_rng=placeholder(str),
        attention=placeholder(str), fused_qkv=placeholder(bool)))
    c.tokenizer = ml_collections.ConfigDict(dict(vocab_file="", do_lower_case=True))
    # Used only without init_checkpoint (training from scratch): BERT-Base by default.
    c.model = model_config()
    c.mesh = mesh_config()
    c.checkpoint = checkpoint_config(every=1000, keep=1)
    c.checkpoint.delete_finished = True
    return c


def task_from_config(config, vocab_file: str = ""):
    t = config.task
    common = dict(tfds_data_dir=t.tfds_data_dir or None, cache_dir=t.cache_dir,
                  vocab_file=vocab_file)
    if t.kind == "glue":
        from bert_jax.tasks.glue import GlueTask

        return GlueTask(t.name, data_dir=t.data_dir, max_seq_length=t.max_seq_length,
                        labels=tuple(t.labels) or None, regression=t.regression,
                        single_sentence=t.single_sentence, eval_test=t.eval_test,
                        dev_split=t.dev_split, **common)
    if t.kind == "squad":
        from bert_jax.tasks.squad import SquadTask

        return SquadTask(t.version, t.train_file, t.predict_file, t.max_seq_length,
                         t.doc_stride, t.max_query_length, t.n_best_size, t.max_answer_length,
                         t.null_score_diff_threshold, **common)
    if t.kind == "ner":
        from bert_jax.tasks.ner import NerTask

        return NerTask(t.train_file, t.dev_file, t.test_file, tuple(t.labels) or None,
                       t.max_seq_length, t.strict, **common)
    if t.kind == "choice":
        from bert_jax.tasks.choice import ChoiceTask

        return ChoiceTask(t.name, t.train_file, t.dev_file, t.test_file, t.max_seq_length,
                          **common)
    raise ConfigError(f"config.task.kind={t.kind!r}; expected glue, squad, ner or choice")
