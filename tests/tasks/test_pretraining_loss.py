"""The MLM cross-entropy's hand-written gradient equals autodiff of optax's, and the
pre-training step no longer scatters into a [batch, P, vocab] array."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.tasks.pretraining.loss import pretraining_loss, softmax_xent_int


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_xent_value_and_gradient_equal_optax(dtype):
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 5, 37)) * 4, dtype)
    labels = jnp.asarray(rng.integers(0, 37, size=(3, 5)), jnp.int32)
    w = jnp.asarray(rng.random((3, 5)), jnp.float32)

    def ours(x):
        return jnp.sum(softmax_xent_int(x.astype(jnp.float32), labels) * w)

    def theirs(x):
        return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(
            x.astype(jnp.float32), labels) * w)

    assert float(ours(logits)) == float(theirs(logits))  # the forward is optax's
    g_ours, g_theirs = jax.grad(ours)(logits), jax.grad(theirs)(logits)
    assert g_ours.dtype == dtype
    # The same terms added in the same order: equal bit for bit (jitted, as in the step).
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.grad(ours))(logits), np.float32),
                                  np.asarray(jax.jit(jax.grad(theirs))(logits), np.float32))
    np.testing.assert_array_equal(np.asarray(g_ours, np.float32), np.asarray(g_theirs, np.float32))
    # By hand for one row: softmax(x) - e_label, times its weight.
    x = np.asarray(logits[1, 2], np.float64)
    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    p[int(labels[1, 2])] -= 1
    np.testing.assert_allclose(np.asarray(g_ours[1, 2], np.float64), p * float(w[1, 2]),
                               atol=1e-6 if dtype == jnp.float32 else 2e-2)


@pytest.mark.parametrize("plat, scatter", [("gpu", False), ("tpu", False), ("cpu", True)])
def test_mlm_loss_gradient_has_no_vocab_scatter_on_accelerators(plat, scatter, monkeypatch):
    # The platform is what the step compiles for; on CPU optax's autodiff is kept (bit for
    # bit the earlier step), and its scatter shows that the check below can fail.
    from bert_jax.tasks.pretraining import loss

    monkeypatch.setattr(loss, "platform", lambda: plat)
    b, p, v = 4, 6, 1000
    batch = dict(masked_lm_ids=jnp.zeros((b, p), jnp.int32),
                 masked_lm_weights=jnp.ones((b, p), jnp.float32),
                 next_sentence_labels=jnp.zeros((b,), jnp.int32))

    def loss(mlm, nsp):
        return pretraining_loss(mlm, nsp, batch)[0]

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(
        jnp.zeros((b, p, v), jnp.bfloat16), jnp.zeros((b, 2), jnp.bfloat16)).compile().as_text()
    # (optax's gather-based gradient compiles to `f32[4,6,1000]{...} scatter(...)`.)
    scatters = [line for line in hlo.splitlines()
                if " scatter(" in line and f",{v}]" in line]
    assert bool(scatters) == scatter, scatters
