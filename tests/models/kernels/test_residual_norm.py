"""models/kernels/residual_norm.py: post-LN's bias + dropout + residual add + LayerNorm as
one Pallas kernel each way (run here in interpret mode) against the XLA path's expression
and jax's own backward pass of it; the model with the kernels against the model without;
the choice of path; a mesh (the dropout hash of each shard's rows)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.config import BertConfig, ConfigError
from bert_jax.models.dropout import Dropout, hash_dropout, keep_mask
from bert_jax.models.kernels import residual_norm as norm_kernel
from bert_jax.models.kernels.dropout_hash import drop_threshold
from bert_jax.models.layers import LayerNorm
from bert_jax.models.params import stack_layers
from tests.conftest import REPO
from tests.models.helpers import (pretraining_loss_and_grads, pretraining_params,
                                   random_batch, run_mesh_worker, tiny_config)

RATE, EPS = 0.1, 1e-12


def _inputs(dtype, rows=64, width=96, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 7)
    p = jax.random.normal(k[0], (rows, width)).astype(dtype)
    residual = (2 * jax.random.normal(k[1], (rows, width))).astype(dtype)
    bias = 0.5 * jax.random.normal(k[2], (width,))
    scale = 1 + 0.2 * jax.random.normal(k[3], (width,))
    shift = 0.3 * jax.random.normal(k[4], (width,))
    seeds = jax.random.bits(k[5], (2,), jnp.uint32)
    dy = jax.random.normal(k[6], (rows, width)).astype(dtype)
    return p, bias, residual, scale, shift, seeds, dy


def _layer_norm(z, scale, shift):
    """The model's LayerNorm (flax's, op for op) of z with these parameters."""
    ln = LayerNorm(epsilon=EPS, dtype=z.dtype, param_dtype=jnp.float32)
    return ln.apply({"params": {"scale": scale, "bias": shift}}, z)


def _reference(p, bias, residual, scale, shift, seeds, rate=RATE):
    """The XLA path: Dense's bias add, hash dropout, the residual add, the LayerNorm."""
    t = (p.astype(jnp.float32) + bias).astype(p.dtype)
    if seeds is not None:
        t = hash_dropout(t, seeds, rate)
    return _layer_norm(residual + t, scale, shift)


@pytest.mark.parametrize("dropout", [True, False])
def test_float32_kernels_equal_the_expression_and_its_gradient(dropout):
    """width 96: three 32-wide column tiles per row (BERT-Base's 768 is three of 256)."""
    p, bias, residual, scale, shift, seeds, dy = _inputs(jnp.float32)
    seeds = seeds if dropout else None
    fn = lambda *a: norm_kernel.residual_norm(  # noqa: E731
        *a, seeds, rate=RATE, eps=EPS, interpret=True)
    ref = lambda *a: _reference(*a, seeds)  # noqa: E731
    args = (p, bias, residual, scale, shift)
    y, vjp = jax.vjp(fn, *args)
    y_ref, vjp_ref = jax.vjp(ref, *args)
    np.testing.assert_allclose(np.asarray(y), np.asarray(y_ref), rtol=0, atol=2e-6)
    for name, got, want in zip(("p", "bias", "residual", "scale", "shift"), vjp(dy),
                               vjp_ref(dy)):
        want = np.asarray(want)
        assert np.max(np.abs(want)) > 0.1, name  # a real signal
        np.testing.assert_allclose(np.asarray(got), want, rtol=0,
                                   atol=3e-6 * np.max(np.abs(want)) * (1 + (name == "bias")),
                                   err_msg=name)
    if dropout:  # the dropped elements get no gradient through p: the hash mask's own
        keep = np.asarray(keep_mask_of(seeds, p.shape))
        dp = np.asarray(vjp(dy)[0])
        assert np.all(dp[~keep] == 0) and np.mean(dp[keep] != 0) > 0.99
        assert 0.05 < 1 - keep.mean() < 0.15


def keep_mask_of(seeds, shape):
    """The mask hash_dropout(x, seeds, RATE) applies, from its output on ones."""
    return hash_dropout(jnp.ones(shape, jnp.float32), seeds, RATE) != 0


def test_bfloat16_kernels_against_float64():
    """bfloat16 p and residual: z = residual + dropout(p + bias) rounded to bfloat16 as on
    the XLA path (held on the host here: XLA:CPU's excess precision would skip that
    rounding in a jitted reference); y within one bfloat16 rounding of the float64
    LayerNorm of that z; the gradients within one rounding of the float64 ones (the
    kernel rounds the float32 input gradient once: jax's backward pass rounds two terms
    and their sum)."""
    p, bias, residual, scale, shift, seeds, dy = _inputs(jnp.bfloat16, rows=128, width=256)
    y, z, mean, rstd = norm_kernel.forward(p, residual,
                                           norm_kernel.vectors(bias, scale, shift, seeds),
                                           rate=RATE, eps=EPS, interpret=True)
    t = np.asarray((p.astype(jnp.float32) + bias).astype(jnp.bfloat16))
    keep = np.asarray(keep_mask_of(seeds, p.shape))
    scale_drop = np.asarray(jnp.asarray(1 / (1 - drop_threshold(RATE) / 2**32),
                                        jnp.bfloat16))
    d = np.where(keep, np.asarray((t * scale_drop).astype(jnp.bfloat16)), 0)
    z_want = np.asarray((jnp.asarray(residual) + jnp.asarray(d, jnp.bfloat16)))
    np.testing.assert_array_equal(np.asarray(z), z_want)
    z64 = z_want.astype(np.float64)
    mu = z64.mean(-1, keepdims=True)
    rs = 1 / np.sqrt(z64.var(-1, keepdims=True) + EPS)
    xhat = (z64 - mu) * rs
    y64 = xhat * np.asarray(scale, np.float64) + np.asarray(shift, np.float64)
    np.testing.assert_allclose(np.asarray(y, np.float64), y64, rtol=2**-8, atol=1e-2)
    np.testing.assert_allclose(np.asarray(mean), mu[:, 0], rtol=1e-5, atol=1e-5)

    dr, dp, dv = norm_kernel.backward((dy,), z, mean, rstd,
                                      norm_kernel.vectors(bias, scale, shift, seeds), rate=RATE,
                                   interpret=True)
    dy64 = np.asarray(dy, np.float64)
    g = dy64 * np.asarray(scale, np.float64)
    dz = rs * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    err = np.abs(np.asarray(dr, np.float64) - dz)
    assert np.all(err <= 2**-8 * np.abs(dz) + 1e-3 * np.max(np.abs(dz))), np.max(err)
    dp_want = np.where(keep, np.asarray(dr, np.float64) * float(scale_drop), 0)
    np.testing.assert_allclose(np.asarray(dp, np.float64), dp_want, rtol=2**-8)
    dv = np.asarray(dv, np.float64)
    np.testing.assert_allclose(dv[0], np.asarray(dp, np.float64).sum(0), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dv[1], (dy64 * xhat).sum(0), rtol=2e-3, atol=2e-2)
    np.testing.assert_allclose(dv[2], dy64.sum(0), rtol=1e-5, atol=1e-4)
    assert np.all(dv[3] == 0)


def test_two_copies_add_their_cotangents():
    p, bias, residual, scale, shift, seeds, dy = _inputs(jnp.float32)
    args = (p, bias, residual, scale, shift)
    one = lambda *a: norm_kernel.residual_norm(  # noqa: E731
        *a, seeds, rate=RATE, eps=EPS, interpret=True)
    two = lambda *a: norm_kernel.residual_norm(  # noqa: E731
        *a, seeds, rate=RATE, eps=EPS, copies=2, interpret=True)
    (y1, y2), vjp2 = jax.vjp(two, *args)
    y, vjp1 = jax.vjp(one, *args)
    np.testing.assert_array_equal(np.asarray(y1), np.asarray(y))
    np.testing.assert_array_equal(np.asarray(y2), np.asarray(y))
    half = 0.25 * dy
    for got, want in zip(vjp2((half, dy - half)), vjp1(dy)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_path_and_config():
    c = BertConfig(dtype="bfloat16")
    assert norm_kernel.path("auto", "gpu", c)
    assert not norm_kernel.path("auto", "cpu", c)  # the CPU step stays XLA's, bit for bit
    assert not norm_kernel.path("auto", "tpu", c)
    assert not norm_kernel.path("auto", "gpu", BertConfig())  # float32 compute
    assert not norm_kernel.path("auto", "gpu", c.replace(remat="minimal_ffn"))
    assert not norm_kernel.path("xla", "gpu", c)
    assert norm_kernel.path("pallas", "cpu", BertConfig(remat="full"))
    # masks the kernels cannot draw, or another architecture: XLA whatever asked
    assert not norm_kernel.path("pallas", "gpu", c.replace(dropout_rng="jax"))
    assert norm_kernel.path("pallas", "gpu", c.replace(dropout_rng="jax", hidden_dropout_prob=0.0))
    assert not norm_kernel.path("pallas", "gpu",
                                c.replace(pre_ln=True, layer0_attention_norm=False))
    assert not norm_kernel.path("pallas", "gpu", c.replace(norm_bias=False))
    assert norm_kernel.chunk(768) == 256 and norm_kernel.chunk(1024) == 256
    assert norm_kernel.chunk(384) == 128 and norm_kernel.chunk(40) is None
    assert norm_kernel.backward_rows(32768) == 128 and norm_kernel.backward_rows(48) == 16
    assert norm_kernel.fits((4, 16, 32)) and not norm_kernel.fits((3, 5, 32))
    with pytest.raises(ConfigError, match="residual_norm='fast'.*'auto', 'xla', 'pallas'"):
        BertConfig(residual_norm="fast")


def loss_and_grads(config, params, batch, dropout=True):
    return pretraining_loss_and_grads(config, params, batch, dropout)


def _compare(got, want, tol):
    """Every gradient within tol of the largest element of its reference; the attention key
    biases, whose gradient is zero up to rounding (softmax is shift-invariant), absolutely."""
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want),
                            jax.tree_util.tree_leaves(got)):
        w, g = np.asarray(w, np.float32), np.asarray(g, np.float32)
        name = jax.tree_util.keystr(path)
        scale = 1.0 if "['key']['bias']" in name else max(float(np.max(np.abs(w))), 1e-6)
        assert float(np.max(np.abs(g - w))) / scale < tol, name


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-5), ("bfloat16", 2e-2)])
def test_model_with_the_kernels_equals_xla(dtype, tol):
    """The tiny BERT with dropout on and off: residual_norm=pallas (interpret mode) against
    xla. The same masks (in float32 the loss agrees to rounding, where the masks move it by
    percents), every gradient to float32 summation order in float32 and to bfloat16
    rounding in bfloat16 (where the kernels round each dtype operation as a GPU does and
    XLA:CPU keeps excess precision)."""
    config = tiny_config(intermediate_size=64, dtype=dtype)
    batch = random_batch(config, batch=3, length=16)
    params = pretraining_params(config, batch[0])
    # CPU "auto": no kernel (the CPU step is XLA's, unchanged)
    jaxpr = str(jax.make_jaxpr(lambda p: loss_and_grads(config, p, batch))(params))
    assert "residual_norm" not in jaxpr
    kernel = config.replace(residual_norm="pallas")
    jaxpr = str(jax.make_jaxpr(lambda p: loss_and_grads(kernel, p, batch))(params))
    assert "residual_norm_fwd" in jaxpr and "residual_norm_bwd" in jaxpr
    losses = {}
    for dropout in (True, False):
        loss_w, want = loss_and_grads(config.replace(residual_norm="xla"), params, batch,
                                       dropout)
        loss_g, got = loss_and_grads(kernel, params, batch, dropout)
        if dtype == "float32":  # (in bfloat16, a sum of 900 sines of logits rounded apart)
            assert abs(float(loss_g) - float(loss_w)) < 2e-6 * abs(float(loss_w)), dropout
        _compare(got, want, tol)
        losses[dropout] = float(loss_w)
    assert abs(losses[True] - losses[False]) > 1e-2 * abs(losses[False])  # dropout matters


@pytest.mark.parametrize("unroll", [1, 0])
def test_scanned_layers_pass_pairs_through_the_loop(unroll):
    """nn.scan's carry is the layers' (output, output) pair: as a loop (scan_unroll=1) and
    unrolled (0), float32 with dropout, the kernels' model equals the XLA path's."""
    config = tiny_config(intermediate_size=64, num_hidden_layers=3)
    batch = random_batch(config, batch=3, length=16)
    params = pretraining_params(config, batch[0])
    scanned = config.replace(scan_layers=True, scan_unroll=unroll)
    stacked = stack_layers(params, config.num_hidden_layers)
    loss_w, want = loss_and_grads(scanned.replace(residual_norm="xla"), stacked, batch)
    kernel = scanned.replace(residual_norm="pallas")
    jaxpr = str(jax.make_jaxpr(lambda p: loss_and_grads(kernel, p, batch))(stacked))
    assert "residual_norm_bwd" in jaxpr
    loss_g, got = loss_and_grads(kernel, stacked, batch)
    assert abs(float(loss_g) - float(loss_w)) < 2e-6 * abs(float(loss_w))
    _compare(got, want, 2e-5)


_MESH_WORKER = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np, ml_collections
sys.path.insert(0, sys.argv[1])
from bert_jax import sharding as sharding_lib
from bert_jax.train.state import mesh_context
from tests.models.helpers import pretraining_params, random_batch, tiny_config
from tests.models.kernels.test_residual_norm import loss_and_grads

config = tiny_config(intermediate_size=64)
ids, mask, types = random_batch(config, batch=3, length=16)
batch = [jnp.concatenate([a, a[:1]]) for a in (ids, mask, types)]  # 4 examples
params = pretraining_params(config, batch[0])
loss_w, want = loss_and_grads(config.replace(residual_norm="xla"), params, batch)
mesh = sharding_lib.make_mesh(ml_collections.ConfigDict(dict(data=2, fsdp=2, tensor=1)))
with mesh_context(mesh, sharding_lib.DEFAULT_RULES):
    cfg = config.replace(residual_norm="pallas")
    jaxpr = str(jax.make_jaxpr(lambda p: loss_and_grads(cfg, p, batch))(params))
    loss_g, got = loss_and_grads(cfg, params, batch)
err = max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)))
                / max(1.0, float(np.max(np.abs(np.asarray(w))))))
          for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)))
print(json.dumps({"devices": jax.device_count(), "max_err": err,
                  "loss": [float(loss_g), float(loss_w)], "shard_map": "shard_map" in jaxpr,
                  "kernel": "residual_norm_bwd" in jaxpr}))
"""


def test_kernels_on_a_mesh_equal_one_device_xla():
    """float32, dropout on, examples over a 2 x 2 (data, fsdp) mesh: each shard's kernels
    draw the hash mask of their own global rows, so the loss and gradients are the
    single-device XLA path's."""
    result = run_mesh_worker(_MESH_WORKER, REPO)
    assert result["shard_map"] and result["kernel"], result
    loss_g, loss_w = result["loss"]
    # float32 summation order: the loss sums over four shards (the masks: max_err below)
    assert abs(loss_g - loss_w) < 1e-5 * abs(loss_w), result
    assert result["max_err"] < 2e-5, result


def test_dropout_module_key_is_the_kernels():
    """The encoder hands the kernel the seeds its Dropout module would draw (make_key):
    the module's own output is the hash mask of those seeds."""
    x = jnp.ones((8, 32), jnp.float32)
    drop = Dropout(rate=RATE, impl="hash")
    rngs = {"dropout": jax.random.PRNGKey(3)}
    out = drop.apply({}, x, deterministic=False, rngs=rngs)
    key = drop.apply({}, method=lambda m: m.make_key(), rngs=rngs)
    want = keep_mask(key, x.shape, RATE)
    np.testing.assert_array_equal(np.asarray(out != 0), np.asarray(want))
