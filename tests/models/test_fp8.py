"""model.fp8 in the model (bert_jax/models/fp8.py): which products carry FP8 scaling state,
a dense product against the scaled FP8 product written out in numpy (ml_dtypes' float8),
and the state the backward pass hands back (the next amax histories and scales), the same
whichever path the layers take (scanned or not, remat, the CPU interpret-mode kernels).
The train step's use of it, checkpoints and the 300-step run: tests/train/test_fp8.py."""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from bert_jax.models import fp8 as fp8_lib
from bert_jax.models.bert import BertForPreTraining
from bert_jax.models.kernels import gelu as gelu_kernel
from bert_jax.models.layers import dense
from bert_jax.models.params import stack_layers, unstack_layers
from tests.models.helpers import random_batch, tiny_config

E4M3_MAX = 448.0  # float8_e4m3fn's largest finite value
STATE = {"input_amax_history", "input_scale", "kernel_amax_history", "kernel_scale",
         "output_grad_amax_history", "output_grad_scale"}
POSITIONS = jnp.array([[1, 2, 3]] * 3)


def _init(config, batch):
    init = jax.jit(lambda *b: BertForPreTraining(config).init(
        jax.random.PRNGKey(1), *b, masked_lm_positions=POSITIONS))
    return flax.linen.meta.unbox(init(*batch))


def _loss_and_grads(config, params, fp8, batch):
    """(loss, params' gradient, the FP8 state's gradient: its next value)."""
    ids, mask, types = batch
    model = BertForPreTraining(config)

    def loss(p, f):
        mlm, nsp = model.apply(fp8_lib.variables(p, f), ids, mask, types,
                               masked_lm_positions=POSITIONS)
        return jnp.sum(jnp.sin(mlm.astype(jnp.float32))) + jnp.sum(nsp.astype(jnp.float32) ** 2)

    value, (grads, state) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, fp8)
    return value, grads, state


def _ops(state) -> dict:
    """{path of the product's layer: its six state arrays} of an FP8 state tree."""
    flat = flax.traverse_util.flatten_dict(state)
    ops = {}
    for key, value in flat.items():
        assert key[-2] == "Fp8DirectDotGeneralOp_0", key
        ops.setdefault("/".join(key[:-2]), {})[key[-1]] = np.array(value)
    return ops


def test_the_encoder_products_carry_fp8_state_beside_unchanged_params():
    batch = random_batch(tiny_config())
    plain = _init(tiny_config(dtype="bfloat16"), batch)
    with_fp8 = _init(tiny_config(dtype="bfloat16", fp8=True), batch)
    assert fp8_lib.COLLECTION not in plain and set(with_fp8) == {"params", fp8_lib.COLLECTION}
    for a, b in zip(jax.tree_util.tree_leaves(plain["params"]),
                    jax.tree_util.tree_leaves(with_fp8["params"])):
        np.testing.assert_array_equal(a, b)  # same names, shapes and init draws
    ops = _ops(with_fp8[fp8_lib.COLLECTION])
    # Q, K, V and the attention output, the FFN's two: not the pooler nor the heads.
    assert sorted(ops) == sorted(
        f"bert/encoder/layer_{i}/{name}" for i in range(2)
        for name in ("attention/query", "attention/key", "attention/value",
                     "attention/output", "intermediate", "output"))
    for state in ops.values():
        assert set(state) == STATE
        assert state["input_amax_history"].shape == (fp8_lib.AMAX_HISTORY,) == (1024,)
        assert not state["input_amax_history"].any() and state["input_scale"].tolist() == [1.0]
    scanned = _init(tiny_config(dtype="bfloat16", fp8=True, scan_layers=True), batch)
    stacked = _ops(scanned[fp8_lib.COLLECTION])
    assert sorted(stacked) == sorted(k.replace("layer_0", "layers") for k in ops if "layer_0" in k)
    assert all(v["kernel_amax_history"].shape == (2, 1024) for v in stacked.values())


def _quantize(x, scale):
    """flax's quantize in numpy: x / scale in the compute dtype (bfloat16 here), clipped to
    the format's range, rounded to float8_e4m3fn."""
    q = np.clip(x / np.asarray(scale, x.dtype), -E4M3_MAX, E4M3_MAX)
    return q.astype(ml_dtypes.float8_e4m3fn)


def test_a_dense_product_is_the_delayed_scaled_fp8_product():
    """With amaxes a_x, a_w already in the histories, y = q(x / s_x) q(W / s_w) s_x s_w
    (+ bias in float32) with s = a / 448: written out with ml_dtypes' float8_e4m3fn. The
    histories come back with this call's amaxes (max |x|, max |W| in bfloat16)."""
    config = tiny_config(dtype="bfloat16", fp8=True)
    layer = dense(config, 24, ("embed", "mlp"), "ffn", fp8=True)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 32), jnp.float32) * 3
    variables = flax.linen.meta.unbox(jax.jit(layer.init)(jax.random.PRNGKey(1), x))
    params = jax.tree_util.tree_map(lambda a: a + 0.01, variables["params"])  # non-zero bias
    amax_x, amax_w = 7.5, 0.09  # the largest |x|, |W| of earlier steps
    state = _ops(variables[fp8_lib.COLLECTION])[""]
    state["input_amax_history"][3] = amax_x
    state["kernel_amax_history"][10] = amax_w
    fp8_state = {"Fp8DirectDotGeneralOp_0": {k: jnp.asarray(v) for k, v in state.items()}}

    def apply(p, f):
        return layer.apply(fp8_lib.variables(p, f), x)

    got = np.asarray(jax.jit(apply)(params, fp8_state).astype(jnp.float32))

    s_x, s_w = (np.float32(1) / (np.float32(E4M3_MAX) / np.float32(a)) for a in (amax_x, amax_w))
    bf16 = ml_dtypes.bfloat16
    xq = _quantize(np.asarray(x).astype(bf16), s_x).astype(np.float32)
    wq = _quantize(np.asarray(params["kernel"]).astype(bf16), s_w).astype(np.float32)
    product = (xq @ wq).astype(bf16)  # FP8 products, float32 sums, the compute dtype out
    scaled = (product * np.asarray(s_x * s_w, bf16)).astype(bf16)
    want = (scaled.astype(np.float32) + np.asarray(params["bias"])).astype(bf16)
    want = want.astype(np.float32)
    plain = (np.asarray(x).astype(bf16).astype(np.float32)
             @ np.asarray(params["kernel"]).astype(bf16).astype(np.float32)
             + np.asarray(params["bias"]))
    # Within one bfloat16 rounding of the output (XLA rounds the scaled product once, the
    # numpy chain twice); the bfloat16 product is 30x further (mean 3e-4 against 1e-2).
    np.testing.assert_allclose(got, want, rtol=2**-8, atol=2**-9)
    assert np.abs(got - want).mean() < np.abs(got - plain).mean() / 10

    grads = jax.jit(jax.grad(lambda p, f: jnp.sum(apply(p, f).astype(jnp.float32) ** 2),
                             argnums=1))(params, fp8_state)
    new = {k: np.asarray(v) for k, v in grads["Fp8DirectDotGeneralOp_0"].items()}
    assert new["input_amax_history"][0] == np.abs(np.asarray(x).astype(bf16)).max()
    assert new["kernel_amax_history"][0] == np.abs(
        np.asarray(params["kernel"]).astype(bf16)).max()
    assert amax_x in new["input_amax_history"] and amax_w in new["kernel_amax_history"]
    assert new["input_scale"] == s_x and new["kernel_scale"] == s_w
    # The output gradient's history had nothing: its scale stays 1, its amax goes in.
    assert new["output_grad_scale"] == 1.0 and new["output_grad_amax_history"][0] > 0


BASE = dict(dtype="bfloat16", fp8=True, attention_probs_dropout_prob=0.0,
            hidden_dropout_prob=0.0)
# Under remat and the kernels the bfloat16 activations round differently (this loss moves
# by 2.7% under remat=minimal_ffn without FP8 too): the kernels' amaxes are the same, the
# activations' and gradients' within a few percent.
REMAT = dict(scan_layers=True, remat="minimal_ffn")
KERNELS = dict(attention="pallas", residual_norm="pallas", gelu_backward="pallas")


@pytest.mark.parametrize("other", [
    REMAT,
    pytest.param(KERNELS, marks=pytest.mark.slow),  # interpret mode: minutes to compile
], ids=["scan_remat", "cpu_kernels"])
def test_every_layer_path_gives_the_same_fp8_state(other):
    """The FP8 state's next value from the plain model, from the scanned stack (exactly),
    and from `other`: the scanned stack under remat (nn.scan stacks the state, nn.remat
    and the bfloat16 weight cast pass it through), or the CPU interpret-mode kernels of
    attention, the residual + LayerNorm and the GELU (which take the projections' products
    before their biases: the same FP8 ops)."""
    batch = random_batch(tiny_config())
    plain = tiny_config(**BASE)
    params, fp8 = fp8_lib.split(_init(plain, batch))
    loss, grads, state = _loss_and_grads(plain, params, fp8, batch)
    ops = _ops(state)
    assert all(v["kernel_amax_history"][0] > 0 and v["output_grad_amax_history"][0] > 0
               for v in ops.values())

    scanned = tiny_config(**BASE, scan_layers=True)
    s_loss, _, s_state = _loss_and_grads(scanned, stack_layers(params, 2),
                                         stack_layers(fp8, 2), batch)
    assert s_loss == loss  # the same ops, one layer after the other
    for a, b in zip(jax.tree_util.tree_leaves(s_state),
                    jax.tree_util.tree_leaves(stack_layers(state, 2))):
        np.testing.assert_array_equal(a, b)

    config = tiny_config(**BASE, **other)
    o_params, o_fp8 = ((stack_layers(params, 2), stack_layers(fp8, 2))
                       if config.scan_layers else (params, fp8))
    o_loss, _, o_state = _loss_and_grads(config, o_params, o_fp8, batch)
    np.testing.assert_allclose(o_loss, loss, rtol=5e-2)
    o_ops = _ops(unstack_layers(o_state, 2) if config.scan_layers else o_state)
    assert sorted(o_ops) == sorted(ops)
    for name, got in o_ops.items():
        want = ops[name]
        np.testing.assert_array_equal(got["kernel_amax_history"], want["kernel_amax_history"],
                                      err_msg=name)
        for key in ("input_amax_history", "output_grad_amax_history"):
            np.testing.assert_allclose(got[key][0], want[key][0], rtol=5e-2,
                                       err_msg=f"{name} {key}")


def test_without_fp8_is_the_same_model_without_the_state():
    config = tiny_config(dtype="bfloat16", fp8=True)
    model = BertForPreTraining(config)
    plain = fp8_lib.without_fp8(model)
    assert plain.config == config.replace(fp8=False) and plain.nsp == model.nsp
    assert fp8_lib.without_fp8(plain) is plain
    with pytest.raises(Exception, match="_overwrite_with_gradient"):
        batch = random_batch(config)
        params = fp8_lib.split(_init(config, batch))[0]
        model.apply({"params": params}, *batch, masked_lm_positions=POSITIONS)


def test_fp8_products_stay_out_of_the_custom_backward_passes():
    """Under remat the GELU kernel's gelu_matmul computes the FFN's second product in its
    own backward pass (a bfloat16 product): with model.fp8 that product is an FP8 op, so the
    plain GELU kernel is taken instead."""
    args = ("auto", "gpu", jnp.bfloat16, "gelu", "minimal_ffn")
    assert gelu_kernel.path(*args) == "gelu_matmul"
    assert gelu_kernel.path(*args, fp8=True) == "gelu"
    assert gelu_kernel.path("auto", "gpu", jnp.bfloat16, "gelu", "none", fp8=True) == "gelu"
