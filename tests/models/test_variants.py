"""Numerical invariants of the model and its memory / compile-time variants."""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import (BertForMultipleChoice, BertForPreTraining, BertForQuestionAnswering,
                             BertForSequenceClassification, BertForTokenClassification, BertModel,
                             stack_layers, unstack_layers)
from bert_jax.models.params import layer_layout
from bert_jax.sharding import LOGICAL_AXES
from tests.models.helpers import random_batch, tiny_config

POSITIONS = jnp.array([[1, 2, 5], [3, 4, 0], [1, 2, 3]])


def _init(model, ids, **kw):
    return model.init(jax.random.PRNGKey(1), ids, **kw)["params"]


def test_padding_does_not_change_real_positions():
    config = tiny_config()
    ids, mask, types = random_batch(config, length=12)
    model = BertModel(config)
    params = _init(model, ids)
    seq, pooled = model.apply({"params": params}, ids, mask, types)
    pad = lambda a: jnp.pad(a, ((0, 0), (0, 9)))  # noqa: E731
    seq2, pooled2 = model.apply({"params": params}, pad(ids) + pad(1 - mask) * 7, pad(mask),
                                pad(types))
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(seq2)[:, :12][real], np.asarray(seq)[real], atol=1e-6)
    np.testing.assert_allclose(pooled2, pooled, atol=1e-6)


def _loss_and_grads(config, params, batch):
    ids, mask, types = batch
    model = BertForPreTraining(config)

    def loss_fn(p):
        mlm, nsp = model.apply({"params": p}, ids, mask, types, masked_lm_positions=POSITIONS)
        return jnp.sum(jnp.sin(mlm)) + jnp.sum(nsp ** 2), (mlm, nsp)

    (_, outputs), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return outputs, grads


@functools.lru_cache(maxsize=None)
def _plain_reference():
    plain = tiny_config(num_hidden_layers=3)
    batch = random_batch(plain)
    params = _init(BertForPreTraining(plain), batch[0], masked_lm_positions=POSITIONS)
    params = flax.linen.meta.unbox(params)
    return plain, batch, params, _loss_and_grads(plain, params, batch)


@pytest.mark.parametrize("remat, scan", [
    ("full", False), ("dots_saveable", False), ("none", True), ("full", True)])
def test_remat_and_scan_equal_plain(remat, scan):
    plain, batch, params, (want_outputs, want_grads) = _plain_reference()

    variant = plain.replace(remat=remat, scan_layers=scan)
    vparams = stack_layers(params, 3) if scan else params
    outputs, grads = _loss_and_grads(variant, vparams, batch)
    if scan:
        grads = unstack_layers(grads, 3)
    for got, want in zip(outputs, want_outputs):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-6)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(grads),
                            jax.tree_util.tree_leaves(want_grads)):
        # remat recomputes the same ops: identical to float32 rounding. nn.scan compiles the
        # layer as a loop body, and XLA then orders some reductions differently: we allow
        # a few float32 ulps of the largest gradient entry (2e-6 seen on entries up to 8).
        atol = 1e-6 * max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, atol=atol, rtol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_scanned_init_has_stacked_layout():
    config = tiny_config(num_hidden_layers=3, scan_layers=True)
    params = flax.linen.meta.unbox(_init(BertModel(config), random_batch(config)[0]))
    assert set(params["encoder"]) == {"layers"}
    assert params["encoder"]["layers"]["intermediate"]["kernel"].shape == (3, 32, 37)
    # Independent initial weights per layer (split rngs), as the unscanned model.
    k = params["encoder"]["layers"]["intermediate"]["kernel"]
    assert not np.allclose(k[0], k[1])


def test_layer_layout_tells_stacked_from_per_layer_keys():
    config = tiny_config(num_hidden_layers=2)
    ids = random_batch(config)[0]
    keys = lambda tree: list(flax.traverse_util.flatten_dict(tree))  # noqa: E731
    per_layer = flax.linen.meta.unbox(_init(BertModel(config), ids))
    stacked = flax.linen.meta.unbox(_init(BertModel(config.replace(scan_layers=True)), ids))
    assert layer_layout(keys(per_layer)) is False
    assert layer_layout(keys(stacked)) is True
    assert layer_layout(keys(stack_layers(per_layer, 2))) is True
    # "/"-joined names (a checkpoint's index), under a head's prefix too; no encoder: None
    assert layer_layout(["bert/encoder/layer_1/output/dense/kernel"]) is False
    assert layer_layout(["bert/encoder/layers/output/dense/kernel"]) is True
    assert layer_layout(["bert/embeddings/word_embeddings/embedding"]) is None


def test_bfloat16_compute_close_to_float32():
    config = tiny_config()
    ids, mask, types = random_batch(config)
    params = _init(BertForPreTraining(config), ids, masked_lm_positions=POSITIONS)
    out32 = BertForPreTraining(config).apply({"params": params}, ids, mask, types,
                                             masked_lm_positions=POSITIONS)
    bf16 = config.replace(dtype="bfloat16")
    out16 = BertForPreTraining(bf16).apply({"params": params}, ids, mask, types,
                                           masked_lm_positions=POSITIONS)
    assert out16[0].dtype == jnp.bfloat16
    for a, b in zip(out16, out32):
        diff = np.abs(np.asarray(a, np.float32) - np.asarray(b)).max()
        assert diff <= 2e-2, diff
    # Parameters stay float32 under bf16 compute.
    assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(
        flax.linen.meta.unbox(_init(BertForPreTraining(bf16), ids, masked_lm_positions=POSITIONS))))


def test_every_parameter_has_logical_axis_names():
    config = tiny_config(num_hidden_layers=2)
    ids = random_batch(config)[0]
    models = [
        (BertForPreTraining(config), dict(masked_lm_positions=POSITIONS)),
        (BertForPreTraining(config.replace(scan_layers=True, pre_ln=True)),
         dict(masked_lm_positions=POSITIONS)),
        (BertForSequenceClassification(config, 3), {}),
        (BertForTokenClassification(config, 5), {}),
        (BertForQuestionAnswering(config), {}),
    ]
    for model, kw in models:
        boxed = jax.eval_shape(lambda m=model, kw=kw: m.init(jax.random.PRNGKey(0), ids, **kw))
        leaves = jax.tree_util.tree_leaves_with_path(
            boxed["params"], is_leaf=lambda x: isinstance(x, flax.linen.Partitioned))
        assert leaves
        for path, leaf in leaves:
            where = jax.tree_util.keystr(path)
            assert isinstance(leaf, flax.linen.Partitioned), f"{where} has no axis names"
            assert len(leaf.names) == leaf.value.ndim, where
            assert all(n in LOGICAL_AXES for n in leaf.names), (where, leaf.names)


def test_init_is_truncated_normal_with_initializer_range():
    config = tiny_config(vocab_size=4000, hidden_size=64, initializer_range=0.05)
    params = flax.linen.meta.unbox(_init(BertModel(config), random_batch(config)[0]))
    table = np.asarray(params["embeddings"]["word_embeddings"]["embedding"])
    assert np.abs(table).max() <= 2 * 0.05 + 1e-7  # truncated at 2 std, as TF's initializer
    # std of N(0, s) truncated at +-2s is 0.8796 s.
    np.testing.assert_allclose(table.std(), 0.8796 * 0.05, rtol=0.02)
    np.testing.assert_array_equal(params["encoder"]["layer_0"]["attention_norm"]["scale"], 1.0)
    np.testing.assert_array_equal(params["encoder"]["layer_0"]["intermediate"]["bias"], 0.0)


def test_dropout_only_when_not_deterministic():
    config = tiny_config()
    ids, mask, types = random_batch(config)
    model = BertModel(config)
    params = _init(model, ids)
    a, _ = model.apply({"params": params}, ids, mask, types)
    b, _ = model.apply({"params": params}, ids, mask, types, deterministic=False,
                       rngs={"dropout": jax.random.PRNGKey(3)})
    c, _ = model.apply({"params": params}, ids, mask, types, deterministic=False,
                       rngs={"dropout": jax.random.PRNGKey(3)})
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(b, c)


def test_pre_ln_differs_and_has_final_norm():
    config = tiny_config(pre_ln=True)
    ids, mask, types = random_batch(config)
    params = _init(BertModel(config), ids)
    assert "final_norm" in params["encoder"]
    seq, _ = BertModel(config).apply({"params": params}, ids, mask, types)
    post = {k: v for k, v in params.items()}
    post["encoder"] = {k: v for k, v in params["encoder"].items() if k != "final_norm"}
    seq_post, _ = BertModel(config.replace(pre_ln=False)).apply({"params": post}, ids, mask, types)
    assert np.isfinite(seq).all() and not np.allclose(seq, seq_post)


def test_task_heads():
    config = tiny_config()
    ids, mask, types = random_batch(config)
    rng = jax.random.PRNGKey(0)

    m = BertForSequenceClassification(config, 3)
    out = m.apply({"params": m.init(rng, ids)["params"]}, ids, mask, types)
    assert out.shape == (3, 3)

    m = BertForTokenClassification(config, 5)
    assert m.apply({"params": m.init(rng, ids)["params"]}, ids, mask, types).shape == (3, 16, 5)

    m = BertForQuestionAnswering(config)
    start, end = m.apply({"params": m.init(rng, ids)["params"]}, ids, mask, types)
    assert start.shape == end.shape == (3, 16)

    # Multiple choice scores each choice independently: equal to the pooled classifier on
    # the flattened [batch * choices] inputs.
    mc = BertForMultipleChoice(config)
    choices = jnp.stack([ids, jnp.roll(ids, 1, axis=0)], axis=1)  # [3, 2, 16]
    cmask = jnp.stack([mask, jnp.roll(mask, 1, axis=0)], axis=1)
    ctype = jnp.stack([types, jnp.roll(types, 1, axis=0)], axis=1)
    p = mc.init(rng, choices)["params"]
    scores = mc.apply({"params": p}, choices, cmask, ctype)
    assert scores.shape == (3, 2)
    single = BertForSequenceClassification(config, 1).apply(
        {"params": p}, choices.reshape(6, 16), cmask.reshape(6, 16), ctype.reshape(6, 16))
    np.testing.assert_allclose(scores.reshape(6), single[:, 0], atol=1e-6)


def test_too_long_sequence_is_an_error():
    config = tiny_config(max_position_embeddings=8)
    ids = jnp.zeros((1, 9), jnp.int32)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings=8"):
        BertModel(config).init(jax.random.PRNGKey(0), ids)
