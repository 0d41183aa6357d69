"""The activations against float64 references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.layers import activation, gelu_erf


def _gelu64(x):
    return np.array([v * 0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])


def _dgelu64(x):
    return np.array([0.5 * (1.0 + math.erf(v / math.sqrt(2.0)))
                     + v * math.exp(-0.5 * v * v) / math.sqrt(2.0 * math.pi) for v in x])


def test_gelu_matches_float64_and_jax():
    x = np.concatenate([np.linspace(-12, 12, 4001), [-30.0, -0.0, 0.0, 1e-8, 30.0]])
    x32 = jnp.asarray(x, jnp.float32)
    x64 = np.asarray(x32, np.float64)  # compare at the float32 inputs
    ours = np.asarray(gelu_erf(x32), np.float64)
    ref = _gelu64(x64)
    # x >= -1: float32 rounding, relative. Below, 1 + erf(x / sqrt2) cancels in float32 (as
    # in PyTorch's and TF's formula) and XLA's float32 erf is ~1e-7 off near -1, so the tiny
    # |gelu(x)| < 0.16 there carries up to ~1e-6 absolute error (6.5e-7 seen, at x ~ -5.3).
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)
    near = x64 >= -1
    np.testing.assert_allclose(ours[near], ref[near], rtol=2e-6, atol=1e-12)
    erfc = np.asarray(jax.nn.gelu(x32, approximate=False), np.float64)
    np.testing.assert_allclose(ours[near], erfc[near], rtol=2e-6, atol=1e-12)
    assert activation("gelu") is gelu_erf
    # the tanh approximation is a different function (up to ~5e-4 apart)
    assert np.max(np.abs(np.asarray(activation("gelu_new")(x32)) - ref)) > 1e-4


def test_gelu_gradient_matches_float64():
    x32 = jnp.linspace(-10, 10, 2001, dtype=jnp.float32)
    g = np.asarray(jax.vmap(jax.grad(gelu_erf))(x32), np.float64)
    np.testing.assert_allclose(g, _dgelu64(np.asarray(x32, np.float64)), rtol=1e-5, atol=2e-7)


def test_gelu_bfloat16_stays_bfloat16():
    y = gelu_erf(jnp.ones((4,), jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y, np.float32), 0.8413447 * np.ones(4), rtol=1e-2)


def test_gelu_half_precision_rounds_once():
    """bf16 / f16 in: float32 inside, one rounding out (PyTorch's opmath), value and
    derivative; so every output is the float64 GELU rounded to the nearest bf16, or its
    neighbour where float32 itself sits at a rounding tie."""
    x = jnp.asarray(np.linspace(-8, 8, 20001), jnp.bfloat16)
    for dtype in (jnp.bfloat16, jnp.float16):
        xd = x.astype(dtype)
        once = gelu_erf(xd.astype(jnp.float32)).astype(dtype)
        np.testing.assert_array_equal(np.asarray(gelu_erf(xd)), np.asarray(once))
        g = jax.vmap(jax.grad(lambda v: gelu_erf(v)))(xd)
        g_once = jax.vmap(jax.grad(gelu_erf))(xd.astype(jnp.float32)).astype(dtype)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(g_once))
    x64 = np.asarray(x, np.float64)
    ours = np.asarray(gelu_erf(x), np.float64)
    ref = _gelu64(x64)
    ulp = np.abs(np.asarray(jnp.asarray(ref, jnp.bfloat16), np.float64)) * 2.0**-7 + 1e-30
    err = np.abs(ours - ref)
    near = x64 >= -1  # below, float32's 1 + erf cancels (test above): ~1e-6 more
    # one rounding: within a bf16 ulp of the float64 value (half an ulp, or one where the
    # float32 result and the float64 one round to different neighbours)
    assert np.max(err[near] / ulp[near]) <= 1.0
    assert np.all(err[~near] <= ulp[~near] + 1e-6)
    # the half-precision formula rounds several times: some outputs off by a whole ulp or more
    naive = np.asarray(x * jnp.asarray(0.5, jnp.bfloat16)
                       * (1 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, jnp.bfloat16))),
                       np.float64)
    assert np.max(np.abs(naive - ref)[near] / ulp[near]) > 1.0


def _values_and_grads(module, x):
    import flax
    params = flax.linen.meta.unbox(module.init(jax.random.PRNGKey(0), x)["params"])
    params = jax.tree_util.tree_map(
        lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(1), p.shape, p.dtype), params)
    f = lambda p, x: jnp.sum(jnp.sin(module.apply({"params": p}, x).astype(jnp.float32)))  # noqa: E731
    return module.apply({"params": params}, x), jax.grad(f, argnums=(0, 1))(params, x)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_named_dense_and_layernorm_are_flaxs_bit_for_bit(dtype):
    # Dense (product_name) and LayerNorm (stats_name) reimplement flax's __call__ so that a
    # remat policy can name inner values: the same ops in the same order, so the same bits
    # as nn.Dense / nn.LayerNorm (with bert_jax's float32 bias add) values and gradients.
    import flax.linen as nn

    from bert_jax.models.layers import Dense, LayerNorm, promote_all_but_bias
    x = jax.random.normal(jax.random.PRNGKey(2), (3, 5, 24), jnp.float32).astype(dtype)

    class FlaxDense(nn.Dense):  # bert_jax's Dense before it had product_name
        promote_dtype: object = promote_all_but_bias

        def __call__(self, inputs):
            return super().__call__(inputs).astype(self.dtype)

    pairs = [(Dense(40, dtype=dtype, product_name="p"), FlaxDense(40, dtype=dtype)),
             (Dense(40, dtype=dtype), FlaxDense(40, dtype=dtype)),
             (LayerNorm(epsilon=1e-12, dtype=dtype, stats_name="s"),
              nn.LayerNorm(epsilon=1e-12, dtype=dtype)),
             (LayerNorm(epsilon=1e-5, dtype=dtype, use_bias=False),
              nn.LayerNorm(epsilon=1e-5, dtype=dtype, use_bias=False))]
    for ours, theirs in pairs:
        (got, got_grads), (want, want_grads) = (_values_and_grads(m, x) for m in (ours, theirs))
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
        jax.tree_util.tree_map(
            lambda g, w: np.testing.assert_array_equal(np.asarray(g, np.float32),
                                                       np.asarray(w, np.float32)),
            got_grads, want_grads)
