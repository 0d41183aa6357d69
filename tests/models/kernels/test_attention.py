"""The attention dispatch: which path each setting takes on each platform, and every path
that runs on CPU (XLA; the Pallas kernel in interpret mode) against the XLA reference
through the whole model, outputs and gradients, with padding and dropout."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import BertForPreTraining
from bert_jax.models.attention import qkv_products
from bert_jax.models.kernels.attention import AttentionConfigError, resolve
from tests.conftest import REPO
from tests.models.helpers import random_batch, run_mesh_worker, tiny_config

POSITIONS = jnp.array([[1, 2, 5], [3, 4, 0], [1, 2, 3]])


@pytest.mark.parametrize("impl, plat, dtype, rate, rng, training, want", [
    ("auto", "cpu", "float32", 0.1, "hash", True, "xla"),
    ("auto", "tpu", "bfloat16", 0.1, "hash", True, "xla"),
    ("auto", "gpu", "bfloat16", 0.1, "hash", True, "pallas"),    # dropout in the kernel
    ("auto", "gpu", "bfloat16", 0.1, "jax", True, "xla"),        # the kernel draws hash masks
    ("auto", "gpu", "bfloat16", 0.1, "jax", False, "cudnn"),     # eval: no dropout
    ("auto", "gpu", "bfloat16", 0.0, "hash", True, "cudnn"),
    ("auto", "gpu", "float32", 0.0, "hash", True, "pallas"),     # cuDNN needs half precision
    ("xla", "gpu", "bfloat16", 0.1, "hash", True, "xla"),
    ("pallas", "cpu", "float32", 0.1, "hash", True, "pallas"),  # interpret mode
    ("cudnn", "gpu", "bfloat16", 0.1, "hash", False, "cudnn"),
    ("cudnn", "gpu", "bfloat16", 0.1, "jax", True, "cudnn"),    # cuDNN's own dropout
    ("pallas", "tpu", "bfloat16", 0.1, "hash", False, "pallas"),  # splash: eval only
])
def test_resolve(impl, plat, dtype, rate, rng, training, want):
    config = tiny_config(dtype=dtype, attention_probs_dropout_prob=rate, dropout_rng=rng)
    assert resolve(impl, plat, config, training) == want


@pytest.mark.parametrize("impl, plat, dtype, rate, rng, message", [
    ("cudnn", "cpu", "bfloat16", 0.0, "hash", "needs a GPU"),
    ("cudnn", "gpu", "float32", 0.0, "hash", "bfloat16 or float16"),
    ("pallas", "gpu", "bfloat16", 0.1, "jax", "dropout_rng=hash"),
    ("pallas", "tpu", "bfloat16", 0.1, "hash", "splash attention, which has no"),
    ("pallas", "mps", "bfloat16", 0.0, "hash", "not mps"),
    ("flash", "gpu", "bfloat16", 0.1, "hash", "expected one of"),
])
def test_explicit_choices_that_cannot_run_are_errors(impl, plat, dtype, rate, rng, message):
    config = tiny_config(dtype=dtype, attention_probs_dropout_prob=rate, dropout_rng=rng)
    with pytest.raises(AttentionConfigError, match=message):
        resolve(impl, plat, config, True)


def _outputs_and_grads(config, params, deterministic):
    ids, mask, types = random_batch(config)
    mask = mask.at[2].set(0)  # an all-padding eval filler row: no real key at all
    model = BertForPreTraining(config)

    def loss(p):
        mlm, nsp = model.apply({"params": p}, ids, mask, types, masked_lm_positions=POSITIONS,
                               deterministic=deterministic,
                               rngs=None if deterministic else {"dropout": jax.random.PRNGKey(5)})
        return jnp.sum(jnp.sin(mlm)) + jnp.sum(nsp ** 2), (mlm, nsp)

    (_, outputs), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return outputs, grads


def _params(config):
    ids = random_batch(config)[0]
    return flax.linen.meta.unbox(BertForPreTraining(config).init(
        jax.random.PRNGKey(1), ids, masked_lm_positions=POSITIONS)["params"])


def _assert_close(got, want, rtol=1e-5):
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got),
                            jax.tree_util.tree_leaves(want)):
        atol = 1e-6 * max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, atol=atol, rtol=rtol, err_msg=jax.tree_util.keystr(path))


def test_fused_qkv_has_the_same_parameters_and_results():
    config = tiny_config(attention_probs_dropout_prob=0.2)
    fused = config.replace(fused_qkv=True)
    params = _params(config)
    fused_params = _params(fused)
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(fused_params)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(fused_params)):
        np.testing.assert_array_equal(a, b)  # same names, shapes and initial values
    want = _outputs_and_grads(config, params, deterministic=False)
    got = _outputs_and_grads(fused, params, deterministic=False)
    _assert_close(got, want)


# (rate, deterministic): no dropout configured; training with dropout; evaluation of a model
# configured with dropout (the kernel must then run without it).
@pytest.mark.parametrize("rate, deterministic", [(0.0, True), (0.3, False), (0.3, True)])
def test_pallas_path_equals_xla_through_the_model(rate, deterministic):
    config = tiny_config(attention_probs_dropout_prob=rate)
    params = _params(config)
    want = _outputs_and_grads(config, params, deterministic=deterministic)
    got = _outputs_and_grads(config.replace(attention="pallas"), params,
                             deterministic=deterministic)
    _assert_close(got, want)


# Runs in a subprocess with 4 CPU devices: the model's outputs and parameter gradients with
# attention=pallas (dropout on) under a (data=2, fsdp=1, tensor=2) mesh, against
# attention=xla on one device. Prints the largest relative differences.
_MESH_WORKER = r"""
import json, sys
import flax, jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, sys.argv[1])
from bert_jax import sharding as sharding_lib
from bert_jax.models import BertForPreTraining
from bert_jax.train.state import mesh_context
from tests.models.helpers import random_batch, tiny_config
from tests.models.kernels.test_attention import POSITIONS

config = tiny_config(attention_probs_dropout_prob=0.3, num_attention_heads=4)
ids, mask, types = random_batch(config)
ids, mask, types = [jnp.concatenate([a, a[:1]]) for a in (ids, mask, types)]  # batch 4
positions = jnp.concatenate([POSITIONS, POSITIONS[:1]])
params = flax.linen.meta.unbox(BertForPreTraining(config).init(
    jax.random.PRNGKey(1), ids, masked_lm_positions=positions)["params"])

def run(cfg):
    model = BertForPreTraining(cfg)
    def loss(p):
        mlm, nsp = model.apply({"params": p}, ids, mask, types, masked_lm_positions=positions,
                               deterministic=False, rngs={"dropout": jax.random.PRNGKey(5)})
        return jnp.sum(jnp.sin(mlm)) + jnp.sum(nsp ** 2), mlm
    (_, mlm), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return [np.asarray(mlm)] + [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)]

want = run(config)
mesh_config = dict(data=2, fsdp=1, tensor=2)
import ml_collections
mesh = sharding_lib.make_mesh(ml_collections.ConfigDict(mesh_config))
with mesh_context(mesh, sharding_lib.DEFAULT_RULES):
    got = run(config.replace(attention="pallas"))
err = max(float(np.max(np.abs(g - w)) / max(1.0, float(np.max(np.abs(w)))))
          for g, w in zip(got, want))
print(json.dumps({"devices": jax.device_count(), "max_err": err}))
"""


def test_pallas_path_on_a_mesh_equals_one_device_xla():
    result = run_mesh_worker(_MESH_WORKER, REPO)
    # The same dropout masks on every shard (offsets), float32 rounding only.
    assert result["max_err"] < 1e-5, result


@pytest.mark.parametrize("length", [128, 100])
def test_tpu_splash_path_equals_xla_in_interpret_mode(length):
    from bert_jax.models.kernels.attention import splash_tpu
    from bert_jax.models.kernels.attention import xla as xla_attention

    b, h, d = 3, 2, 8
    q, k, v = (jax.random.normal(r, (b, length, h, d)) for r in jax.random.split(
        jax.random.PRNGKey(0), 3))
    lengths = jnp.array([length, length - 29, 7])
    mask = jnp.arange(length)[None] < lengths[:, None]
    want, want_vjp = jax.vjp(lambda *a: xla_attention.attention(*a, mask[:, None, :]), q, k, v)
    got, got_vjp = jax.vjp(lambda *a: splash_tpu.attention(*a, mask, interpret=True), q, k, v)
    cot = jax.random.normal(jax.random.PRNGKey(5), want.shape)
    _assert_close((got,) + got_vjp(cot), (want,) + want_vjp(cot))
    # A row with no real key (eval filler) stays finite, gradients included.
    empty = mask.at[2].set(False)
    out, vjp = jax.vjp(lambda *a: splash_tpu.attention(*a, empty, interpret=True), q, k, v)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in (out,) + vjp(cot))


@pytest.mark.parametrize("fused_qkv", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_pallas_path_adds_the_projection_biases_in_the_kernel(fused_qkv):
    # The Pallas kernel takes the projections before their biases and adds them itself:
    # through the model (random biases, dropout on) the outputs and every gradient, the
    # biases' included, are the XLA path's, where the projections add them.
    config = tiny_config(attention_probs_dropout_prob=0.3, fused_qkv=fused_qkv)
    params = _params(config)
    keys = iter(jax.random.split(jax.random.PRNGKey(3), 8))
    for layer in ("layer_0", "layer_1"):
        attn = params["bert"]["encoder"][layer]["attention"]
        for name in ("query", "key", "value"):
            b = attn[name]["bias"]
            attn[name]["bias"] = jax.random.normal(next(keys), b.shape, b.dtype)
    want = _outputs_and_grads(config, params, deterministic=False)
    got = _outputs_and_grads(config.replace(attention="pallas"), params, deterministic=False)
    _assert_close(got, want)
    bias_grad = got[1]["bert"]["encoder"]["layer_0"]["attention"]["query"]["bias"]
    assert float(jnp.abs(bias_grad).max()) > 1e-3


def test_qkv_products_input_gradient_is_one_product():
    """attention.qkv_products: the three projections' products, and gradients equal to
    jax's for three separate products (the input's: one product over the stacked dQ, dK,
    dV, to float32 summation order)."""
    r = jax.random.split(jax.random.PRNGKey(2), 8)
    x = jax.random.normal(r[0], (2, 8, 16))
    ws = [jax.random.normal(r[i], (16, 2, 4)) for i in (1, 2, 3)]
    cots = [jax.random.normal(r[i], (2, 8, 2, 4)) for i in (4, 5, 6)]

    def plain(x, *ws):
        return tuple(jnp.einsum("ble,ehd->blhd", x, w) for w in ws)

    got, vjp = jax.vjp(qkv_products, x, *ws)
    want, vjp_want = jax.vjp(plain, x, *ws)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
    for g, w in zip(vjp(tuple(cots)), vjp_want(tuple(cots))):
        assert float(jnp.max(jnp.abs(w))) > 1.0
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    jaxpr = str(jax.make_jaxpr(lambda *a: vjp(tuple(a)))(*cots))
    assert jaxpr.count("dot_general") == 2  # dX and the stacked kernels' gradient
