"""A tiny fine-tuning config on the authored pair set (tests/tasks/data/pairs), shared by the
in-process tests and the 8-device subprocess worker, and a reader of per-step losses."""

from __future__ import annotations

import json
import os

from tests.tasks.conftest import DATA, VOCAB


def tiny_pairs_config(steps: int = 4, restarts: int = 1, mesh: dict | None = None,
                      cache_dir: str = ""):
    """H 32, 1 layer, 4 heads (tensor=4 divides heads and mlp), length 32, batch 16, dropout
    0.1 (the dropout masks must not depend on the mesh either), float32, constant lr; eval
    batch 48, so the last of the 200 dev pairs' batches is padded (200 = 4 x 48 + 8)."""
    from bert_jax.tasks.registry import base_config

    c = base_config()
    c.model.update(dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64))
    c.tokenizer.vocab_file = str(VOCAB)
    c.task.kind = "glue"
    c.task.update(dict(name="tsv", data_dir=str(DATA / "pairs"), tfds_data_dir="",
                       cache_dir=cache_dir, max_seq_length=32, labels=(), regression=False,
                       single_sentence=False, eval_test=False, dev_split=""))
    c.train.update(dict(batch_size=16, eval_batch_size=48, steps=steps, log_every=1,
                        tensorboard=False))
    c.sweep.update(dict(restarts=restarts, save_best_model=True, delete_finished=False))
    c.schedule.update(dict(lr=5e-3, warmup_steps=0, decay="constant"))
    c.checkpoint.update(dict(every=2, keep=5))
    if mesh:
        c.mesh.update(mesh)
    return c


def losses(run_dir, key: str = "train/loss") -> dict[int, float]:
    """step -> train/loss (or `key`) of one run's metrics.jsonl (a resumed step overwrites)."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if key in r:
                out[r["step"]] = r[key]
    return out


def prepared(config, steps: int = 2):
    """(task, checked, programs) of `config` as the fine-tuning driver hands them to the
    loop (bert_jax.tasks.finetune.run): the model from train.init_checkpoint or
    config.model, the pair data's features, the compiled step's programs over `steps`."""
    from bert_jax.tasks.registry import task_from_config
    from bert_jax.tokenization import load_tokenizer
    from bert_jax.train import loop
    from bert_jax.train.checked import check

    checked = check(config)
    task = task_from_config(config, vocab_file=str(VOCAB))
    tokenizer = load_tokenizer(vocab_file=str(VOCAB), do_lower_case=True)
    task.prepare(config, checked.model.config, task.train_features(tokenizer),
                 task.eval_sets(tokenizer), checked.model.source)
    return task, checked, loop.build(config, task, checked, steps)
