"""Sliding-window attention (`window` > 0: query i attends key j only if |i - j| <= window, on
top of the padding / packing rule) on every attention path against the XLA reference
(kernels/attention/xla.py, window=...): the Pallas kernel in interpret mode through
kernels.attention.fused, outputs and q / k / v gradients, with padding (rows with no allowed key
in their band included), packed rows, hash dropout, block-size options and lengths that are
not a multiple of the block; the kernel's block skipping (loop bounds on numbers, and keys
poisoned with NaN outside every visited block); splash's LocalMask on TPU in interpret
mode; the dispatch. float32: rtol 1e-5 (atol 1e-6 of the largest value)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.dropout import Dropout
from bert_jax.models.kernels import attention as attention_kernels
from bert_jax.models.kernels.attention import AttentionConfigError, pallas_flash, resolve, xla
from bert_jax.models.kernels.attention.pallas_flash import tiling
from tests.models.helpers import assert_close, tiny_config

KEY = jax.random.key(7)  # the flax "dropout" rng of the call
BLOCKS = dict(block_q=16, block_k=16)


def _dropout_key(rate):
    """The key Dropout(rate, impl="hash") draws from inside apply: what the model hands fused."""
    return Dropout(rate, impl="hash").apply({}, method="make_key", rngs={"dropout": KEY})


def _xla_mask(mask):
    """The XLA path's mask from the model's: [batch, 1, k] key mask, or block-diagonal."""
    if jnp.issubdtype(mask.dtype, jnp.integer):
        return mask[:, :, None] == mask[:, None, :]
    return mask[:, None, :]


def _reference(q, k, v, mask, window, rate=0.0):
    dropout = None
    if rate:
        dropout = lambda p: Dropout(rate, impl="hash").apply(  # noqa: E731
            {}, p, deterministic=False, rngs={"dropout": KEY})
    return xla.attention(q, k, v, _xla_mask(mask), dropout=dropout, window=window)


def _pallas(q, k, v, mask, window, rate=0.0, **options):
    return attention_kernels.fused("pallas", q, k, v, mask, dropout_rate=rate,
                               dropout_key=_dropout_key(rate) if rate else None,
                               pallas_options={**BLOCKS, **options}, window=window)


def _inputs(batch, length, heads=2, head_dim=16, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    return [jax.random.normal(x, (batch, length, heads, head_dim), jnp.float32) for x in ks]


def _padding(length, lengths):
    """<bool>[batch, length]: trailing padding after each row's length."""
    return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def _packed(length, sizes_per_row):
    """<int32>[batch, length] sequence ids 1, 2, .. of consecutive sequences, then 0."""
    rows = []
    for sizes in sizes_per_row:
        ids = np.concatenate([np.full(n, i + 1) for i, n in enumerate(sizes)] +
                             [np.zeros(length - sum(sizes))])
        rows.append(ids)
    return jnp.asarray(np.stack(rows), jnp.int32)


def _value_and_grads(fn, q, k, v, w):
    """(out, dq, dk, dv) under one jit: Pallas' interpret mode is mostly tracing and
    compiling, which a jit does once for the forward and backward kernels."""
    @jax.jit
    def run(q, k, v, w):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(w))
    return run(q, k, v, w)


# ------------------------------------------------------------------------- the reference


def test_band_mask():
    np.testing.assert_array_equal(xla.band_mask(5, 1), np.array([
        [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1]],
        bool))
    assert bool(xla.band_mask(4, 0).all())


def test_xla_window_is_jax_local_window_and_the_anded_mask():
    # jax.nn.dot_product_attention's local_window_size=(w, w) (the semantics its cuDNN path
    # would need) and the padding mask ANDed with band_mask give the same attention on every
    # query with an allowed key; a query with none (padding far past the real tokens) is
    # the uniform average of its band.
    length, window = 40, 5
    q, k, v, _ = _inputs(3, length)
    lengths = jnp.array([40, 17, 0])
    mask = _padding(length, lengths)

    @jax.jit
    def run(q, k, v):
        return (xla.attention(q, k, v, mask[:, None, :], window=window),
                xla.attention(q, k, v, mask[:, None, :] & xla.band_mask(length, window)[None]),
                jax.nn.dot_product_attention(
                    q, k, v, key_value_seq_lengths=lengths.astype(jnp.int32),
                    local_window_size=(window, window), implementation="xla"),
                xla.attention(q, k, v, mask[:, None, :]))

    got, anded, jax_local, glob = run(q, k, v)
    real = np.asarray(mask)[:, :, None, None]
    np.testing.assert_allclose(np.where(real, got, 0), np.where(real, anded, 0), rtol=1e-6)
    np.testing.assert_allclose(np.where(real, got, 0), np.where(real, jax_local, 0),
                               rtol=1e-5, atol=1e-6)
    # and it is not global attention
    assert np.abs(np.asarray(got[0]) - np.asarray(glob[0])).max() > 0.1
    # row 1, position 30: no real key within 5; row 2: no real key at all
    for b, i in ((1, 30), (2, 0), (2, 20)):
        lo, hi = max(0, i - window), min(length, i + window + 1)
        np.testing.assert_allclose(got[b, i], v[b, lo:hi].mean(0), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------- Pallas (interpret)


# Interpret mode is slow: the cases without dropout are in the slow set.
@pytest.mark.parametrize("length, window, rate", [
    pytest.param(45, 5, 0.0, marks=pytest.mark.slow),   # 3 blocks of 16, the last cut short
    pytest.param(64, 16, 0.0, marks=pytest.mark.slow),  # the band reaches one block each side
    (53, 5, 0.2),    # dropout: the kernel's hash masks are the XLA path's
])
def test_pallas_window_equals_xla_with_padding(length, window, rate):
    q, k, v, w = _inputs(3, length)
    # Row 1 ends 20 tokens early: queries past 20 + window have no allowed key in their band;
    # row 2 is an all-padding eval filler.
    mask = _padding(length, [length, length - 20, 0])
    want = _value_and_grads(lambda *a: _reference(*a, mask, window, rate), q, k, v, w)
    got = _value_and_grads(lambda *a: _pallas(*a, mask, window, rate), q, k, v, w)
    assert_close(got, want)
    glob = _value_and_grads(lambda *a: _reference(*a, mask, 0, rate), q, k, v, w)
    assert np.abs(np.asarray(got[0]) - np.asarray(glob[0])).max() > 0.1  # a window applied


@pytest.mark.parametrize("length, window, rate", [
    pytest.param(48, 5, 0.0, marks=pytest.mark.slow), (61, 16, 0.2)])
def test_pallas_window_equals_xla_with_packed_rows(length, window, rate):
    q, k, v, w = _inputs(2, length, seed=3)
    # Row 0: three sequences then padding; row 1: one sequence longer than the window, then
    # padding (id 0 attends id 0).
    seq = _packed(length, [(13, 20, 9), (length - 7,)])
    want = _value_and_grads(lambda *a: _reference(*a, seq, window, rate), q, k, v, w)
    got = _value_and_grads(lambda *a: _pallas(*a, seq, window, rate), q, k, v, w)
    assert_close(got, want)
    # the window and the packing both matter here
    unpacked = _reference(q, k, v, seq > 0, window, rate)
    assert np.abs(np.asarray(got[0]) - np.asarray(unpacked)).max() > 0.1


@pytest.mark.parametrize("options", [
    dict(block_q=16, block_k=32, bwd_block_q=32, bwd_block_k=16),
    pytest.param(dict(block_q=32, block_k=16),  # q padded to 96 for 32-row blocks
                 marks=pytest.mark.slow),
])
def test_pallas_window_block_options(options):
    # Blocks change the schedule (and which blocks are skipped), not the result; the
    # query rows added to fill a block borrow the last real row's band.
    length, window, rate = 70, 5, 0.1
    q, k, v, w = _inputs(2, length, seed=1)
    mask = _padding(length, [length, 41])
    want = _value_and_grads(lambda *a: _reference(*a, mask, window, rate), q, k, v, w)
    got = _value_and_grads(lambda *a: _pallas(*a, mask, window, rate, **options), q, k, v, w)
    assert_close(got, want)


@pytest.mark.parametrize("packed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_pallas_window_in_the_fused_backward(packed):
    # All 40 keys in one backward key block (64, padded): dQ, dK, dV come from the fused
    # kernel. 64-row forward blocks pad the queries to 64, so the fused kernel's last
    # 16-row query block holds only added rows (it must add nothing to dK and dV).
    length, window, rate = 40, 5, 0.2
    options = dict(block_q=64, block_k=64, bwd_block_q=16)
    q, k, v, w = _inputs(2, length, seed=2)
    mask = _packed(length, [(13, 20), (length - 7,)]) if packed else _padding(length, [40, 23])
    x = jnp.zeros((1, length, 1, 16))
    jaxpr = str(jax.make_jaxpr(lambda q: jax.vjp(
        lambda q: _pallas(q, x, x, mask[:1], window, **options), q)[1](q))(x))
    assert "flash_attention_bwd_fused" in jaxpr and "flash_attention_bwd_dq" not in jaxpr
    want = _value_and_grads(lambda *a: _reference(*a, mask, window, rate), q, k, v, w)
    got = _value_and_grads(lambda *a: _pallas(*a, mask, window, rate, **options), q, k, v, w)
    assert_close(got, want)


@pytest.mark.slow
def test_pallas_window_as_wide_as_the_row_is_global():
    q, k, v, w = _inputs(1, 24)
    mask = _padding(24, [17])
    got = _value_and_grads(lambda *a: _pallas(*a, mask, 23), q, k, v, w)
    want = _value_and_grads(lambda *a: _pallas(*a, mask, 0), q, k, v, w)
    for g, x in zip(got, want):
        np.testing.assert_array_equal(g, x)


def _cfg(length, window, q_len=None):
    return types.SimpleNamespace(q_len=q_len or length, kv_len=length, window=window)


def _ints(pair):
    return tuple(int(x) for x in pair)


def test_loop_bounds_visit_only_the_blocks_of_the_band():
    # 64 tokens, window 5, 16 x 16 blocks: query block 0 (rows 0-15) needs keys 0-20 (key
    # blocks 0, 1); block 1 keys 11-36 (0-2); block 3 keys 43-63 (2, 3).
    cfg = _cfg(64, 5)
    assert [_ints(tiling.kv_block_range(i * 16, 16, 16, 4, cfg)) for i in range(4)] == [
        (0, 2), (0, 3), (1, 4), (2, 4)]
    # dK/dV: key block 0 is seen by rows 0-20 (query blocks 0, 1); key block 2 by rows 27-52
    assert [_ints(tiling.q_block_range(j * 16, 16, 16, 4, cfg)) for j in range(4)] == [
        (0, 2), (0, 3), (1, 4), (2, 4)]
    assert _ints(tiling.kv_block_range(16, 16, 16, 4, _cfg(64, 0))) == (0, 4)  # global
    # 40 real rows padded to 64: the all-added block 3 (rows 48-63) takes row 39's band
    # (keys 34-39, key block 2); key block 3 (padding keys only) is seen by no real row
    # near enough, so the dK/dV loop there is empty.
    cfg = _cfg(40, 5)
    assert _ints(tiling.kv_block_range(48, 16, 16, 4, cfg)) == (2, 3)
    lo, hi = _ints(tiling.q_block_range(48, 16, 16, 4, cfg))
    assert hi == lo
    # ModernBERT's shapes: 8192 tokens, window 64 (128 wide), 128 x 64 blocks: each query
    # block walks 4 key blocks of 128, each key block 3 query blocks of 64 (global: 128).
    cfg = _cfg(8192, 64)
    fwd = [np.subtract(*_ints(tiling.kv_block_range(i * 128, 128, 64, 128, cfg)))
           for i in range(64)]
    assert max(-f for f in fwd) == 4 and sum(-f for f in fwd) < 4 * 64
    bwd = [np.subtract(*_ints(tiling.q_block_range(j * 64, 64, 64, 128, cfg)))
           for j in range(128)]
    assert max(-b for b in bwd) == 3
    # visited_blocks (benchmarks' FLOPs estimate) adds them up: 254 of the forward's 8192
    # block pairs (band 129 wide over 128-row blocks), 382 of the backward's 16384
    assert tiling.visited_blocks(8192, 64) == {
        "fwd": (128, 64, 254, 8192), "dq": (64, 64, 382, 16384), "dkdv": (64, 64, 382, 16384)}
    assert tiling.visited_blocks(8192, 0)["fwd"] == (128, 64, 8192, 8192)
    assert tiling.visited_blocks(64, 63)["dkdv"][2:] == (1, 1)  # as wide as the row


@pytest.mark.slow
def test_the_window_benchmark_runs_on_cpu():
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    repo = str(REPO)
    out = subprocess.run(
        [sys.executable, "benchmarks/attention_window.py", "--length=64", "--window=5",
         "--batch=1", "--heads=1", "--head_dim=16", "--steps=1", "--block_q=16",
         "--block_k=16", "--xla"], cwd=repo, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": repo})
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {tuple(line.split()[:2]): line.split() for line in out.stdout.splitlines()
            if line.startswith(("pallas", "xla"))}
    assert rows[("pallas", "0")][4] == "1.000" and rows[("pallas", "5")][4] == "0.625"
    assert float(rows[("pallas", "5")][3]) < float(rows[("pallas", "0")][3])


def test_skipped_blocks_are_never_read():
    # Poison q, k, v from row 48 on with NaN. With window 5 and 16 x 16 blocks, query blocks
    # 0 and 1 (rows 0-31) never visit key block 3 (keys 48-63) in the forward or the dQ
    # kernel, nor does key block 0 ever visit query blocks 2, 3 in the dK/dV kernel: those
    # stay finite and equal the reference on clean inputs. Query block 2 (rows 32-47)
    # does visit key block 3, so its rows turn NaN: the poison reaches what is read.
    length, window = 64, 5
    q, k, v, w = _inputs(2, length)
    mask = _padding(length, [length, length])
    bad = [x.at[:, 48:].set(jnp.nan) for x in (q, k, v)]
    got = _value_and_grads(lambda *a: _pallas(*a, mask, window), *bad, w)
    want = _value_and_grads(lambda *a: _reference(*a, mask, window), q, k, v, w)
    out, dq, dk, dv = (np.asarray(x) for x in got)
    assert np.isnan(out[:, 32:48]).all()
    assert_close((out[:, :32], dq[:, :32], dk[:, :16], dv[:, :16]),
                  (want[0][:, :32], want[1][:, :32], want[2][:, :16], want[3][:, :16]))
    # the global kernel reads every block: all NaN
    assert np.isnan(np.asarray(jax.jit(lambda *a: _pallas(*a, mask, 0))(*bad))[:, :32]).all()


def test_kernel_rejects_bad_windows():
    q = jnp.zeros((1, 16, 1, 16))
    seg = jnp.ones((1, 16), jnp.int32)
    with pytest.raises(ValueError, match="window must be an integer >= 0"):
        pallas_flash.flash_attention(q, q, q, seg, seg, window=-1)
    with pytest.raises(ValueError, match="self-attention"):
        pallas_flash.flash_attention(q, q[:, :8], q[:, :8], seg, seg[:, :8], window=2)


@pytest.mark.slow
@pytest.mark.parametrize("length, window, packed, rate", [
    (300, 64, False, 0.1), (300, 64, True, 0.1), (257, 16, False, 0.0)])
def test_pallas_window_at_larger_sizes(length, window, packed, rate):
    q, k, v, w = _inputs(2, length, heads=3, head_dim=32, seed=4)
    mask = (_packed(length, [(100, 90, 60), (length - 3,)]) if packed
            else _padding(length, [length, 123]))
    want = _value_and_grads(lambda *a: _reference(*a, mask, window, rate), q, k, v, w)
    got = _value_and_grads(lambda *a: attention_kernels.fused(
        "pallas", *a, mask, dropout_rate=rate,
        dropout_key=_dropout_key(rate) if rate else None,
        pallas_options=dict(block_q=64, block_k=32, bwd_block_q=32, bwd_block_k=64),
        window=window), q, k, v, w)
    assert_close(got, want)


# ----------------------------------------------------------------------- splash (TPU)


def test_splash_head_mask_is_the_band():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    from bert_jax.models.kernels.attention import splash_tpu

    local = splash_tpu.head_mask(384, 16)
    assert isinstance(local, sm.LocalMask) and local.window_size == (16, 16)
    np.testing.assert_array_equal(local[:, :], np.asarray(xla.band_mask(384, 16)))
    assert not local[0:128, 256:384].any()  # a block splash skips
    assert isinstance(splash_tpu.head_mask(384, 0), sm.FullMask)


def test_splash_skips_the_blocks_outside_the_band():
    # 2048 tokens in 512 x 512 blocks, window 128: splash's block mask (0 = skipped) keeps
    # the 10 blocks on and beside the diagonal of 16.
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask_info

    from bert_jax.models.kernels.attention import splash_tpu

    def visited(window):
        info, _ = splash_attention_mask_info.process_mask(
            sm.MultiHeadMask([splash_tpu.head_mask(2048, window)]), (512, 512))
        return int((np.asarray(info.block_mask) > 0).sum())

    assert (visited(128), visited(0)) == (10, 16)


def test_splash_window_compiles_for_a_tpu(monkeypatch):
    # Forward and backward of the windowed splash kernel, lowered by Mosaic and compiled by
    # libtpu for one chip of a v5e 2x2 slice described on this host (no TPU needed).
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (the [test] extra brings it on x86-64 Linux)")
    import os

    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from bert_jax.models.kernels.attention import splash_tpu

    # as tests/test_tpu_compile.py: metadata libtpu would look up on a TPU VM
    for name, value in (("TPU_ACCELERATOR_TYPE", "v5litepod-4"),
                        ("TPU_WORKER_HOSTNAMES", "localhost"),
                        ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
        if name not in os.environ:
            monkeypatch.setenv(name, value)
    device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
    sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    x = jax.ShapeDtypeStruct((2, 1024, 2, 64), jnp.bfloat16, sharding=sharding)
    ids = jax.ShapeDtypeStruct((2, 1024), jnp.int32, sharding=sharding)

    def step(q, k, v, ids):
        out, vjp = jax.vjp(lambda *a: splash_tpu.attention(*a, ids, window=128), q, k, v)
        return (out, *vjp(out))

    lowered = jax.jit(step).lower(x, x, x, ids)
    assert "tpu_custom_call" in lowered.as_text()
    cost = lowered.compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    assert cost["flops"] > 0


@pytest.mark.parametrize("packed", [False, True])
def test_splash_window_equals_xla_in_interpret_mode(packed):
    from bert_jax.models.kernels.attention import splash_tpu

    length, window = 128, 16
    q, k, v, w = _inputs(2, length, seed=2)
    if packed:
        mask = _packed(length, [(40, 50), (length - 10,)])
        real = np.asarray(mask > 0)
    else:
        mask = _padding(length, [length, 70])
        real = np.asarray(mask)
    # Padding queries carry zero weight (and splash lets them attend padding keys): they get
    # no cotangent and are left out of the comparison.
    w = jnp.where(real[:, :, None, None], w, 0)
    want = _value_and_grads(lambda *a: _reference(*a, mask, window), q, k, v, w)
    got = _value_and_grads(lambda *a: splash_tpu.attention(*a, mask, window=window,
                                                           interpret=True), q, k, v, w)
    keep = real[:, :, None, None]
    assert_close([np.where(keep, g, 0) for g in got], [np.where(keep, x, 0) for x in want])


# ----------------------------------------------------------------------------- dispatch


@pytest.mark.parametrize("impl, plat, dtype, rate, training, packed, want", [
    ("auto", "gpu", "bfloat16", 0.0, False, False, "pallas"),  # cuDNN has no two-sided window
    ("auto", "gpu", "bfloat16", 0.1, True, True, "pallas"),
    ("auto", "cpu", "float32", 0.1, True, False, "xla"),
    ("auto", "tpu", "bfloat16", 0.0, False, False, "xla"),
    ("pallas", "tpu", "bfloat16", 0.0, False, True, "pallas"),  # splash's LocalMask
    ("xla", "gpu", "bfloat16", 0.0, False, False, "xla"),
])
def test_resolve_with_a_window(impl, plat, dtype, rate, training, packed, want):
    config = tiny_config(dtype=dtype, attention_probs_dropout_prob=rate, dropout_rng="hash")
    assert resolve(impl, plat, config, training, packed=packed, window=64) == want
    if impl == "auto" and plat == "gpu" and not rate and not packed:
        assert resolve(impl, plat, config, training, packed=packed, window=0) == "cudnn"


def test_explicit_cudnn_refuses_a_window():
    config = tiny_config(dtype="bfloat16", attention_probs_dropout_prob=0.0)
    assert resolve("cudnn", "gpu", config, False) == "cudnn"
    with pytest.raises(AttentionConfigError, match="model.attention=cudnn cannot run a "
                                                   "sliding-window layer"):
        resolve("cudnn", "gpu", config, False, window=64)
    with pytest.raises(AttentionConfigError, match="model.attention=cudnn cannot run"):
        x = jnp.zeros((1, 16, 1, 16), jnp.bfloat16)
        attention_kernels.fused("cudnn", x, x, x, jnp.ones((1, 16), bool), window=4)
    with pytest.raises(AttentionConfigError, match="window must be an integer >= 0"):
        resolve("auto", "gpu", config, False, window=-1)


def test_describe_names_the_window_layers_paths():
    config = tiny_config(dtype="bfloat16", attention_probs_dropout_prob=0.0)
    line = attention_kernels.describe(config, "gpu", window=64)
    assert line.startswith("attention cudnn (train), cudnn (eval); window 64 layers pallas "
                           "(train), pallas (eval) [model.attention=auto]")
    assert "window" not in attention_kernels.describe(config, "gpu")
