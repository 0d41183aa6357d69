"""models/kernels/gelu.py: the FFN's bias + exact GELU whose backward pass is one Pallas kernel
(run here in interpret mode) against jax's own backward pass of the same expression; its
float32 erf against the float64 one; the model's choice of path; a mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

from bert_jax.models.config import BertConfig, ConfigError
from bert_jax.models.kernels import gelu as gelu_kernel
from tests.conftest import REPO
from tests.models.helpers import (pretraining_loss_and_grads, pretraining_params,
                                   random_batch, run_mesh_worker, tiny_config)


def test_erf_and_gelu_derivative_are_float32_accurate():
    x = np.linspace(-9, 9, 360_001, dtype=np.float32)
    erf = np.asarray(gelu_kernel.erf_f32(jnp.asarray(x)), np.float64)
    exact = scipy.special.erf(x.astype(np.float64))
    # lax.erf's own float32 error on this grid is 5.0e-7 (XLA:CPU, the same rational form).
    assert np.max(np.abs(erf - exact)) < 6e-7
    assert np.max(np.abs(np.asarray(jax.lax.erf(jnp.asarray(x)), np.float64) - exact)) < 6e-7
    x64 = x.astype(np.float64)
    grad_exact = 0.5 * (1 + scipy.special.erf(x64 / np.sqrt(2))) + x64 * np.exp(
        -0.5 * x64 ** 2) / np.sqrt(2 * np.pi)
    grad = np.asarray(gelu_kernel.gelu_grad_f32(jnp.asarray(x)), np.float64)
    assert np.max(np.abs(grad - grad_exact)) < 1e-6


def _inputs(dtype, rows=256, width=96, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    p = (2 * jax.random.normal(k[0], (rows, width))).astype(dtype)
    bias = jax.random.normal(k[1], (width,), jnp.float32)
    g = jax.random.normal(k[2], (rows, width)).astype(dtype)
    return p, bias, g


def test_kernel_equals_jaxs_backward_pass_bf16():
    p, bias, g = _inputs(jnp.bfloat16)
    assert gelu_kernel.blocks(*p.shape) == (128, 32)  # two row blocks, three column blocks
    dh, db = gelu_kernel.gelu_backward(p, bias, g, interpret=True)
    _, vjp = jax.vjp(gelu_kernel.reference, p, bias)
    want_dh, want_db = vjp(g)
    assert dh.dtype == jnp.bfloat16 and db.dtype == jnp.float32
    got, want = np.asarray(dh, np.float32), np.asarray(want_dh, np.float32)
    # The same float32 value rounded to bf16, up to erf's last float32 bits: at most one
    # bf16 ulp apart, and equal almost everywhere. Below x = -5, Phi(x) + x phi(x) cancels
    # to under 1e-6 in float32 with either erf (both 5e-7 from the exact one): there the
    # two agree to 2e-6 absolute, not to an ulp.
    ulp = np.spacing(np.abs(want).astype(np.float32)) * 2 ** 16  # bf16 ulp (8-bit mantissa)
    assert np.all(np.abs(got - want) <= ulp + 2e-6)
    assert np.mean(got != want) < 0.03
    # The bias gradient: the float32 sum of dh as rounded (jax's transpose of the casts).
    np.testing.assert_allclose(np.asarray(db), np.asarray(want_db), rtol=2e-5, atol=1e-4)
    own = np.sum(got.astype(np.float64), axis=0)  # from the kernel's own dh
    np.testing.assert_allclose(np.asarray(db), own, rtol=1e-5, atol=1e-5)


def test_kernel_equals_jaxs_backward_pass_float32():
    p, bias, g = _inputs(jnp.float32)
    dh, db = gelu_kernel.gelu_backward(p, bias, g, interpret=True)
    _, vjp = jax.vjp(gelu_kernel.reference, p, bias)
    want_dh, want_db = vjp(g)
    np.testing.assert_allclose(np.asarray(dh), np.asarray(want_dh), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(np.asarray(db), np.asarray(want_db), rtol=2e-6, atol=2e-5)


def test_bias_gelu_forward_is_the_expression_and_grads_go_through_the_kernel():
    p, bias, g = _inputs(jnp.bfloat16, rows=64, width=48)
    p3 = p.reshape(4, 16, 48)  # [batch, length, width] as the FFN has it
    out = gelu_kernel.bias_gelu(p3, bias, interpret=True)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(gelu_kernel.reference(p3, bias)))
    jaxpr = str(jax.make_jaxpr(jax.grad(
        lambda p, b: jnp.sum(gelu_kernel.bias_gelu(p, b, interpret=True).astype(jnp.float32)),
        argnums=(0, 1)))(p3, bias))
    assert "gelu_backward" in jaxpr
    got = jax.vjp(lambda p, b: gelu_kernel.bias_gelu(p, b, interpret=True), p3, bias)[1](
        g.reshape(4, 16, 48))
    want = jax.vjp(gelu_kernel.reference, p3, bias)[1](g.reshape(4, 16, 48))
    assert got[0].shape == p3.shape and got[1].shape == bias.shape
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=2e-5, atol=1e-4)


def test_gelu_matmul_recomputes_the_output_and_equals_jaxs_backward_pass():
    """gelu_matmul = bias_gelu(p, b) @ w, for a backward pass under remat: its kernel also
    writes the GELU's output again, for w's gradient."""
    p, bias, _ = _inputs(jnp.bfloat16, rows=128, width=48)
    p3 = p.reshape(8, 16, 48)
    w = (0.2 * jax.random.normal(jax.random.PRNGKey(7), (48, 24))).astype(jnp.bfloat16)
    g = jax.random.normal(jax.random.PRNGKey(8), (8, 16, 24)).astype(jnp.bfloat16)
    y, dh, db = gelu_kernel.gelu_backward(p, bias, g.reshape(128, 24) @ w.T, with_output=True,
                                       interpret=True)
    want_y = np.asarray(gelu_kernel.reference(p, bias), np.float32)
    ulp = np.spacing(np.abs(want_y)) * 2 ** 16
    assert np.all(np.abs(np.asarray(y, np.float32) - want_y) <= ulp + 1e-6)
    out = gelu_kernel.gelu_matmul(p3, bias, w, interpret=True)
    np.testing.assert_array_equal(np.asarray(out),
                                  np.asarray(gelu_kernel.matmul_reference(p3, bias, w)))
    got = jax.vjp(lambda *a: gelu_kernel.gelu_matmul(*a, interpret=True), p3, bias, w)[1](g)
    want = jax.vjp(gelu_kernel.matmul_reference, p3, bias, w)[1](g)
    assert [x.dtype for x in got] == [jnp.bfloat16, jnp.float32, jnp.bfloat16]
    for a, b, tol in zip(got, want, (2e-2, 1e-2, 1e-2)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert a.shape == b.shape
        assert np.max(np.abs(a - b)) <= tol * np.max(np.abs(b)), (np.max(np.abs(a - b)),)


def test_shapes_that_do_not_tile_keep_the_plain_expression():
    assert gelu_kernel.blocks(10, 64) is None and gelu_kernel.blocks(64, 37) is None
    p, bias, _ = _inputs(jnp.bfloat16, rows=10, width=37)
    jaxpr = str(jax.make_jaxpr(jax.grad(
        lambda p: jnp.sum(gelu_kernel.bias_gelu(p, bias).astype(jnp.float32))))(p))
    assert "pallas" not in jaxpr


def test_auto_takes_a_kernel_only_on_gpu_in_half_precision():
    assert gelu_kernel.path("auto", "gpu", jnp.bfloat16, "gelu") == "gelu"
    assert gelu_kernel.path("auto", "gpu", jnp.float16, "gelu") == "gelu"
    assert gelu_kernel.path("auto", "gpu", jnp.float32, "gelu") is None
    assert gelu_kernel.path("auto", "cpu", jnp.bfloat16, "gelu") is None
    assert gelu_kernel.path("auto", "tpu", jnp.bfloat16, "gelu") is None
    assert gelu_kernel.path("auto", "gpu", jnp.bfloat16, "gelu_new") is None  # tanh form: XLA
    assert gelu_kernel.path("xla", "gpu", jnp.bfloat16, "gelu") is None
    # Under remat the backward pass needs the GELU's output again: the kernel with the
    # second product, which recomputes it.
    assert gelu_kernel.path("auto", "gpu", jnp.bfloat16, "gelu", "minimal_ffn") == "gelu_matmul"
    assert gelu_kernel.path("pallas", "cpu", jnp.float32, "gelu") == "gelu"
    assert gelu_kernel.path("pallas", "cpu", jnp.float32, "gelu", "full") == "gelu_matmul"
    with pytest.raises(ConfigError, match="gelu_backward='fast'.*'auto', 'xla', 'pallas'"):
        BertConfig(gelu_backward="fast")


def model_grads(config, params, batch):
    return pretraining_loss_and_grads(config, params, batch)[1]


def test_model_gradients_with_the_kernel_equal_xlas():
    """BERT (post-LN, dense GELU FFN), bfloat16 compute, CPU: gelu_backward=pallas (the
    kernel in interpret mode) against xla. Every gradient to bf16 rounding; the FFN input
    bias, which the kernel sums, to float32 summation order of values equal up to one ulp."""
    config = tiny_config(intermediate_size=64, dtype="bfloat16", hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)
    batch = random_batch(config, batch=3, length=16)
    params = pretraining_params(config, batch[0])
    # float32 CPU "auto": the model's jaxpr has no kernel (the float32 step is unchanged)
    jaxpr = str(jax.make_jaxpr(lambda p: model_grads(tiny_config(intermediate_size=64),
                                                      p, batch))(params))
    assert "gelu_backward" not in jaxpr
    for remat in ("none", "minimal_ffn"):  # bias_gelu; gelu_matmul (the remat path)
        cfg = config.replace(remat=remat)
        want = model_grads(cfg.replace(gelu_backward="xla"), params, batch)
        kernel = str(jax.make_jaxpr(lambda p: model_grads(
            cfg.replace(gelu_backward="pallas"), p, batch))(params))
        assert kernel.count("gelu_backward") >= 2, remat  # one per layer
        got = model_grads(cfg.replace(gelu_backward="pallas"), params, batch)
        flat_w = jax.tree_util.tree_leaves_with_path(want)
        flat_g = jax.tree_util.tree_leaves(got)
        for (path, w), g in zip(flat_w, flat_g):
            w, g = np.asarray(w, np.float32), np.asarray(g, np.float32)
            scale = max(float(np.max(np.abs(w))), 1e-6)
            assert float(np.max(np.abs(g - w))) / scale < 2e-2, (remat, jax.tree_util.keystr(path))
        bias_w = want["bert"]["encoder"]["layer_0"]["intermediate"]["bias"]
        bias_g = got["bert"]["encoder"]["layer_0"]["intermediate"]["bias"]
        np.testing.assert_allclose(np.asarray(bias_g), np.asarray(bias_w), rtol=0.05,
                                   atol=0.02 * float(np.max(np.abs(bias_w))))


_MESH_WORKER = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np, ml_collections
sys.path.insert(0, sys.argv[1])
from bert_jax import sharding as sharding_lib
from bert_jax.train.state import mesh_context
from tests.models.helpers import pretraining_params, random_batch, tiny_config
from tests.models.kernels.test_gelu import model_grads

config = tiny_config(intermediate_size=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
ids, mask, types = random_batch(config, batch=3, length=16)
batch = [jnp.concatenate([a, a[:1]]) for a in (ids, mask, types)]  # 4 examples
params = pretraining_params(config, batch[0])
want = jax.tree_util.tree_leaves(model_grads(config.replace(gelu_backward="xla"), params,
                                              batch))
mesh = sharding_lib.make_mesh(ml_collections.ConfigDict(dict(data=2, fsdp=1, tensor=2)))
result = {"devices": jax.device_count()}
for remat in ("none", "minimal_ffn"):  # bias_gelu, gelu_matmul
    with mesh_context(mesh, sharding_lib.DEFAULT_RULES):
        cfg = config.replace(gelu_backward="pallas", remat=remat)
        jaxpr = str(jax.make_jaxpr(lambda p: model_grads(cfg, p, batch))(params))
        got = jax.tree_util.tree_leaves(model_grads(cfg, params, batch))
    err = max(float(np.max(np.abs(np.asarray(g) - np.asarray(w)))
                    / max(1.0, float(np.max(np.abs(np.asarray(w)))))) for g, w in zip(got, want))
    result[remat] = {"max_err": err, "shard_map": "shard_map" in jaxpr,
                     "kernel": "gelu_backward" in jaxpr}
print(json.dumps(result))
"""


def test_kernel_on_a_mesh_equals_one_device_xla():
    """float32, 2 x 2 mesh (data, tensor), with and without remat: the kernel runs per
    shard (rows over data, FFN columns over tensor) and the bias gradient is summed over the
    data shards."""
    result = run_mesh_worker(_MESH_WORKER, REPO)
    for remat in ("none", "minimal_ffn"):
        r = result[remat]
        assert r["shard_map"] and r["kernel"], result
        assert r["max_err"] < 1e-5, result  # erf's float32 approximations only
