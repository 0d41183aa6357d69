"""Sliding-window (local) layers: the XLA path's band mask, and the window handed to the
fused paths (`kernels.attention.fused(..., window=)`) on local layers only, scanned or not.
Parity with transformers' ModernBERT: tests/convert/test_hf_modernbert.py."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import BertConfig, BertModel
from bert_jax.models.attention import band_mask, rotary
from bert_jax.models.kernels import attention as attention_kernels
from bert_jax.models.kernels.attention import xla as xla_attention
from bert_jax.models.params import stack_layers

CONFIG = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                    intermediate_size=48, max_position_embeddings=64, type_vocab_size=0,
                    position_embedding="rotary", ffn_type="geglu", pre_ln=True,
                    layer0_attention_norm=False, pooler=False, use_bias=False,
                    norm_bias=False, global_attn_every_n_layers=2, local_attention=6,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def test_band_mask_is_the_modernbert_window():
    i, j = np.meshgrid(np.arange(7), np.arange(7), indexing="ij")
    np.testing.assert_array_equal(band_mask(7, 2)[0], np.abs(i - j) <= 2)
    # A traced flag: False lifts the band (a global layer in a scanned stack).
    lifted = jax.jit(lambda f: band_mask(7, 2, f))(jnp.asarray(False))
    assert bool(lifted.all())


def test_rotary_keeps_norms_and_relative_scores():
    """A rotation per position: norms kept; q.k depends on the position difference only."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)

    def score(pq, pk):
        rq = rotary(q, jnp.array([[pq]]), 10_000.0)
        rk = rotary(k, jnp.array([[pk]]), 10_000.0)
        return float(jnp.sum(rq * rk))

    np.testing.assert_allclose(jnp.linalg.norm(rotary(q, jnp.array([[5]]), 10_000.0)),
                               jnp.linalg.norm(q), rtol=1e-6)
    assert score(3, 1) == pytest.approx(score(10, 8), rel=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), rel=1e-3)


@pytest.mark.parametrize("scan", [False, True])
def test_fused_paths_get_the_window_on_local_layers_only(scan, monkeypatch):
    """With a fused path standing in for the kernel (the XLA attention with the window it
    is given), the model equals the XLA path: local layers pass window=3, global layers
    call `fused` exactly as before (no window keyword)."""
    ids = np.random.default_rng(1).integers(1, 50, size=(2, 20)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 13:] = 0
    model = BertModel(CONFIG)
    params = flax.linen.meta.unbox(model.init(jax.random.PRNGKey(0), ids, mask)["params"])
    reference, _ = jax.jit(model.apply)({"params": params}, ids, mask)

    calls = []

    def fused(impl, q, k, v, kv_mask, *, dropout_rate=0.0, dropout_key=None,
              pallas_options=None, biases=None, packed_grads=False, cudnn_seed=0,
              **window):
        calls.append(window)
        if biases is not None:  # a path that adds the projection biases itself
            q, k, v = ((x.astype(jnp.float32) + b).astype(x.dtype)
                       for x, b in zip((q, k, v), biases))
        m = kv_mask[:, None, :]
        if window:
            m = m & band_mask(q.shape[1], window["window"])
        return xla_attention.attention(q, k, v, m)

    monkeypatch.setattr(attention_kernels, "resolve", lambda *a, **k: "pallas")
    monkeypatch.setattr(attention_kernels, "fused", fused)
    config = CONFIG.replace(scan_layers=scan)
    if scan:
        params = stack_layers({"bert": params}, CONFIG.num_hidden_layers)["bert"]
    out, _ = jax.jit(BertModel(config).apply)({"params": params}, ids, mask)
    np.testing.assert_allclose(out, reference, atol=1e-5)
    if scan:  # layer 0 apart, then one body (traced more than once by nn.scan) whose
        # lax.cond traces both kinds of layer
        assert calls[0] == {} and {w.get("window") for w in calls[1:]} == {None, 3}
    else:
        assert calls == [{}, {"window": 3}, {}]


def test_bert_defaults_have_no_window_and_learned_positions():
    c = BertConfig()
    assert [c.layer_window(i) for i in range(c.num_hidden_layers)] == [0] * 12
    params = jax.eval_shape(BertModel(c.replace(num_hidden_layers=1)).init,
                            jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"]
    assert {"position_embeddings", "token_type_embeddings"} <= set(params["embeddings"])
    assert "pooler" in params


@pytest.mark.parametrize("scan", [False, True])
def test_pallas_interpret_model_equals_xla_with_local_layers(scan):
    """The real fused path (the Pallas kernel in interpret mode on CPU) through the model:
    local and global layers, padding, scanned or not, equal the XLA path."""
    ids = np.random.default_rng(2).integers(1, 50, size=(2, 24)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 15:] = 0
    config = CONFIG.replace(scan_layers=scan)
    model = BertModel(config)
    params = model.init(jax.random.PRNGKey(0), ids, mask)["params"]
    ref, _ = jax.jit(model.apply)({"params": params}, ids, mask)
    out, _ = jax.jit(BertModel(config.replace(attention="pallas")).apply)(
        {"params": params}, ids, mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref)[real], rtol=1e-5,
                               atol=1e-5)
