"""Fine-tuning gradient accumulation: 4 micro-batches of B/4 give the update of one batch of
B, also when the micro-batches hold different numbers of real rows."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bert_jax.data.tokenization import load_tokenizer
from bert_jax.tasks.finetune import model_and_init
from bert_jax.tasks.finetune_run import MeshSetup, initial_state
from bert_jax.tasks.registry import task_from_config
from tests.tasks.conftest import VOCAB
from tests.tasks.finetune_common import tiny_pairs_config


def _setup(accum: int):
    config = tiny_pairs_config()
    config.train.accum_steps = accum
    # No dropout: the masks of a micro-batch cannot be those of the same rows in one batch.
    config.model_overrides.hidden_dropout_prob = 0.0
    config.model_overrides.attention_probs_dropout_prob = 0.0
    bert_config = model_and_init(config)[0]
    task = task_from_config(config, vocab_file=str(VOCAB))
    features = task.train_features(load_tokenizer(vocab_file=str(VOCAB), do_lower_case=True))
    setup = MeshSetup.from_config(config, task, bert_config, features["input_ids"].shape[1])
    return setup, setup.steps_for(config, 5e-3, 10), features


def _host(tree):
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def test_four_micro_batches_equal_one_batch():
    runs = {}
    for accum in (1, 4):
        setup, steps, features = _setup(accum)
        state, rng = initial_state(setup, steps, 0)
        batch = {k: v[:16] for k, v in features.items()}
        batch["example_weights"] = np.ones(16, np.float32)
        # Micro-batch 0 is rows 0, 4, 8, 12 (bert_jax.train.step.micro_batches): with three of
        # them weightless it holds one real row against four in the others, so a mean of
        # micro-batch means would weigh row 12 four times too much.
        batch["example_weights"][[0, 4, 8]] = 0.0
        batch = setup.place(batch)
        metrics = []
        for _ in range(2):
            state, m = steps.train_fn(state, batch, rng)
            metrics.append(_host(m))
        runs[accum] = (metrics, _host(state.params))
    (m1, p1), (m4, p4) = runs[1], runs[4]
    for a, b in zip(m1, m4):
        for key in ("train/loss", "train/grad_norm"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-5, err_msg=key)
    # The step moved the loss well beyond the tolerance, so the match says something.
    assert abs(m1[1]["train/loss"] - m1[0]["train/loss"]) > 1e-3
    flat1, flat4 = jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(p4)
    assert len(flat1) == len(flat4) > 10
    for a, b in zip(flat1, flat4):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_accum_steps_must_divide_the_batch():
    config = tiny_pairs_config()
    config.train.accum_steps = 3
    bert_config = model_and_init(config)[0]
    task = task_from_config(config, vocab_file=str(VOCAB))
    with pytest.raises(ValueError, match=r"config.train.batch_size=16 is not divisible by "
                                         r"config.train.accum_steps=3"):
        MeshSetup.from_config(config, task, bert_config, 32)
    config.train.accum_steps = 0
    with pytest.raises(ValueError, match=r"config.train.accum_steps=0: expected a positive"):
        MeshSetup.from_config(config, task, bert_config, 32)
