"""model.scan_unroll: how the scanned layer stack runs (a loop, k layers per iteration, or no
loop). It changes execution only: the params' tree and the float32 results are the same."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import BertForPreTraining, BertModel
from bert_jax.models.config import ConfigError
from tests.models.helpers import random_batch, tiny_config

LAYERS = 3  # odd: scan_unroll=2 runs a loop step of two layers, then the third


@pytest.mark.parametrize("value", [-1, 1.0, True, "-1", "two", None])
def test_scan_unroll_is_an_integer_at_least_0_or_auto(value):
    with pytest.raises(ConfigError, match=r"^BertConfig\.scan_unroll must be an integer >= 0 "
                                          r"\(layers per iteration of the scanned stack; 0: "
                                          r"all unrolled\) or 'auto' \(1 on TPU, 0 "
                                          r"elsewhere\), got "):
        tiny_config(scan_layers=True, scan_unroll=value)


def test_auto_keeps_the_loop_on_tpu_only_and_a_string_number_is_a_number():
    auto = tiny_config(scan_layers=True, scan_unroll="auto")
    assert [auto.unroll_for(p) for p in ("gpu", "tpu", "cpu")] == [0, 1, 0]
    # --config.model.scan_unroll=0 on a config that says "auto" (a string field)
    assert tiny_config(scan_unroll="0").scan_unroll == 0
    assert tiny_config(scan_unroll=2).unroll_for("gpu") == 2


def _loss_and_grads(config, params, ids, mask, types, positions):
    model = BertForPreTraining(config)

    def loss(p):
        mlm, nsp = model.apply({"params": p}, ids, mask, types, masked_lm_positions=positions,
                               deterministic=False, rngs={"dropout": jax.random.PRNGKey(7)})
        return jnp.sum(jnp.sin(mlm)) + jnp.sum(nsp ** 2)
    return jax.jit(jax.value_and_grad(loss))(params)


def _same_gradient(got, want):
    """Within 1e-6 of the tensor's largest entry (about 8 float32 ulps; measured up to 2e-7):
    XLA compiles the unrolled layers into other fusions than the loop body, which sums some
    float32 terms in another order (the loss too, by an ulp, with remat's barriers). A gradient that is zero by symmetry (the
    attention key bias: softmax ignores a per-query constant) is rounding noise in both."""
    got, want = np.asarray(got), np.asarray(want)
    scale = np.abs(want).max()
    if scale < 1e-6:
        assert np.abs(got).max() < 1e-6
        return
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * scale)


@pytest.mark.parametrize("arch, unrolls", [
    (dict(remat="minimal_ffn"), (0,)),
    # two layers a loop step and the third after the loop
    pytest.param(dict(remat="minimal_ffn"), (2,), marks=pytest.mark.slow),
    # layer 0 kept apart (no attention LayerNorm), layers 1 .. L-1 scanned
    pytest.param(dict(remat="none", pre_ln=True, layer0_attention_norm=False), (0,),
                 marks=pytest.mark.slow),
])
def test_unrolled_stack_has_the_loops_params_loss_and_gradients(arch, unrolls):
    rolled = tiny_config(num_hidden_layers=LAYERS, scan_layers=True, **arch)
    ids, mask, types = random_batch(rolled)
    positions = jnp.array([[1, 2, 5], [3, 4, 0], [1, 2, 3]])

    def init(config):
        return jax.jit(lambda: flax.linen.meta.unbox(BertForPreTraining(config).init(
            jax.random.PRNGKey(1), ids, masked_lm_positions=positions)["params"]))

    params = init(rolled)()
    loss, grads = _loss_and_grads(rolled, params, ids, mask, types, positions)
    assert float(loss) != 0.0
    for unroll in unrolls:
        config = rolled.replace(scan_unroll=unroll)
        # the same tree and shapes: params and checkpoints are interchangeable
        assert jax.eval_shape(init(config)) == jax.eval_shape(init(rolled))
        got_loss, got_grads = _loss_and_grads(config, params, ids, mask, types, positions)
        np.testing.assert_allclose(got_loss, loss, rtol=1e-6)  # an ulp or two, as below
        jax.tree_util.tree_map(_same_gradient, got_grads, grads)


def _while_loops(config) -> int:
    ids, mask, types = random_batch(config)
    model = BertModel(config)
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids)["params"])
    return jax.jit(lambda p: model.apply({"params": p}, ids, mask, types)[0]).lower(
        params).as_text().count("stablehlo.while")


def test_scan_unroll_0_leaves_no_loop_and_1_keeps_it():
    rolled = tiny_config(num_hidden_layers=LAYERS, scan_layers=True)
    assert _while_loops(rolled) == 1
    assert _while_loops(rolled.replace(scan_unroll=0)) == 0
    assert _while_loops(rolled.replace(scan_unroll="auto")) == 0  # CPU: unrolled
    # unscanned layers ignore it: a Python loop is unrolled already
    assert _while_loops(tiny_config(num_hidden_layers=LAYERS, scan_unroll=2)) == 0
