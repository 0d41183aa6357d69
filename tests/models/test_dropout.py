"""The hash dropout (bert_jax/models/dropout.py): rate, scale, statistical independence,
determinism, mesh invariance, and impl="jax" == flax's nn.Dropout."""

import os
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import dropout as dropout_lib
from bert_jax.models.config import BertConfig, ConfigError
from bert_jax.models.dropout import Dropout


def _mask(seed, shape, rate=0.1):
    return np.asarray(dropout_lib.keep_mask(jax.random.key(seed), shape, rate))


def _z(observed, expected_p, n):
    return (observed - expected_p * n) / np.sqrt(n * expected_p * (1 - expected_p))


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9, 1e-3])
def test_keep_fraction(rate):
    # 8 x 12 x 128 x 128 = 1.57M draws: the kept count is within 5 sigma of binomial.
    m = _mask(0, (8, 12, 128, 128), rate)
    assert abs(_z(m.sum(), 1 - rate, m.size)) < 5


def test_threshold_and_scale_are_exact():
    # drop iff hash < round(rate * 2**32); kept values scaled by 1 / (1 - threshold / 2**32)
    assert dropout_lib.drop_threshold(0.1) == 429496730
    x = jnp.full((64, 256), 3.0, jnp.float32)
    y = Dropout(rate=0.1, impl="hash").apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(5)})
    y = np.asarray(y)
    kept = y != 0
    np.testing.assert_array_equal(kept, _mask_via_module_key(5, (64, 256)))
    scale = 1.0 / (1.0 - 429496730 / 2.0**32)
    np.testing.assert_allclose(y[kept], np.float32(3.0 * np.float32(scale)), rtol=0)
    assert 0.85 < kept.mean() < 0.95


def _mask_via_module_key(seed, shape):
    """The key the module draws: flax's make_rng("dropout") at the module's path."""
    class Probe(nn.Module):
        @nn.compact
        def __call__(self):
            return self.make_rng("dropout")
    # Dropout is a top-level module in the test above, and so is Probe: same path (), same
    # rng counter, hence the same key.
    key = Probe().apply({}, rngs={"dropout": jax.random.key(seed)})
    return np.asarray(dropout_lib.keep_mask(key, shape, 0.1))


def test_unbiased_in_expectation():
    x = jax.random.normal(jax.random.key(1), (4096, 64))
    ys = [Dropout(rate=0.3, impl="hash").apply({}, x, deterministic=False, rngs={"dropout": jax.random.key(s)})
          for s in range(64)]
    mean = np.mean(np.stack(ys), axis=0)
    # per element: mean of 64 draws of x*keep/0.7; its std is |x| * sqrt(0.3/0.7/64)
    err = (mean - np.asarray(x)) / (np.abs(np.asarray(x)) * np.sqrt(0.3 / 0.7 / 64) + 1e-12)
    assert abs(err.mean()) < 0.02 and 0.9 < err.std() < 1.1


def test_no_structure_within_a_mask():
    """Neighbouring elements, rows and columns, and positions across keys are independent:
    correlations stay within 5 / sqrt(n) of 0 and every position's keep frequency over 512
    keys is binomial."""
    m = _mask(3, (8, 128, 768)).astype(np.float64)
    flat = m.reshape(-1)
    lim = lambda n: 5.0 / np.sqrt(n)  # noqa: E731
    for lag in (1, 2, 768, 128 * 768):  # next element, next row, next batch row
        c = np.corrcoef(flat[:-lag], flat[lag:])[0, 1]
        assert abs(c) < lim(flat.size - lag), (lag, c)
    # rows are not shifted copies of one another
    rows = m.reshape(-1, 768)
    c = np.corrcoef(rows[:-1].reshape(-1), rows[1:].reshape(-1))[0, 1]
    assert abs(c) < lim(rows[:-1].size)
    # each column's and each row's keep rate is binomial (chi-square-like bound on z)
    zc = _z(rows.sum(0), 0.9, rows.shape[0])
    zr = _z(rows.sum(1), 0.9, rows.shape[1])
    assert abs(zc.mean()) < 5 / np.sqrt(zc.size) * 1.5 and 0.85 < zc.std() < 1.15
    assert abs(zr.mean()) < 5 / np.sqrt(zr.size) * 1.5 and 0.85 < zr.std() < 1.15
    # across 512 keys, each of the 64 x 64 positions is kept ~ Binomial(512, 0.9)
    many = np.stack([_mask(s, (64, 64)) for s in range(512)]).astype(np.float64)
    z = _z(many.sum(0), 0.9, 512)
    assert abs(z.mean()) < 0.1 and 0.9 < z.std() < 1.1
    # masks of different keys are uncorrelated, including keys that differ by one
    a, b = many[0].reshape(-1), many[1].reshape(-1)
    assert abs(np.corrcoef(a, b)[0, 1]) < lim(a.size)
    pair = (many[:-1] * many[1:]).mean()
    assert abs(pair - 0.81) < 5 * np.sqrt(0.81 * 0.19 / many[1:].size)


def test_deterministic_and_identity_cases():
    x = jnp.arange(12.0).reshape(3, 4)
    key = jax.random.key(0)
    assert np.array_equal(_mask(7, (3, 4)), _mask(7, (3, 4)))
    assert not np.array_equal(_mask(7, (64, 64)), _mask(8, (64, 64)))
    for kw in (dict(deterministic=True), dict(deterministic=False)):
        rate = 0.5 if kw["deterministic"] else 0.0
        y = Dropout(rate=rate, impl="hash").apply({}, x, rngs={"dropout": key}, **kw)
        np.testing.assert_array_equal(y, x)
    with pytest.raises(ValueError, match="< 2\\*\\*32"):
        dropout_lib.hash_bits(key, (2**16, 2**16, 2))
    with pytest.raises(ConfigError, match="dropout_rng='threefry'"):
        BertConfig(dropout_rng="threefry")


def test_jax_impl_is_flax_dropout_bit_for_bit():
    x = jax.random.normal(jax.random.key(0), (4, 16, 32))
    for rate in (0.1, 0.5):
        ours = Dropout(rate=rate, impl="jax").apply(
            {}, x, deterministic=False, rngs={"dropout": jax.random.key(9)})
        ref = nn.Dropout(rate=rate).apply(
            {}, x, deterministic=False, rngs={"dropout": jax.random.key(9)})
        np.testing.assert_array_equal(ours, ref)


def test_gradient_is_the_mask_times_scale():
    x = jnp.ones((32, 64))
    f = lambda v: jnp.sum(Dropout(rate=0.25, impl="hash").apply(  # noqa: E731
        {}, v, deterministic=False, rngs={"dropout": jax.random.key(2)}))
    g = np.asarray(jax.grad(f)(x))
    y = np.asarray(Dropout(rate=0.25, impl="hash").apply({}, x, deterministic=False,
                                            rngs={"dropout": jax.random.key(2)}))
    np.testing.assert_array_equal(g, y)  # d/dx (x * keep * s) = keep * s, and x = 1



def test_gradient_regenerates_the_mask():
    """The backward pass keeps the two seeds, not a mask per element, and its gradient is
    autodiff's of the same expression bit for bit."""
    x = jax.random.normal(jax.random.key(3), (2, 16, 64), jnp.bfloat16)
    drop = lambda v: Dropout(rate=0.1, impl="hash").apply(  # noqa: E731
        {}, v, deterministic=False, rngs={"dropout": jax.random.key(5)})
    y, vjp = jax.vjp(drop, x)
    assert [(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(vjp)] == [((2,), jnp.uint32)]
    keep = y != 0  # x has no zeros
    assert 0.05 < 1 - float(jnp.mean(keep)) < 0.15
    scale = 1.0 / (1.0 - dropout_lib.drop_threshold(0.1) / 2.0**32)
    ref = lambda v: jnp.where(keep, v * jnp.asarray(scale, v.dtype), jnp.zeros((), v.dtype))  # noqa: E731
    np.testing.assert_array_equal(y, ref(x))
    g = jax.random.normal(jax.random.key(6), x.shape, jnp.bfloat16)
    np.testing.assert_array_equal(jax.jit(vjp)(g)[0], jax.vjp(ref, x)[1](g)[0])

_MESH_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from bert_jax.models import dropout as d
    key = jax.random.key(4)
    shape = (8, 12, 16, 32)
    ref = np.asarray(jax.jit(lambda k: d.hash_bits(k, shape))(key))
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "tensor"))
    out = NamedSharding(mesh, P("data", "tensor"))
    got = jax.jit(lambda k: d.hash_bits(k, shape), out_shardings=out)(key)
    assert len(got.addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(got), ref)
    print("OK")
""")


def test_mask_is_the_same_on_a_mesh():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]
