"""The Pallas flash-attention kernel (models/kernels/attention/pallas_flash/) in interpret
mode on CPU against the XLA reference (kernels/attention/xla.py) with the hash dropout of
models/dropout.py (`Dropout(rate, impl="hash")` through flax apply): outputs and q, k, v
gradients, with padding, dropout, several blocks, padded lengths and head dims, packed
segments, and shard offsets; the fused backward kernel (keys in one block) and the
multi-block one. float32 throughout, so the two paths differ only by summation order: rtol
1e-5 (atol 1e-6 of the largest value)."""

import importlib.util
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.dropout import Dropout, keep_mask
from bert_jax.models.kernels.attention import pallas_flash, xla
from tests.conftest import REPO
from tests.models.helpers import assert_close

KEY = jax.random.key(7)  # the flax "dropout" rng of the call


def _dropout_key(rate):
    """The key Dropout(rate, impl="hash") draws its mask from inside apply (flax derives
    it from the rng passed in), i.e. what kernels.attention hands the kernel."""
    return Dropout(rate, impl="hash").apply({}, method="make_key", rngs={"dropout": KEY})


def _seeds(rate):
    return jax.random.bits(_dropout_key(rate), (2,), jnp.uint32)


def _reference(q, k, v, q_seg, kv_seg, rate):
    dropout = None
    if rate:
        dropout = lambda p: Dropout(rate, impl="hash").apply(  # noqa: E731
            {}, p, deterministic=False, rngs={"dropout": KEY})
    return xla.attention(q, k, v, q_seg[:, :, None] == kv_seg[:, None, :], dropout=dropout)


def _kernel(q, k, v, q_seg, kv_seg, rate, **kw):
    return pallas_flash.flash_attention(q, k, v, q_seg, kv_seg, dropout_rate=rate,
                                        seeds=_seeds(rate) if rate else None,
                                        block_q=16, block_k=16, **kw)


def _inputs(batch, length, heads, head_dim, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    shape = (batch, length, heads, head_dim)
    q, k, v, w = (jax.random.normal(x, shape, jnp.float32) for x in ks)
    return q, k, v, w


def _padding(batch, length):
    """Row 0 full, rows 1.. trailing padding, the last row no real key at all."""
    lengths = np.linspace(length, 0, batch).round().astype(int)
    lengths[0] = length
    kv_seg = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
    return jnp.ones_like(kv_seg), jnp.asarray(kv_seg)


def _value_and_grads(fn, q, k, v, w):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(w))


@pytest.mark.parametrize("length, rate", [(32, 0.0), (32, 0.1), (24, 0.5)])
def test_matches_reference_with_padding_and_dropout(length, rate):
    # 32: two 16-blocks each way; 24: padded to 32 inside (the hash rows keep q_len = 24).
    q, k, v, w = _inputs(3, length, 2, 16)
    q_seg, kv_seg = _padding(3, length)
    assert int(kv_seg[-1].sum()) == 0 and 0 < int(kv_seg[1].sum()) < length
    want = _value_and_grads(lambda *a: _reference(*a, q_seg, kv_seg, rate), q, k, v, w)
    got = _value_and_grads(lambda *a: _kernel(*a, q_seg, kv_seg, rate), q, k, v, w)
    assert_close(got, want)
    # the row with no real key is the uniform average of all values, as in the reference
    if rate == 0:
        np.testing.assert_allclose(got[0][-1], jnp.broadcast_to(v[-1].mean(0), v[-1].shape),
                                   rtol=1e-5, atol=1e-6)


def _kernel_names(length, head_dim=16, **options):
    """(names of the Pallas kernels, whether a separate rowsum(o * do) product runs) in the
    forward and backward pass of one call, from its jaxpr (traced, not run)."""
    x = jnp.zeros((1, length, 1, head_dim))
    seg = jnp.ones((1, length), jnp.int32)

    def fwd_bwd(q, k, v):
        out, vjp = jax.vjp(lambda *a: pallas_flash.flash_attention(*a, seg, seg, **options),
                           q, k, v)
        return vjp(out)

    jaxpr = jax.make_jaxpr(fwd_bwd)(x, x, x)
    outside = {e.primitive.name for e in jaxpr.eqns}  # the kernels' own dots are inside
    return re.findall(r"name=(flash_attention_\w+)", str(jaxpr)), "dot_general" in outside


FUSED = ["flash_attention_fwd", "flash_attention_bwd_fused"]
SPLIT = ["flash_attention_fwd", "flash_attention_bwd_dkdv", "flash_attention_bwd_dq"]


@pytest.mark.parametrize("length, options, want", [
    (24, {}, FUSED),                        # padded to one 32-key block
    (128, {}, FUSED),                       # BERT's usual length: one 128-key block
    (100, dict(bwd_block_q=32), FUSED),     # padded to 128, four query blocks
    (200, {}, SPLIT),                       # beyond 128 keys: 64-key blocks
    (32, dict(bwd_block_k=16), SPLIT),      # an explicit smaller key block
    (128, dict(block_k=64), SPLIT),         # block_k sets the backward's too
])
def test_backward_is_one_kernel_when_the_keys_fit_one_block(length, options, want):
    names, delta_einsum = _kernel_names(length, **options)
    assert names == want
    # the fused kernel computes rowsum(o * do) itself; the split one takes it from XLA
    assert delta_einsum == (want == SPLIT)


@pytest.mark.parametrize("length, rate, packed", [(24, 0.5, False), (32, 0.1, True)])
def test_fused_backward_matches_reference(length, rate, packed):
    # bwd_block_q=16: the fused kernel walks two query blocks, accumulating dK and dV over
    # them and writing each block's dQ; 24 is padded to 32 (one key block of 32).
    q, k, v, w = _inputs(3, length, 2, 16, seed=5)
    if packed:
        seg = np.zeros((3, length), np.int32)
        seg[0, :13], seg[0, 13:24], seg[1, :20], seg[2, :] = 1, 2, 1, 1
        q_seg = kv_seg = jnp.asarray(seg)
    else:
        q_seg, kv_seg = _padding(3, length)
    assert _kernel_names(length, bwd_block_q=16)[0] == FUSED
    want = _value_and_grads(lambda *a: _reference(*a, q_seg, kv_seg, rate), q, k, v, w)
    got = _value_and_grads(lambda *a: pallas_flash.flash_attention(
        *a, q_seg, kv_seg, dropout_rate=rate, seeds=_seeds(rate), bwd_block_q=16), q, k, v, w)
    assert_close(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("length, rate, options", [
    (128, 0.1, {}),                         # fused: 64-row query blocks, one 128-key block
    (100, 0.0, {}),                         # fused, padded to 128
    (200, 0.1, {}),                         # split: 64 x 64 blocks, padded to 256
])
def test_default_blocks_at_bert_lengths_match_reference(length, rate, options):
    q, k, v, w = _inputs(2, length, 2, 64, seed=6)
    q_seg, kv_seg = _padding(2, length)
    want = _value_and_grads(lambda *a: _reference(*a, q_seg, kv_seg, rate), q, k, v, w)
    got = _value_and_grads(lambda *a: pallas_flash.flash_attention(
        *a, q_seg, kv_seg, dropout_rate=rate, seeds=_seeds(rate) if rate else None,
        **options), q, k, v, w)
    assert_close(got, want)


def test_dropout_mask_is_the_reference_mask():
    # One-hot values (v[j] = e_j) read the dropped probabilities back: out[b, i, h, j] =
    # P[b, h, i, j] * keep[b, h, i, j] * scale. length 24 (padded to 32) and head_dim 24
    # (padded to 32) exercise both paddings; without padding every P > 0, so the zeros of
    # the output are exactly the dropped elements.
    batch, length, heads, rate = 2, 24, 3, 0.5
    q, k, _, _ = _inputs(batch, length, heads, length)
    v = jnp.broadcast_to(jnp.eye(length)[None, :, None, :], (batch, length, heads, length))
    seg = jnp.ones((batch, length), jnp.int32)
    out = np.asarray(_kernel(q, k, v, seg, seg, rate))
    keep = np.asarray(keep_mask(_dropout_key(rate), (batch, heads, length, length), rate))
    assert 0.3 < keep.mean() < 0.7
    np.testing.assert_array_equal(out.transpose(0, 2, 1, 3) != 0, keep)
    ref = _reference(q, k, v, seg, seg, rate)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-7)


def test_offsets_reproduce_the_slice_of_the_full_run():
    # A shard that holds examples 2.. or heads 2.. of the global [4, 32, 4, 16] problem draws
    # that part of the global mask when told its offsets (traced, as under shard_map).
    rate = 0.5
    q, k, v, w = _inputs(4, 32, 4, 16)
    q_seg, kv_seg = _padding(4, 32)
    full = _value_and_grads(lambda *a: _kernel(*a, q_seg, kv_seg, rate), q, k, v, w)

    @jax.jit
    def part(q, k, v, w, q_seg, kv_seg, batch_offset, head_offset):
        fn = lambda *a: _kernel(*a, q_seg, kv_seg, rate, batch_offset=batch_offset,  # noqa: E731
                                head_offset=head_offset, total_heads=4)
        return _value_and_grads(fn, q, k, v, w)

    two = jnp.int32(2)
    by_batch = part(q[2:], k[2:], v[2:], w[2:], q_seg[2:], kv_seg[2:], two, jnp.int32(0))
    for g, f in zip(by_batch, full):
        np.testing.assert_array_equal(g, f[2:])
    by_head = part(*(x[:, :, 2:] for x in (q, k, v, w)), q_seg, kv_seg, jnp.int32(0), two)
    for g, f in zip(by_head, full):
        np.testing.assert_array_equal(g, f[:, :, 2:])
    # without the offsets the shard would draw another mask: the check above can fail
    wrong = part(q[2:], k[2:], v[2:], w[2:], q_seg[2:], kv_seg[2:], jnp.int32(0), jnp.int32(0))
    assert np.abs(np.asarray(wrong[0]) - np.asarray(full[0][2:])).max() > 0.1


def test_packed_segments_are_block_diagonal():
    # Row 0: two packed sequences (13 + 11 tokens) then padding; row 1: one sequence of 20.
    rate = 0.1
    q, k, v, w = _inputs(2, 32, 2, 16, seed=3)
    seg = np.zeros((2, 32), np.int32)
    seg[0, :13], seg[0, 13:24], seg[1, :20] = 1, 2, 1
    seg = jnp.asarray(seg)
    want = _value_and_grads(lambda *a: _reference(*a, seg, seg, rate), q, k, v, w)
    got = _value_and_grads(lambda *a: _kernel(*a, seg, seg, rate), q, k, v, w)
    assert_close(got, want)
    # and it is not the padding-only answer (segment 2 would see segment 1's keys)
    padding_only = _kernel(q, k, v, jnp.ones_like(seg), (seg > 0).astype(jnp.int32), rate)
    assert np.abs(np.asarray(padding_only[0, :24]) - np.asarray(want[0][0, :24])).max() > 0.1


def test_bfloat16_close_to_the_float32_reference():
    # bfloat16 inputs: the kernel rounds the probabilities to bfloat16 (relative precision
    # 2**-8 = 0.4%), so against the float32 reference on the same (rounded) inputs it is
    # compared at 1e-2 (a few bfloat16 ulps of O(1) values), not at float32's 1e-5; and it
    # must be no further from it than twice the bfloat16 XLA reference is (~0.005 here).
    rate = 0.1
    q, k, v, _ = _inputs(2, 32, 2, 16)
    q_seg, kv_seg = _padding(2, 32)
    bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    got = _kernel(*bf, q_seg, kv_seg, rate)
    assert got.dtype == jnp.bfloat16
    want = _reference(*(x.astype(jnp.float32) for x in bf), q_seg, kv_seg, rate)
    got = np.asarray(got, np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
    xla_bf16 = np.asarray(_reference(*bf, q_seg, kv_seg, rate), np.float32)
    assert np.abs(got - want).max() <= 2 * np.abs(xla_bf16 - want).max()


def test_rejects_bad_arguments():
    q = jnp.zeros((1, 16, 1, 16))
    seg = jnp.ones((1, 16), jnp.int32)
    with pytest.raises(ValueError, match="seeds"):
        pallas_flash.flash_attention(q, q, q, seg, seg, dropout_rate=0.1)
    with pytest.raises(ValueError, match="powers of two"):
        pallas_flash.flash_attention(q, q, q, seg, seg, block_q=24)


@pytest.mark.parametrize("options", [
    dict(block_k=16),                                  # backward too: 32 x 16 everywhere
    dict(block_q=16, block_k=32, bwd_block_q=32, bwd_block_k=16),
    dict(block_q=16, block_k=16, num_warps=8, num_stages=3),
    dict(bwd_num_warps=8, bwd_num_stages=1),
])
def test_tuning_options_keep_outputs_and_gradients(options):
    # Block sizes, warps and stages change the schedule only: against the default blocks
    # (32 x 32 at this padded length) the same outputs and gradients up to summation order,
    # with dropout on (its mask is indexed by global position, not by block).
    rate = 0.1
    q, k, v, w = _inputs(3, 24, 2, 16)
    q_seg, kv_seg = _padding(3, 24)

    def run(**kw):
        return _value_and_grads(lambda *a: pallas_flash.flash_attention(
            *a, q_seg, kv_seg, dropout_rate=rate, seeds=_seeds(rate), **kw), q, k, v, w)

    base = run()
    assert_close(run(**options), base)
    if options.get("num_warps"):  # a block longer than the padded length is cut to it
        for got, want in zip(run(block_q=64, block_k=128, num_warps=8), base):
            np.testing.assert_array_equal(got, want)


def test_model_options_reach_the_kernel(monkeypatch):
    # BertConfig's pallas_* fields arrive as the kernel's keyword arguments; unset (0)
    # ones are left to the kernel's defaults.
    from bert_jax.models import BertConfig, BertModel
    from bert_jax.models.kernels.backend import platform

    seen = []
    real = pallas_flash.flash_attention
    monkeypatch.setattr(pallas_flash, "flash_attention",
                        lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32, attention="pallas",
                        pallas_block_q=32, pallas_bwd_block_k=16, pallas_num_warps=8,
                        pallas_bwd_num_stages=3)
    assert config.pallas_options == dict(block_q=32, bwd_block_k=16, num_warps=8,
                                         bwd_num_stages=3)
    assert BertConfig().pallas_options == {}
    ids = jnp.ones((2, 24), jnp.int32)
    model = BertModel(config)
    params = model.init(jax.random.key(0), ids, jnp.ones_like(ids), jnp.zeros_like(ids))
    assert platform() == "cpu" and not seen  # init takes the XLA path
    model.apply(params, ids, jnp.ones_like(ids), jnp.zeros_like(ids))
    assert len(seen) == 1
    assert {k: seen[0][k] for k in ("block_q", "bwd_block_k", "num_warps",
                                    "bwd_num_stages")} == dict(
        block_q=32, bwd_block_k=16, num_warps=8, bwd_num_stages=3)
    assert not {"block_k", "bwd_block_q", "num_stages", "bwd_num_warps"} & set(seen[0])


@pytest.mark.parametrize("options, message", [
    (dict(block_k=48), "block sizes must be powers of two >= 16, got block_k=48"),
    (dict(bwd_block_q=8), "block sizes must be powers of two >= 16, got bwd_block_q=8"),
    (dict(num_warps=6), "num_warps must be a power of two <= 32, got 6"),
    (dict(num_warps=64), "num_warps must be a power of two <= 32, got 64"),
    (dict(num_stages=0), "num_stages must be an integer >= 1, got 0"),
    (dict(bwd_num_warps=12), "bwd_num_warps must be a power of two <= 32, got 12"),
    (dict(bwd_num_stages=0), "bwd_num_stages must be an integer >= 1, got 0"),
])
def test_rejects_bad_tuning_options(options, message):
    q = jnp.zeros((1, 16, 1, 16))
    seg = jnp.ones((1, 16), jnp.int32)
    with pytest.raises(ValueError, match=message):
        pallas_flash.flash_attention(q, q, q, seg, seg, **options)


@pytest.mark.parametrize("change, message", [
    (dict(pallas_block_q=96), "pallas_block_q must be 0 .* or a power of two >= 16, got 96"),
    (dict(pallas_bwd_block_k=8), "pallas_bwd_block_k must be 0 .* power of two >= 16, got 8"),
    (dict(pallas_block_k=-16), "pallas_block_k must be 0"),
    (dict(pallas_num_warps=3), "pallas_num_warps must be 0 .* power of two <= 32, got 3"),
    (dict(pallas_num_stages=-1), "pallas_num_stages must be 0 .* integer >= 1, got -1"),
    (dict(pallas_num_stages=2.0), "pallas_num_stages must be 0 .* got 2.0"),
    (dict(pallas_bwd_num_warps=48), "pallas_bwd_num_warps must be 0 .* <= 32, got 48"),
])
def test_config_rejects_bad_tuning_fields(change, message):
    from bert_jax.models import BertConfig, ConfigError

    with pytest.raises(ConfigError, match=message):
        BertConfig(**change)


def _biases(heads, head_dim, seed=11):
    return tuple(jax.random.normal(r, (heads, head_dim), jnp.float32)
                 for r in jax.random.split(jax.random.key(seed), 3))


def _with_biases(fn, q, k, v, w, biases):
    """(out, dq, dk, dv, dq_bias, dk_bias, dv_bias) of fn(q, k, v, biases)."""
    out, vjp = jax.vjp(fn, q, k, v, biases)
    dq, dk, dv, db = vjp(w)
    return (out, dq, dk, dv, *db)


BIAS_NAMES = ("out", "dq", "dk", "dv", "dq_bias", "dk_bias", "dv_bias")


# (length, rate, options, backward kernels): the fused backward over two query blocks; the
# split one over 2 x 2 blocks; both with a length padded inside (24 -> 32).
@pytest.mark.parametrize("length, rate, options, want", [
    (24, 0.5, dict(bwd_block_q=16), FUSED),
    pytest.param(32, 0.0, dict(block_q=16, block_k=16), SPLIT, marks=pytest.mark.slow),
    (24, 0.1, dict(block_q=16, block_k=16), SPLIT),
])
def test_biases_added_in_the_kernel_match_the_reference(length, rate, options, want):
    # q, k, v before their per-head biases: against the reference on q + q_bias, ... (the
    # separate add the model does without them), outputs, q, k, v gradients and the bias
    # gradients (their sums over examples and tokens).
    heads, head_dim = 2, 12  # head dim padded to 16 inside: the bias is padded with zeros
    q, k, v, w = _inputs(3, length, heads, head_dim, seed=9)
    biases = _biases(heads, head_dim)
    q_seg, kv_seg = _padding(3, length)
    assert _kernel_names(length, **options)[0] == want

    def reference(q, k, v, b):
        return _reference(q + b[0], k + b[1], v + b[2], q_seg, kv_seg, rate)

    def kernel(q, k, v, b):
        return pallas_flash.flash_attention(q, k, v, q_seg, kv_seg, biases=b, dropout_rate=rate,
                                            seeds=_seeds(rate) if rate else None, **options)

    want_all = _with_biases(reference, q, k, v, w, biases)
    got = _with_biases(kernel, q, k, v, w, biases)
    # The key bias adds q . k_bias to every score of a row, which the softmax ignores: its
    # gradient is zero up to rounding on both paths, so it is checked against the sum of dK.
    keep = [0, 1, 2, 3, 4, 6]
    assert_close([got[i] for i in keep], [want_all[i] for i in keep],
                 names=[BIAS_NAMES[i] for i in keep])
    assert np.abs(np.asarray(want_all[5])).max() < 1e-4
    # each bias gradient is the sum of its projection's gradient over examples and tokens
    for d, db in zip(got[1:4], got[4:]):
        np.testing.assert_allclose(db, np.asarray(d).sum((0, 1)), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("options, want", [(dict(bwd_block_q=16), FUSED),
                                           (dict(block_q=16, block_k=16), SPLIT)])
def test_biases_with_packed_rows_and_a_window(options, want):
    # Packed segments (and padding) inside a sliding window of 5, dropout on, length 30
    # padded to 32: the window's block ranges and the packed masks with biased tiles.
    from bert_jax.models.attention import band_mask

    length, window, rate = 30, 5, 0.1
    q, k, v, w = _inputs(2, length, 2, 16, seed=12)
    biases = _biases(2, 16, seed=13)
    seg = np.zeros((2, length), np.int32)
    seg[0, :13], seg[0, 13:24], seg[1, :20] = 1, 2, 1
    seg = jnp.asarray(seg)
    assert _kernel_names(length, **options)[0] == want
    mask = (seg[:, :, None] == seg[:, None, :]) & band_mask(length, window)

    def reference(q, k, v, b):
        dropout = lambda p: Dropout(rate, impl="hash").apply(  # noqa: E731
            {}, p, deterministic=False, rngs={"dropout": KEY})
        return xla.attention(q + b[0], k + b[1], v + b[2], mask, dropout=dropout)

    def kernel(q, k, v, b):
        return pallas_flash.flash_attention(q, k, v, seg, seg, biases=b, dropout_rate=rate,
                                            seeds=_seeds(rate), window=window, **options)

    got = _with_biases(kernel, q, k, v, w, biases)
    want_all = _with_biases(reference, q, k, v, w, biases)
    keep = [0, 1, 2, 3, 4, 6]  # the key bias's gradient is zero (see above)
    assert_close([got[i] for i in keep], [want_all[i] for i in keep],
                 names=[BIAS_NAMES[i] for i in keep])
    np.testing.assert_allclose(got[5], want_all[5], atol=1e-4)


def test_biases_in_bfloat16_round_as_a_separate_add():
    # The kernel rounds (x + bias) to bfloat16 on each load exactly as the separate add then
    # cast does: the same outputs and q, k, v gradients, bit for bit, as the kernel run on
    # the biased inputs.
    rate = 0.1
    q, k, v, w = (x.astype(jnp.bfloat16) for x in _inputs(2, 32, 2, 16, seed=4))
    biases = _biases(2, 16)
    q_seg, kv_seg = _padding(2, 32)
    run = lambda *a, **kw: _value_and_grads(lambda *x: pallas_flash.flash_attention(  # noqa: E731
        *x, q_seg, kv_seg, dropout_rate=rate, seeds=_seeds(rate), **kw), *a, w)
    got = run(q, k, v, biases=biases)
    want = run(*((x.astype(jnp.float32) + b).astype(jnp.bfloat16)
                 for x, b in zip((q, k, v), biases)))
    assert got[0].dtype == jnp.bfloat16
    for g, x in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(x, np.float32))


def test_bias_gradients_come_from_the_kernels():
    # With biases the backward kernels write partial sums (one more output per bias), so no
    # reduction of a [batch, length, heads, d] gradient runs outside them.
    x = jnp.zeros((2, 32, 2, 16))
    seg = jnp.ones((2, 32), jnp.int32)
    b = tuple(jnp.zeros((2, 16)) for _ in range(3))
    # the fused backward kernel writes the three biases' partial sums as one array (one
    # reduction); the split dQ / dKdV kernels write one each (three)
    for options, reductions in (({}, 1), (dict(block_q=16, block_k=16), 3)):
        def fwd_bwd(q, k, v, b):
            fn = lambda *a: pallas_flash.flash_attention(  # noqa: E731
                *a[:3], seg, seg, biases=a[3], **options)
            out, vjp = jax.vjp(fn, q, k, v, b)
            return vjp(out)

        jaxpr = jax.make_jaxpr(fwd_bwd)(x, x, x, b)
        big = [e for e in jaxpr.eqns if e.primitive.name == "reduce_sum"
               and e.invars[0].aval.size >= x.size]
        assert not big, big
        assert [e.primitive.name for e in jaxpr.eqns].count("reduce_sum") == reductions


def test_rejects_bad_biases():
    q = jnp.zeros((1, 16, 2, 16))
    seg = jnp.ones((1, 16), jnp.int32)
    with pytest.raises(ValueError, match="biases must be"):
        pallas_flash.flash_attention(q, q, q, seg, seg, biases=(jnp.zeros((2, 16)),) * 2)
    with pytest.raises(ValueError, match="biases must be"):
        pallas_flash.flash_attention(q, q, q, seg, seg, biases=(jnp.zeros((16,)),) * 3)


def test_packed_gradients_are_the_same_gradients_in_one_array():
    """packed_grads=True: the fused backward kernel writes dQ, dK, dV into one [batch,
    length, 3, heads, d] array whose slices are exactly the unpacked kernel's gradients
    (biases and dropout on, padding); a split backward (keys over one block) ignores it."""
    b, n, h, d = 2, 32, 2, 16
    r = jax.random.split(jax.random.PRNGKey(4), 5)
    q, k, v = (jax.random.normal(x, (b, n, h, d), jnp.float32) for x in r[:3])
    biases = tuple(0.1 * jax.random.normal(r[3], (3, h, d)))
    cot = jax.random.normal(r[4], (b, n, h, d))
    seg = jnp.array([[1] * n, [1] * 20 + [0] * (n - 20)], jnp.int32)
    seeds = jax.random.bits(jax.random.PRNGKey(9), (2,), jnp.uint32)

    def grads(packed, **options):
        fn = lambda q, k, v, bs: pallas_flash.flash_attention(  # noqa: E731
            q, k, v, jnp.ones_like(seg), seg, biases=bs, dropout_rate=0.1, seeds=seeds,
            packed_grads=packed, **options)
        _, vjp = jax.vjp(fn, q, k, v, biases)
        jaxpr = str(jax.make_jaxpr(lambda: vjp(cot))())
        return vjp(cot), jaxpr

    assert pallas_flash.packs_grads(n) and not pallas_flash.packs_grads(n, bwd_block_k=16)
    want, plain = grads(False)
    got, packed = grads(True)
    assert f"f32[{b},{n},3,{h},{d}]" in packed and f"f32[{b},{n},3,{h},{d}]" not in plain
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    split, jaxpr = grads(True, bwd_block_k=16)  # two backward kernels: nothing to pack
    assert f"f32[{b},{n},3,{h},{d}]" not in jaxpr
    for g, w in zip(jax.tree_util.tree_leaves(split), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is None,
                    reason="lowers for a GPU description: needs jax's CUDA plugin importable")
def test_backward_kernels_take_their_own_warps_and_stages():
    # Lowered for the H100 description (no GPU): each Triton kernel's settings as lowered.
    script = """
import os, re, sys
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
import jax, jax.numpy as jnp
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from bert_jax.models.kernels.attention import pallas_flash
with open(sys.argv[1]) as f:
    topo = topologies.get_topology_desc(platform="cuda", topology_name="",
                                        target_config=f.read(), topology="1x1x1")
mesh = Mesh(list(topo.devices), ("data",))
spec = lambda s, t: jax.ShapeDtypeStruct(s, t, sharding=NamedSharding(mesh, P()))
for length in (128, 512):
    def f(q, k, v, seg):
        o, vjp = jax.vjp(lambda q, k, v: pallas_flash.flash_attention(
            q, k, v, seg, seg, num_warps=4, bwd_num_warps=8, bwd_num_stages=3), q, k, v)
        return vjp(o)
    a = spec((2, length, 2, 64), jnp.bfloat16)
    with jax.set_mesh(mesh):
        text = jax.jit(f).lower(a, a, a, spec((2, length), jnp.int32)).as_text()
    for line in text.splitlines():
        if "xla.gpu.triton" in line:
            print(length, *re.findall(r'name = "(\\w+)"|num_stages = (\\d+)|num_warps = (\\d+)',
                                      line))
"""
    target = REPO.parent / "shared" / "gpu" / "h100_sxm.txtpb"
    if not target.exists():
        pytest.skip(f"no GPU description at {target}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + sys.path))
    done = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = {}
    for line in done.stdout.splitlines():
        length, *found = line.split(" ", 1)
        name = re.search(r"'(flash_attention_\w+)'", line).group(1)
        stages, warps = re.findall(r"'(\d+)'", line)[:2]
        kernels[int(length), name] = (int(warps), int(stages))
    assert kernels == {(128, "flash_attention_fwd"): (4, 2),
                       (128, "flash_attention_bwd_fused"): (8, 3),
                       (512, "flash_attention_fwd"): (4, 2),
                       (512, "flash_attention_bwd_dkdv"): (8, 3),
                       (512, "flash_attention_bwd_dq"): (8, 3)}
