"""What each remat policy keeps for the backward pass (pinned per layer, any backend), and
that the named policies give the plain model's loss and gradients with dropout on."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals  # the public print_saved_residuals' data

from bert_jax.models import BertForPreTraining, BertModel
from tests.models.helpers import random_batch, tiny_config

LAYERS = 5  # differs from every batch / head size below, so [LAYERS, ...] picks the layers


def _stacked_residuals(config, batch, length):
    """{(dtype, shape[1:])} -> count of the residuals saved per scanned layer (those with a
    leading [layers] axis that are not parameters)."""
    ids, mask, types = random_batch(config, batch=batch, length=length)
    model = BertModel(config)
    params = flax.linen.meta.unbox(model.init(jax.random.PRNGKey(0), ids)["params"])

    def f(p):
        return model.apply({"params": p}, ids, mask, types, deterministic=False,
                           rngs={"dropout": jax.random.PRNGKey(3)})[0].sum()

    out = {}
    for aval, source in saved_residuals(f, params):
        if "from the argument" in source or aval.shape[:1] != (LAYERS,) or aval.ndim < 3:
            continue
        key = (str(aval.dtype), aval.shape[1:])
        out[key] = out.get(key, 0) + 1
    return out


@pytest.mark.parametrize("remat, ffn", [("minimal", False), ("minimal_ffn", True)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_minimal_policies_keep_exactly_the_named_values(remat, ffn, dtype):
    config = tiny_config(num_hidden_layers=LAYERS, remat=remat, scan_layers=True, dtype=dtype)
    b, n = 3, 16
    a, d, h, f = config.num_attention_heads, config.head_dim, config.hidden_size, config.intermediate_size
    want = {(dtype, (b, n, a, d)): 4,  # query, key, value, context
            (dtype, (b, n, h)): 3,     # the layer input, attention_residual, output_residual
            ("float32", (b, n, 1)): 6}  # norm_stats: mean, variance, 1/std of both norms
    if ffn:
        want[(dtype, (b, n, f))] = 1   # ffn_pre
        want[(dtype, (b, n, h))] += 1  # ffn_input
    assert _stacked_residuals(config, b, n) == want
    # In elements per token per layer: 7 H (+ F + H) and 6 float32 statistics. At BERT-Large
    # (H=1024, F=4096, L=128, bfloat16) that is 1.75 MiB (minimal) and 3 MiB (minimal_ffn)
    # per example per layer.


@pytest.mark.parametrize("remat", ["minimal", "minimal_ffn"])
def test_minimal_policies_keep_the_flash_kernels_output_and_lse_once(remat):
    # The Pallas kernel (CPU: interpret mode, only traced here) names its output "context"
    # and its float32 log-sum-exp "attention_lse": both kept, so its backward pass does not
    # run the forward kernel again, and the output once (not also as the layer's context).
    config = tiny_config(num_hidden_layers=LAYERS, remat=remat, scan_layers=True,
                         attention="pallas", dropout_rng="hash")
    b, n = 3, 16
    a, d, h, f = config.num_attention_heads, config.head_dim, config.hidden_size, config.intermediate_size
    want = {("float32", (b, n, a, d)): 4,  # query, key, value, context
            ("float32", (b, a, n)): 1,     # attention_lse
            ("float32", (b, n, h)): 3,     # the layer input, attention_residual, output_residual
            ("float32", (b, n, 1)): 6}     # norm_stats (attention_mask: loop-invariant)
    if remat == "minimal_ffn":
        want[("float32", (b, n, f))] = 1
        want[("float32", (b, n, h))] += 1
    assert _stacked_residuals(config, b, n) == want


def test_no_remat_keeps_probabilities_and_float32_copies():
    # The reference point the policies improve on: without remat the layer keeps the
    # [heads, q, k] probabilities (before and after dropout); hash dropout keeps no mask
    # (its gradient regenerates it from two seeds).
    config = tiny_config(num_hidden_layers=LAYERS, remat="none", scan_layers=True)
    kept = _stacked_residuals(config, 3, 16)
    assert kept[("float32", (3, config.num_attention_heads, 16, 16))] >= 2
    assert ("bool", (3, config.num_attention_heads, 16, 16)) not in kept
    assert sum(kept.values()) > 20


@pytest.mark.parametrize("remat", ["minimal", "minimal_ffn", "full"])
@pytest.mark.parametrize("scan", [False, True])
def test_policies_equal_no_remat_with_dropout(remat, scan):
    plain = tiny_config(num_hidden_layers=2, scan_layers=scan)
    ids, mask, types = random_batch(plain)
    positions = jnp.array([[1, 2, 5], [3, 4, 0], [1, 2, 3]])
    params = flax.linen.meta.unbox(BertForPreTraining(plain).init(
        jax.random.PRNGKey(1), ids, masked_lm_positions=positions)["params"])

    def run(config):
        model = BertForPreTraining(config)

        def loss(p):
            mlm, nsp = model.apply({"params": p}, ids, mask, types,
                                   masked_lm_positions=positions, deterministic=False,
                                   rngs={"dropout": jax.random.PRNGKey(7)})
            return jnp.sum(jnp.sin(mlm)) + jnp.sum(nsp ** 2)
        return jax.value_and_grad(loss)(params)

    want_loss, want_grads = run(plain)
    got_loss, got_grads = run(plain.replace(remat=remat))
    # The same ops recomputed from the same saved values and the same dropout keys: equal
    # to float32 rounding (XLA fuses the recomputation and, under nn.scan, orders some
    # reductions differently). The loss sums ~900 terms of size <= 1, so its rounding is
    # absolute: 1.5e-6 seen scanned.
    np.testing.assert_allclose(got_loss, want_loss, atol=1e-5, rtol=0)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got_grads),
                            jax.tree_util.tree_leaves(want_grads)):
        atol = 1e-6 * max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, atol=atol, rtol=1e-5, err_msg=jax.tree_util.keystr(path))


def _checkpoint_inputs(jaxpr):
    """The input avals of every remat (`checkpoint`) equation in `jaxpr` and its sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("checkpoint", "remat2"):  # jax.checkpoint's primitive
            found.append([v.aval for v in eqn.invars])
        for p in eqn.params.values():
            inner = getattr(p, "jaxpr", p)  # a ClosedJaxpr or a Jaxpr (scan, jit bodies)
            if hasattr(inner, "eqns"):
                found += _checkpoint_inputs(inner)
    return found


def _bf16_remat_grads(config, cast_outside=True, monkeypatch=None):
    from bert_jax.models import encoder
    if not cast_outside:
        monkeypatch.setattr(encoder, "_kernels_as", lambda dtype: lambda v: v)
    ids, mask, types = random_batch(config, batch=3, length=16)
    model = BertModel(config)
    params = flax.linen.meta.unbox(model.init(jax.random.PRNGKey(0), ids)["params"])

    def loss(p):
        out = model.apply({"params": p}, ids, mask, types, deterministic=False,
                          rngs={"dropout": jax.random.PRNGKey(3)})[0]
        return jnp.sum(jnp.sin(out.astype(jnp.float32)))
    return loss, params, jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("stack", [dict(scan_layers=True, scan_unroll=0),
                                   dict(scan_layers=False)])
def test_unrolled_remat_takes_its_weights_already_cast(monkeypatch, stack):
    # Straight-line layers under remat get barriers on every input of the recomputation:
    # the Dense weights reach them already in the compute dtype (cast once, in the forward
    # pass), not as float32 layer slices that the backward pass casts again. Biases and
    # LayerNorm params stay float32. Same loss and gradients as casting inside, bit for bit.
    config = tiny_config(num_hidden_layers=LAYERS, remat="minimal_ffn", dtype="bfloat16",
                         **stack)
    loss, params, (value, grads) = _bf16_remat_grads(config)
    h, f = config.hidden_size, config.intermediate_size
    a, d = config.num_attention_heads, config.head_dim
    kernel_shapes = {(h, f), (f, h), (h, a, d), (a, d, h)}
    inputs = _checkpoint_inputs(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
    assert len(inputs) == (1 if config.scan_layers else LAYERS)  # a scanned body is traced once
    for avals in inputs:
        weights = [str(x.dtype) for x in avals if x.shape in kernel_shapes]
        assert weights == ["bfloat16"] * 6, weights  # query, key, value, output x 2
        small = [str(x.dtype) for x in avals if x.shape in ((h,), (f,), (a, d))]
        assert small and set(small) == {"float32"}, small
    monkeypatch_value, monkeypatch_grads = _bf16_remat_grads(
        config, cast_outside=False, monkeypatch=monkeypatch)[2]
    assert float(value) == float(monkeypatch_value)
    jax.tree_util.tree_map(np.testing.assert_array_equal, grads, monkeypatch_grads)
