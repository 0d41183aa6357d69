"""optax pieces: the weight-decay mask on the real parameter tree, the schedules, and one
AdamW / LAMB update against the formulas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax import optim
from bert_jax.tasks.pretraining import PretrainingTask
from bert_jax.train import state as state_lib
from tests.train.common import tiny_config


def _flat(tree):
    return {tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey)): v
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_decay_mask_on_the_pretraining_tree():
    config = tiny_config()
    model = PretrainingTask(config, "").model
    params = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                               **state_lib.dummy_inputs(16, 4))["params"])
    mask = _flat(optim.decay_mask(params))
    decayed = sorted(k for k, v in mask.items() if v)
    kept = sorted(k for k, v in mask.items() if not v)
    # 2 layers x (q, k, v, attention out, intermediate, output) kernels + word / position /
    # token-type embeddings + pooler + MLM transform + NSP kernels.
    assert len(decayed) == 2 * 6 + 3 + 3
    # 2 layers x (6 biases + 2 LayerNorms x 2) + embedding LN (2) + pooler bias + MLM
    # transform bias + MLM LN (2) + MLM output bias + NSP bias.
    assert len(kept) == 2 * 10 + 2 + 1 + 1 + 2 + 1 + 1
    assert all(k[-1] in ("kernel", "embedding") for k in decayed)
    assert all(k[-1] in ("bias", "scale", "output_bias") for k in kept)
    assert mask[("bert", "embeddings", "LayerNorm", "scale")] is False
    assert mask[("mlm", "output_bias")] is False
    assert mask[("bert", "embeddings", "word_embeddings", "embedding")] is True
    assert mask[("bert", "encoder", "layer_1", "attention", "query", "kernel")] is True


def _schedule(**kw):
    base = dict(lr=1.0, warmup_steps=10, decay="linear", power=1.0, end_lr=0.0)
    base.update(kw)
    return optim.make_schedule(ml_collections.ConfigDict(base), 110)


def test_schedules():
    lin = _schedule()
    assert [float(lin(s)) for s in (0, 5, 10, 60, 110, 200)] == pytest.approx(
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.0], abs=1e-6)
    poly = _schedule(decay="polynomial", power=2.0)
    assert float(poly(60)) == pytest.approx(0.25, abs=1e-6)
    cos = _schedule(decay="cosine")
    assert float(cos(60)) == pytest.approx(0.5, abs=1e-6)
    assert float(cos(110)) == pytest.approx(0.0, abs=1e-6)
    const = _schedule(decay="constant", warmup_steps=0)
    assert float(const(0)) == float(const(1000)) == 1.0
    with pytest.raises(ValueError, match="schedule.decay"):
        _schedule(decay="step")


def _tx(name, clip=1.0, wd=0.01, lr=0.1):
    opt = ml_collections.ConfigDict(dict(name=name, b1=0.9, b2=0.999, eps=1e-6,
                                         weight_decay=wd, clip_norm=clip))
    sched = ml_collections.ConfigDict(dict(lr=lr, warmup_steps=0, decay="constant"))
    return optim.make_optimizer(opt, sched, 100)


PARAMS = {"dense": {"kernel": jnp.array([[1.0, -2.0], [0.5, 3.0]]), "bias": jnp.array([0.3, -0.1])},
          "LayerNorm": {"scale": jnp.array([1.0, 2.0])}}


def test_adamw_first_update_matches_formula():
    grads = {"dense": {"kernel": jnp.array([[3.0, 0.0], [-4.0, 1.0]]), "bias": jnp.array([2.0, -1.0])},
             "LayerNorm": {"scale": jnp.array([0.5, 0.0])}}
    tx = _tx("adamw")
    updates, _ = tx.update(grads, tx.init(PARAMS), PARAMS)
    g = {k: np.asarray(v) for k, v in _flat(grads).items()}
    norm = np.sqrt(sum(np.sum(v ** 2) for v in g.values()))
    assert norm > 1.0  # clipping is active
    for key, gv in g.items():
        gc = gv / norm
        # Step 1 with bias correction: m_hat = g, v_hat = g^2.
        adam = gc / (np.abs(gc) + 1e-6)
        decay = 0.01 * np.asarray(_flat(PARAMS)[key]) if key[-1] == "kernel" else 0.0
        np.testing.assert_allclose(np.asarray(_flat(updates)[key]), -0.1 * (adam + decay),
                                   rtol=1e-5, atol=1e-7, err_msg=str(key))


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_zero_gradient_decays_only_kernels(name):
    zeros = jax.tree_util.tree_map(jnp.zeros_like, PARAMS)
    tx = _tx(name, clip=0.0)
    updates = _flat(tx.update(zeros, tx.init(PARAMS), PARAMS)[0])
    kernel = np.asarray(PARAMS["dense"]["kernel"])
    if name == "adamw":
        expected = -0.1 * 0.01 * kernel
    else:  # LAMB: the trust ratio |w| / |update| rescales the decay step to lr * |w|.
        expected = -0.1 * np.linalg.norm(kernel) * kernel / np.linalg.norm(kernel)
    np.testing.assert_allclose(np.asarray(updates[("dense", "kernel")]), expected, rtol=1e-5)
    assert not np.any(np.asarray(updates[("dense", "bias")]))
    assert not np.any(np.asarray(updates[("LayerNorm", "scale")]))


def test_unknown_optimizer_is_an_error():
    with pytest.raises(ValueError, match="optimizer.name"):
        _tx("sgd")
