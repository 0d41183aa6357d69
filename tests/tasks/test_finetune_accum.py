"""Fine-tuning gradient accumulation: 4 micro-batches of B/4 give the update of one batch of
B, also when the micro-batches hold different numbers of real rows."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from bert_jax.data import device as data_device
from bert_jax.train import loop
from bert_jax.train.checked import check
from tests.tasks.finetune_common import prepared, tiny_pairs_config


def _setup(accum: int):
    config = tiny_pairs_config()
    config.train.accum_steps = accum
    config.schedule.lr = 5e-3
    # No dropout: the masks of a micro-batch cannot be those of the same rows in one batch.
    config.model_overrides.hidden_dropout_prob = 0.0
    config.model_overrides.attention_probs_dropout_prob = 0.0
    task, checked, programs = prepared(config, steps=10)
    return config, task, checked, programs


def _host(tree):
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def test_four_micro_batches_equal_one_batch():
    runs = {}
    for accum in (1, 4):
        config, task, checked, programs = _setup(accum)
        state, rng = loop.fresh_state(config, task, programs, checked)
        batch = {k: v[:16] for k, v in task.train_features.items()}
        batch["example_weights"] = np.ones(16, np.float32)
        # Micro-batch 0 is rows 0, 4, 8, 12 (bert_jax.train.step.micro_batches): with three of
        # them weightless it holds one real row against four in the others, so a mean of
        # micro-batch means would weigh row 12 four times too much.
        batch["example_weights"][[0, 4, 8]] = 0.0
        batch = data_device.to_global(batch, checked.batch_sharding)
        metrics = []
        for _ in range(2):
            state, m = programs.train_fn(state, batch, rng)
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
    with pytest.raises(ValueError, match=r"config.train.batch_size=16 is not divisible by "
                                         r"config.train.accum_steps=3"):
        check(config)
    config.train.accum_steps = 0
    with pytest.raises(ValueError, match=r"config.train.accum_steps=0: expected a positive"):
        check(config)
