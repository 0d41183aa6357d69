"""Flash attention in Pallas with the hash attention-probability dropout inside the kernel.

    o = flash_attention(q, k, v, q_segment_ids, kv_segment_ids, dropout_rate=0.1,
                        seeds=jax.random.bits(dropout_key, (2,), jnp.uint32))

The numerics of the XLA reference (xla.py) with FlashAttention-2's schedule: the [q, k]
probabilities never leave the kernel. Forward: one program per (query block, example, head)
walks the key blocks with an online softmax; it writes the output and the float32
log-sum-exp of every query row. Backward (custom_vjp), recomputing the probabilities block
by block from the log-sum-exp: when the keys fit one backward key block (up to 128 keys by
default, BERT's usual length), one fused kernel per (example, head) walks the query blocks
once and writes dQ, dK, dV, with D_i = rowsum(dO * O) computed inside; longer keys take
D_i from XLA, then one kernel per key block (dK, dV) and one per query block (dQ). The
output and log-sum-exp the backward pass needs are named "context" and "attention_lse"
for the remat policies.

Dropout: element (b, h, i, j) of the mask is the one `dropout.keep_mask(key, (B_total,
H_total, q_len, kv_len), rate)` draws, bit for bit: row = (b_global * H_total + h_global) *
q_len + i (wrapping uint32), col = j, hash = fmix32((fmix32(row ^ s0) ^ s1) + col * GOLDEN),
kept iff hash >= drop_threshold(rate). The kernels regenerate it from (seeds, offsets, block
position) in the forward and in both backward kernels; nothing mask-sized is stored.
With dropout, O = (P * Z) V with Z = keep * scale, so dV = (P * Z)^T dO, dP = (dO V^T) * Z and
dS = P * (dP - D_i), where D_i = sum_j P_ij dP_ij = dO_i . O_i still holds.

Projection biases (biases=(q_bias, k_bias, v_bias)): q, k, v arrive before their per-head
biases and every kernel adds them to the tiles it loads, rounding as the separate add would,
so the biased projections are never written; the backward kernels also write per-program
float32 column sums of dQ, dK, dV, whose total is the bias gradient.

Sliding window (window > 0): query i attends key j only if |i - j| <= window as well. Each
query block walks only the key blocks that meet its band, and each key block of the dK/dV
kernel only the query blocks that do (kv_block_range, q_block_range); inside a visited block
keys outside the band are -inf. The dropout mask is indexed by global position as above.

Lowered through Triton on GPU; on CPU it runs in Pallas' interpret mode (tests only: slow).
Tests: tests/models/kernels/test_pallas_flash.py (against xla.attention + Dropout(impl="hash")).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import pallas as pl

try:  # jax's Triton-specific Pallas options (num_warps, num_stages); optional
    from jax.experimental.pallas import triton as _triton
except ImportError:  # pragma: no cover - a jax without it compiles with Triton's defaults
    _triton = None

from bert_jax.models.kernels.backend import platform
from bert_jax.models.kernels.dropout_hash import GOLDEN, drop_threshold, fmix32

# A disallowed score is the lowest float32, exactly as in xla.py: exp underflows to 0 next to
# any real score, and a row with no allowed key (all scores equal) is uniform over its keys.
_MASKED = float(np.finfo(np.float32).min)

# The longest key length whose backward pass runs as one fused kernel by default (one key
# block of this many keys; an explicit bwd_block_k / block_k decides instead).
_FUSED_KEYS = 128


def _dot(a, b, trans_a: bool = False, trans_b: bool = False):
    """a @ b of two 2-D blocks (either transposed), accumulated in float32: what
    pallas' dot does, through lax.dot_general, which every Pallas backend lowers."""
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


class _Cfg(NamedTuple):
    """Static parameters of one call (hashable: custom_vjp's nondiff argument)."""
    q_len: int            # unpadded lengths: the dropout row index uses q_len
    kv_len: int
    kv_padded: bool       # keys beyond kv_len were added to fill the last block
    q_scale: float        # sqrt(head_dim) rounded to the compute dtype, as xla.py divides q by
    threshold: int        # dropout drop threshold (uint32); 0 = no dropout
    keep_scale: float     # 1 / (1 - threshold / 2**32) rounded to the compute dtype
    total_heads: int
    fwd_blocks: tuple     # (block_q, block_k) of the forward kernel
    bwd_blocks: tuple     # (block_q, block_k) of the two backward kernels
    num_warps: int        # Triton's settings of the forward kernel
    num_stages: int
    interpret: bool
    window: int = 0       # sliding-window half width; 0 = global
    head_dim: int = 0     # unpadded head dim: the output is sliced to [:, :q_len, :, :head_dim]
    bias: bool = False    # q, k, v arrive before their per-head biases, added on every load
    packed: bool = False  # the fused backward kernel writes dQ, dK, dV as one [.., 3, ..] array
    bwd_num_warps: int = 0   # those of the backward kernels (0: the forward's)
    bwd_num_stages: int = 0


def flash_attention(q, k, v, q_segment_ids, kv_segment_ids, *, biases=None,
                    dropout_rate: float = 0.0, seeds=None, batch_offset=0, head_offset=0,
                    total_heads=None,
                    block_q=None, block_k=None, bwd_block_q=None, bwd_block_k=None,
                    num_warps=None, num_stages=None, interpret=None, window: int = 0,
                    packed_grads: bool = False, bwd_num_warps=None, bwd_num_stages=None):
    """Softmax attention of q over k, v with in-kernel dropout on the probabilities.

    q: <dtype>[batch, q_len, heads, head_dim] (unscaled: the kernel divides by
    sqrt(head_dim)); k, v: <dtype>[batch, kv_len, heads, head_dim]; dtype float32, bfloat16
    or float16. q_segment_ids: <int32>[batch, q_len], kv_segment_ids: <int32>[batch, kv_len]:
    query i may attend key j iff their segment ids are equal (padding: q ones,
    kv = input_mask). dropout_rate in [0, 1); seeds: <uint32>[2] =
    jax.random.bits(dropout_key, (2,), jnp.uint32) (required when dropout_rate > 0).
    batch_offset, head_offset (ints or traced int32 scalars) and total_heads place this call's
    [batch, heads] inside the global array whose hash mask it reproduces (shard_map shards).
    block_q, block_k: powers of two >= 16, the blocks of the forward kernel and, unless
    bwd_block_q / bwd_block_k are given, of the two backward kernels (defaults: 128 x 64
    forward, 64 x 64 backward, 64 x 128 when the keys fit 128: one fused backward kernel);
    a block longer than the (power-of-two rounded) length is cut
    to it, and lengths need not be multiples (padded inside). num_warps (a power of two
    <= 32), num_stages (>= 1): Triton's settings for all three kernels (defaults 4 and 2;
    ignored in interpret mode); bwd_num_warps, bwd_num_stages: those of the backward kernels
    instead (default: as the forward's), whose float32 dK, dV accumulators ([keys, d] each,
    per program) want more warps to stay in registers than the forward's one [bq, d]. None of these change the result beyond summation order.
    interpret: None = interpret mode iff the current trace compiles for CPU
    (kernels.backend.platform()).
    window: 0 = global attention; > 0 (self-attention: q_len == kv_len) = a sliding window,
    query i may attend key j only if |i - j| <= window, on top of the segment rule. Each
    query block walks only the key blocks that meet its band (and each key block of the
    dK/dV kernel only the query blocks that do), so the work grows with the window, not
    with the length. As in xla.attention(window=...), a query with no allowed key in its
    band is the uniform average of the values in its band (the global rule over the band).
    biases: None, or (q_bias, k_bias, v_bias), each <float32>[heads, head_dim]: q, k, v are
    then the projections before their biases, and every kernel adds a bias to each tile it
    loads, (x.astype(float32) + bias).astype(dtype), the rounding of a separate
    add-then-cast. The bias gradients are the float32 sums of dQ, dK, dV (as rounded to the
    dtype) over examples and tokens, each program of the backward kernels summing its own
    rows, so XLA adds only [programs, heads, head_dim] partial sums.
    packed_grads: where the backward pass is the one fused kernel (the keys fit one
    backward block) of self-attention, it writes dQ, dK, dV into one [batch, length, 3,
    heads, head_dim] array and returns its three slices: a caller that stacks them again
    along axis 2 (one product for the Q, K, V projections' input gradient: see
    attention.py) then reads that array as it is, with no concatenation.
    Returns <dtype>[batch, q_len, heads, head_dim]; differentiable in q, k, v (and biases).
    """
    batch, q_len, heads, head_dim = q.shape
    kv_len = k.shape[1]
    if k.shape != (batch, kv_len, heads, head_dim) or v.shape != k.shape:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape}: expected [batch, length, "
                         "heads, head_dim] with equal batch, heads, head_dim and k = v")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (jnp.float32, jnp.bfloat16,
                                                              jnp.float16):
        raise ValueError(f"q, k, v must share a dtype among float32/bfloat16/float16; got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if q_segment_ids.shape != (batch, q_len) or kv_segment_ids.shape != (batch, kv_len):
        raise ValueError(f"segment ids {q_segment_ids.shape}, {kv_segment_ids.shape}; "
                         f"expected {(batch, q_len)}, {(batch, kv_len)}")
    if biases is not None:
        biases = tuple(biases)
        if len(biases) != 3 or any(jnp.shape(b) != (heads, head_dim) for b in biases):
            raise ValueError(f"biases must be (q_bias, k_bias, v_bias), each [heads, "
                             f"head_dim] = {(heads, head_dim)}; got "
                             f"{[jnp.shape(b) for b in biases]}")
    if not _is_int(window) or window < 0:
        raise ValueError(f"window must be an integer >= 0 (0 = global), got {window!r}")
    if window and q_len != kv_len:
        raise ValueError(f"a sliding window is for self-attention: q_len {q_len} != kv_len "
                         f"{kv_len}")
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}")
    threshold = drop_threshold(dropout_rate) if dropout_rate > 0 else 0
    if threshold and seeds is None:
        raise ValueError("dropout_rate > 0 needs seeds: jax.random.bits(key, (2,), uint32)")
    if window >= kv_len - 1:  # every key is within the band of every query: global
        window = 0
    if interpret is None:
        plat = platform()
        if plat not in ("cpu", "gpu"):
            raise ValueError(f"the Pallas flash-attention kernel runs on GPU (or CPU in "
                             f"interpret mode), not {plat}")
        interpret = plat == "cpu"

    fwd_blocks, bwd_blocks, q_pad, kv_pad = _schedule(q_len, kv_len, block_q, block_k,
                                                      bwd_block_q, bwd_block_k)
    num_warps = _tuning("num_warps", num_warps, 4, lambda n: n <= 32 and _pow2(n),
                        "a power of two <= 32")
    num_stages = _tuning("num_stages", num_stages, 2, lambda n: True, "an integer >= 1")
    bwd_num_warps = _tuning("bwd_num_warps", bwd_num_warps, num_warps,
                            lambda n: n <= 32 and _pow2(n), "a power of two <= 32")
    bwd_num_stages = _tuning("bwd_num_stages", bwd_num_stages, num_stages, lambda n: True,
                             "an integer >= 1")
    d_pad = max(16, pl.next_power_of_2(head_dim))  # Triton: power-of-two tiles, dots >= 16
    as_dtype = lambda x: float(np.asarray(x, q.dtype))  # noqa: E731 - round to compute dtype
    cfg = _Cfg(q_len=q_len, kv_len=kv_len, kv_padded=kv_pad != kv_len,
               q_scale=as_dtype(np.sqrt(np.float32(head_dim))),  # == jnp.sqrt(d).astype(dtype)
               threshold=threshold,
               keep_scale=as_dtype(1.0 / (1.0 - threshold / 2.0**32)) if threshold else 1.0,
               total_heads=int(total_heads or heads), fwd_blocks=fwd_blocks,
               bwd_blocks=bwd_blocks, num_warps=num_warps, num_stages=num_stages,
               bwd_num_warps=bwd_num_warps, bwd_num_stages=bwd_num_stages,
               interpret=bool(interpret), window=int(window), head_dim=head_dim,
               bias=biases is not None,
               packed=bool(packed_grads) and q_len == kv_len and kv_pad == bwd_blocks[1])

    if threshold:
        seeds = jnp.asarray(seeds)
        if seeds.shape != (2,) or seeds.dtype != jnp.uint32:
            raise ValueError(f"seeds must be <uint32>[2], got {seeds.dtype}{seeds.shape}")
        offsets = [jnp.asarray(o).astype(jnp.uint32) for o in (batch_offset, head_offset)]
        # named as the seeds are (dropout.draw_seeds): a policy keeping them keeps these
        params = checkpoint_name(jnp.stack([seeds[0], seeds[1], *offsets]), "dropout_seeds")
    else:
        params = jnp.zeros((4,), jnp.uint32)

    # Padded query rows compute something finite and are sliced off (their cotangent is 0, so
    # they add nothing to dK, dV); padded keys are excluded by index (score -inf, below
    # _MASKED), so even a row with no allowed key averages exactly the kv_len real values.
    def pad4(x, n):
        return jnp.pad(x, ((0, 0), (0, n - x.shape[1]), (0, 0), (0, d_pad - head_dim)))

    def pad2(x, n):
        return jnp.pad(x.astype(jnp.int32), ((0, 0), (0, n - x.shape[1])))

    if biases is not None:  # zero on the padded head-dim columns, which stay zero
        # one [3, heads, d] operand: one small kernel makes it from a layer's parameters,
        # where three operands would be three (the kernels read each through its own spec)
        biases = jnp.pad(jnp.stack([jnp.asarray(b).astype(jnp.float32) for b in biases]),
                         ((0, 0), (0, 0), (0, d_pad - head_dim)))
    return _flash(pad4(q, q_pad), pad4(k, kv_pad), pad4(v, kv_pad), biases,
                  pad2(q_segment_ids, q_pad), pad2(kv_segment_ids, kv_pad), params, cfg)


def packs_grads(length: int, *, block_q=None, block_k=None, bwd_block_q=None,
                bwd_block_k=None, num_warps=None, num_stages=None, bwd_num_warps=None,
                bwd_num_stages=None) -> bool:
    """Whether self-attention over `length` tokens with these options runs the one fused
    backward kernel, which flash_attention(..., packed_grads=True) has write dQ, dK, dV as
    one array."""
    _, bwd, _, kv_pad = _schedule(length, length, block_q, block_k, bwd_block_q, bwd_block_k)
    return kv_pad == bwd[1]


def _schedule(q_len, kv_len, block_q, block_k, bwd_block_q, bwd_block_k):
    """(fwd_blocks, bwd_blocks, q_pad, kv_pad): the (block_q, block_k) of the forward and
    of the backward kernels and the lengths padded to a multiple of both."""
    fwd_blocks = (_block("block_q", block_q, 128, q_len),
                  _block("block_k", block_k, 64, kv_len))
    # Keys that fit _FUSED_KEYS make one backward key block by default: the fused backward
    # kernel then reads every input once (see _fused_bwd_kernel).
    bwd_k_default = _FUSED_KEYS if kv_len <= _FUSED_KEYS else 64
    bwd_blocks = (_block("bwd_block_q", bwd_block_q or block_q, 64, q_len),
                  _block("bwd_block_k", bwd_block_k or block_k, bwd_k_default, kv_len))
    q_pad = _round_up(q_len, max(fwd_blocks[0], bwd_blocks[0]))
    kv_pad = _round_up(kv_len, max(fwd_blocks[1], bwd_blocks[1]))
    return fwd_blocks, bwd_blocks, q_pad, kv_pad


def visited_blocks(length: int, window: int = 0, *, block_q=None, block_k=None,
                   bwd_block_q=None, bwd_block_k=None) -> dict:
    """What the three kernels of a self-attention call over `length` tokens visit, per
    (example, head): {"fwd", "dq", "dkdv"}: (block_q, block_k, visited block pairs,
    block pairs in the grid)}. For estimates of the work a window saves (benchmarks)."""
    fwd, bwd, q_pad, kv_pad = _schedule(length, length, block_q, block_k, bwd_block_q,
                                        bwd_block_k)
    cfg = _Cfg(q_len=length, kv_len=length, kv_padded=False, q_scale=1.0, threshold=0,
               keep_scale=1.0, total_heads=1, fwd_blocks=fwd, bwd_blocks=bwd, num_warps=4,
               num_stages=2, interpret=True, window=0 if window >= length - 1 else window)

    def count(outer, inner, n_outer, n_inner, bounds):
        ranges = (bounds(i * outer, outer, inner, n_inner, cfg) for i in range(n_outer))
        return sum(int(hi) - int(lo) for lo, hi in ranges)

    grid = lambda bq, bk: (q_pad // bq) * (kv_pad // bk)  # noqa: E731
    return {
        "fwd": (*fwd, count(fwd[0], fwd[1], q_pad // fwd[0], kv_pad // fwd[1], kv_block_range),
                grid(*fwd)),
        "dq": (*bwd, count(bwd[0], bwd[1], q_pad // bwd[0], kv_pad // bwd[1], kv_block_range),
               grid(*bwd)),
        "dkdv": (*bwd, count(bwd[1], bwd[0], kv_pad // bwd[1], q_pad // bwd[0], q_block_range),
                 grid(*bwd)),
    }


def _pow2(n) -> bool:
    return n > 0 and not n & (n - 1)


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _block(name, requested, default, length):
    """The block along a length: `requested` (None = `default`), cut to the length rounded
    up to a power of two (>= 16: Triton's smallest dot), so a block size set for long
    sequences does not pad short ones."""
    size = default
    if requested is not None:
        if not _is_int(requested) or requested < 16 or not _pow2(requested):
            raise ValueError(f"block sizes must be powers of two >= 16, got "
                             f"{name}={requested!r}")
        size = requested
    return min(size, max(16, pl.next_power_of_2(length)))


def _tuning(name, requested, default, ok, what):
    if requested is None:
        return default
    if not _is_int(requested) or requested < 1 or not ok(requested):
        raise ValueError(f"{name} must be {what}, got {requested!r}")
    return requested


def _round_up(n, m):
    return -(-n // m) * m


# ---------------------------------------------------------------- shared in-kernel pieces


def _split_refs(refs, cfg):
    """(params_ref, (q, k, v bias vectors or Nones), the other refs) of a kernel's
    arguments: the bias refs (<f32>[d] each) follow params_ref when cfg.bias."""
    if not cfg.bias:
        return refs[0], (None, None, None), refs[1:]
    return refs[0], tuple(r[...] for r in refs[1:4]), refs[4:]


def _biased(x, bias):
    """A loaded [n, d] tile plus its per-column bias in float32, rounded back to the
    tile's dtype, as a separate bias add would (bias None: the tile itself)."""
    if bias is None:
        return x
    return (x.astype(jnp.float32) + bias[None, :]).astype(x.dtype)


def _bias_grad(refs, grads):
    """Writes each <f32>[d] column sum of `grads` (tiles already rounded to the output
    dtype) to its ref of `refs` (none when the call has no biases)."""
    for ref, g in zip(refs, grads):
        ref[...] = jnp.sum(g.astype(jnp.float32), axis=0)


def _scaled_q(q, cfg):
    """q / sqrt(head_dim) in the compute dtype, as xla.py (exact multiply for powers of 2)."""
    c = cfg.q_scale
    return q * (1.0 / c) if math.log2(c).is_integer() else q / c


def _scores(q, k, q_seg, k_seg, q_start, k_start, cfg):
    """<f32>[bq, bk] scores q k^T (float32 accumulation) with disallowed keys at _MASKED and
    padded keys (index >= kv_len) and keys outside the window at -inf, and the
    <bool>[bq, bk] segment mask."""
    s = _dot(q, k, trans_b=True)
    allowed = q_seg[:, None] == k_seg[None, :]
    s = jnp.where(allowed, s, _MASKED)
    if cfg.kv_padded:
        col = k_start + lax.broadcasted_iota(jnp.int32, (1, s.shape[1]), 1)
        s = jnp.where(col < cfg.kv_len, s, -jnp.inf)
    if cfg.window:
        s = jnp.where(_in_band(q_start, s.shape[0], k_start, s.shape[1], cfg), s, -jnp.inf)
    return s, allowed


# Sliding window. A query row i has the band |r - j| <= window with r = min(i, q_len - 1):
# the rows added to fill the last query block borrow the last real row's band, so that every
# row, added ones included, has a real key in its band (its own position) and stays finite.
# Keys outside the band are -inf, not _MASKED: a row with no allowed key in its band (a
# padding query far from the real tokens) is then uniform over its band, as in xla.py,
# whatever the blocks visited.


def _band_rows(q_start, n, cfg):
    """<int32>[n, 1]: the band centres r of the rows q_start .. q_start + n - 1."""
    return jnp.minimum(q_start + lax.broadcasted_iota(jnp.int32, (n, 1), 0), cfg.q_len - 1)


def _in_band(q_start, bq, k_start, bk, cfg):
    """<bool>[bq, bk]: key k_start + c lies in the band of row q_start + r."""
    cols = k_start + lax.broadcasted_iota(jnp.int32, (1, bk), 1)
    rows = _band_rows(q_start, bq, cfg)
    return (cols >= rows - cfg.window) & (cols <= rows + cfg.window)


def kv_block_range(q_start, bq, bk, n_blocks, cfg):
    """(first, end): the key blocks (of bk keys, n_blocks in all) that the query block of
    rows q_start .. q_start + bq - 1 visits: all of them for global attention, else those
    that meet [first row - window, last row + window] (band centres, real keys only). Works
    on Python ints and traced int32 scalars alike."""
    if not cfg.window:
        return 0, n_blocks
    first = jnp.minimum(q_start, cfg.q_len - 1)
    last = jnp.minimum(q_start + bq - 1, cfg.q_len - 1)
    # Non-negative operands: lax.div (truncating) is the floor division, and lowers in
    # every Pallas backend.
    lo = lax.div(jnp.maximum(first - cfg.window, 0), bk)
    hi = lax.div(jnp.minimum(last + cfg.window, cfg.kv_len - 1), bk) + 1
    return lo, hi


def q_block_range(k_start, bk, bq, n_blocks, cfg):
    """(first, end): the query blocks (of bq rows, n_blocks in all) that the dK/dV kernel's
    key block k_start .. k_start + bk - 1 visits: all for global attention, else those
    holding a real row whose band meets the key block. Rows added to fill the last query
    block are skipped where they are alone in a block: their output cotangent is zero, so
    they add exactly nothing to dK and dV."""
    if not cfg.window:
        return 0, n_blocks
    lo_row = jnp.maximum(k_start - cfg.window, 0)
    hi_row = jnp.minimum(k_start + bk - 1 + cfg.window, cfg.q_len - 1)
    lo = lax.div(lo_row, bq)
    return lo, jnp.where(lo_row <= hi_row, lax.div(hi_row, bq) + 1, lo)


def _row_hashes(params_ref, b, h, q_start, bq, cfg):
    """<uint32>[bq]: fmix32(row ^ s0) ^ s1 for the block's global hash rows."""
    u32 = lambda x: jnp.asarray(x).astype(jnp.uint32)  # noqa: E731
    s0, s1, b_off, h_off = (params_ref[n] for n in range(4))
    base = ((u32(b) + b_off) * np.uint32(cfg.total_heads) + u32(h) + h_off) * np.uint32(cfg.q_len)
    rows = base + u32(q_start + lax.iota(jnp.int32, bq))
    return fmix32(rows ^ s0) ^ s1


def _keep(row_hash, k_start, bk, cfg):
    """<bool>[bq, bk]: True where dropout keeps the element (dropout.keep_mask's hash)."""
    cols = (k_start + lax.iota(jnp.int32, bk)).astype(jnp.uint32) * np.uint32(GOLDEN)
    return fmix32(row_hash[:, None] + cols[None, :]) >= np.uint32(cfg.threshold)


def _probs(s, lse, q_start, cfg):
    """<f32>[bq, bk] probabilities from the forward's log-sum-exp. A row with no allowed key
    has lse = _MASKED + log(n) == _MASKED in float32 (log(n) is far below half an ulp), so
    exp(s - lse) = 1 on its n keys (all kv_len keys, or those of its band): it is rescaled
    to the reference's 1/n. No real row has lse == _MASKED (its lse is >= its largest
    allowed score > _MASKED)."""
    if cfg.window:
        r = _band_rows(q_start, s.shape[0], cfg)[:, 0]
        n = (jnp.minimum(r + cfg.window, cfg.kv_len - 1) - jnp.maximum(r - cfg.window, 0) + 1)
        inv = jnp.where(lse == _MASKED, 1.0 / n.astype(jnp.float32), 1.0)
    else:
        inv = jnp.where(lse == _MASKED, float(np.float32(1) / np.float32(cfg.kv_len)), 1.0)
    return jnp.exp(s - lse[:, None]) * inv[:, None]


def _compiler_params(cfg, backward: bool = False):
    """Triton's settings of the forward kernel, or with `backward` of the backward ones."""
    params = (getattr(_triton, "CompilerParams", None)
              or getattr(_triton, "TritonCompilerParams", None))
    if params is None or cfg.interpret:  # pragma: no cover
        return None
    if backward:
        return params(num_warps=cfg.bwd_num_warps or cfg.num_warps,
                      num_stages=cfg.bwd_num_stages or cfg.num_stages)
    return params(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


# ------------------------------------------------------------------------------ forward


def _fwd_kernel(*refs, cfg):
    """One (query block, example, head). [q_bias, k_bias, v_bias: <f32>[d] when cfg.bias];
    q_ref: [bq, d]; k_ref, v_ref: [kv_pad, d]; qseg_ref: [bq]; kseg_ref: [kv_pad]. Writes
    o_ref: [bq, d], lse_ref: <f32>[bq]."""
    params_ref, (b_q, b_k, b_v), refs = _split_refs(refs, cfg)
    q_ref, k_ref, v_ref, qseg_ref, kseg_ref, o_ref, lse_ref = refs
    bq, bk = cfg.fwd_blocks
    qi, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q = _scaled_q(_biased(q_ref[...], b_q), cfg)
    q_seg = qseg_ref[...]
    row_hash = _row_hashes(params_ref, b, h, qi * bq, bq, cfg) if cfg.threshold else None

    def body(j, carry):
        acc, m, l = carry
        ks = pl.ds(j * bk, bk)
        v = _biased(v_ref[ks, :], b_v)
        s, _ = _scores(q, _biased(k_ref[ks, :], b_k), q_seg, kseg_ref[ks], qi * bq, j * bk,
                       cfg)
        # Online softmax in float32 (m: running max, l: running sum of exp(s - m)). Globally
        # the first key block holds key 0 (a real key, score >= _MASKED), so m is finite from
        # then on and exp(-inf - m) = 0 rescales the empty initial state. With a window a
        # row's band may start in a later block than the first one visited: until then its
        # m stays -inf and is taken as 0, so that exp(-inf - 0) = 0 instead of NaN.
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if cfg.window else m_new
        alpha = jnp.exp(m - m_use)
        p = jnp.exp(s - m_use[:, None])
        l = alpha * l + jnp.sum(p, axis=1)
        # Probabilities go to the compute dtype before dropout and the P.V product, as in the
        # reference; 1/l and the dropout scale are applied to the float32 accumulator at the
        # end (the same product, up to rounding of the compute dtype).
        pv = p.astype(v.dtype)
        if cfg.threshold:
            pv = jnp.where(_keep(row_hash, j * bk, bk, cfg), pv, 0)
        acc = acc * alpha[:, None] + _dot(pv, v)
        return acc, m_new, l

    init = (jnp.zeros(o_ref.shape, jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
            jnp.zeros((bq,), jnp.float32))
    lo, hi = kv_block_range(qi * bq, bq, bk, k_ref.shape[0] // bk, cfg)
    acc, m, l = lax.fori_loop(lo, hi, body, init)
    o_ref[...] = (acc * (cfg.keep_scale / l)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l)


def _bias_args(biases, index_map, d):
    """(in_specs, arrays) of the q, k, v biases, <f32>[3, heads, d], for a grid whose
    index_map returns the head's block: the array three times, each spec its row; nothing
    without biases."""
    if biases is None:
        return [], []
    specs = [pl.BlockSpec((None, None, d), lambda *g, j=j: (j, *index_map(*g)))
             for j in range(3)]
    return specs, [biases] * 3


def _forward(q, k, v, biases, q_seg, kv_seg, params, cfg):
    """Padded inputs -> (o: [batch, q_pad, heads, d_pad], lse: <f32>[batch, heads, q_pad])."""
    batch, q_pad, heads, d = q.shape
    kv_pad = k.shape[1]
    bq, _ = cfg.fwd_blocks
    kv_spec = pl.BlockSpec((None, kv_pad, None, d), lambda i, b, h: (b, 0, h, 0))
    q_spec = pl.BlockSpec((None, bq, None, d), lambda i, b, h: (b, i, h, 0))
    bias_specs, bias_arrays = _bias_args(biases, lambda i, b, h: (h, 0), d)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, cfg=cfg),
        grid=(q_pad // bq, batch, heads),
        in_specs=[pl.BlockSpec((4,), lambda i, b, h: (0,)), *bias_specs, q_spec, kv_spec,
                  kv_spec, pl.BlockSpec((None, bq), lambda i, b, h: (b, i)),
                  pl.BlockSpec((None, kv_pad), lambda i, b, h: (b, 0))],
        out_specs=[q_spec, pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, q_pad), jnp.float32)],
        compiler_params=_compiler_params(cfg), interpret=cfg.interpret,
        name="flash_attention_fwd",
    )(params, *bias_arrays, q, k, v, q_seg, kv_seg)


# ----------------------------------------------------------------------------- backward
#
# With biases, each backward program also writes the float32 column sums of the dQ, dK or dV
# rows it wrote (as rounded): the bias gradients are then a sum over [programs, heads, d]
# instead of a pass of XLA over the whole gradients. Rows and columns added by the padding
# have zero gradients (dO is zero there, and padded keys get neither probability nor dS), so
# they add nothing to the sums.


def _dkdv_kernel(*refs, cfg):
    """One (key block, example, head). [q, k, v biases: <f32>[d] when cfg.bias]; q_ref,
    do_ref: [q_pad, d]; k_ref, v_ref: [bk, d]; qseg_ref: [q_pad]; kseg_ref: [bk]; lse_ref,
    delta_ref: <f32>[q_pad]. Writes dk, dv [and the column sums of each, <f32>[d]]."""
    params_ref, (b_q, b_k, b_v), refs = _split_refs(refs, cfg)
    (q_ref, k_ref, v_ref, qseg_ref, kseg_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
     *db_refs) = refs
    bq, bk = cfg.bwd_blocks
    kj, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    k, v, k_seg = _biased(k_ref[...], b_k), _biased(v_ref[...], b_v), kseg_ref[...]

    def body(i, carry):
        dk, dv = carry
        qs = pl.ds(i * bq, bq)
        q, do = _scaled_q(_biased(q_ref[qs, :], b_q), cfg), do_ref[qs, :]
        s, allowed = _scores(q, k, qseg_ref[qs], k_seg, i * bq, kj * bk, cfg)
        p = _probs(s, lse_ref[qs], i * bq, cfg)
        pv = p.astype(v.dtype)
        dp = _dot(do, v, trans_b=True)  # d(P * Z), float32
        if cfg.threshold:
            keep = _keep(_row_hashes(params_ref, b, h, i * bq, bq, cfg), kj * bk, bk, cfg)
            pv = jnp.where(keep, pv, 0)
            dp = jnp.where(keep, dp * cfg.keep_scale, 0.0)  # dP = d(P * Z) * Z
        dv = dv + _dot(pv, do, trans_a=True)  # keep_scale applied once at the end
        # Disallowed entries get no gradient (xla.py's where): in a row with no allowed key
        # P is uniform, not 0, so the select matters there.
        ds = jnp.where(allowed, p * (dp - delta_ref[qs][:, None]), 0.0)
        dk = dk + _dot(ds.astype(q.dtype), q, trans_a=True)
        return dk, dv

    zeros = jnp.zeros(dk_ref.shape, jnp.float32)
    lo, hi = q_block_range(kj * bk, bk, bq, q_ref.shape[0] // bq, cfg)
    dk, dv = lax.fori_loop(lo, hi, body, (zeros, zeros))
    dk = dk.astype(dk_ref.dtype)  # q was scaled already: dK = dS^T (q / sqrt(d))
    dv = (dv * cfg.keep_scale).astype(dv_ref.dtype)
    dk_ref[...], dv_ref[...] = dk, dv
    _bias_grad(db_refs, (dk, dv))


def _dq_kernel(*refs, cfg):
    """One (query block, example, head). [q, k, v biases: <f32>[d] when cfg.bias]; q_ref,
    do_ref: [bq, d]; k_ref, v_ref: [kv_pad, d]; qseg_ref: [bq]; kseg_ref: [kv_pad]; lse_ref,
    delta_ref: <f32>[bq]. Writes dq [and its column sums, <f32>[d]]."""
    params_ref, (b_q, b_k, b_v), refs = _split_refs(refs, cfg)
    (q_ref, k_ref, v_ref, qseg_ref, kseg_ref, do_ref, lse_ref, delta_ref, dq_ref,
     *db_refs) = refs
    bq, bk = cfg.bwd_blocks
    qi, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q, do, q_seg = _scaled_q(_biased(q_ref[...], b_q), cfg), do_ref[...], qseg_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    row_hash = _row_hashes(params_ref, b, h, qi * bq, bq, cfg) if cfg.threshold else None

    def body(j, dq):
        ks = pl.ds(j * bk, bk)
        k = _biased(k_ref[ks, :], b_k)
        s, allowed = _scores(q, k, q_seg, kseg_ref[ks], qi * bq, j * bk, cfg)
        p = _probs(s, lse, qi * bq, cfg)
        dp = _dot(do, _biased(v_ref[ks, :], b_v), trans_b=True)
        if cfg.threshold:
            keep = _keep(row_hash, j * bk, bk, cfg)
            dp = jnp.where(keep, dp * cfg.keep_scale, 0.0)
        ds = jnp.where(allowed, p * (dp - delta[:, None]), 0.0)
        return dq + _dot(ds.astype(k.dtype), k)

    lo, hi = kv_block_range(qi * bq, bq, bk, k_ref.shape[0] // bk, cfg)
    dq = lax.fori_loop(lo, hi, body, jnp.zeros(dq_ref.shape, jnp.float32))
    dq = (dq / cfg.q_scale).astype(dq_ref.dtype)  # chain rule through q / sqrt(d)
    dq_ref[...] = dq
    _bias_grad(db_refs, (dq,))


def _fused_bwd_kernel(*refs, cfg):
    """One (example, head) whose keys are one backward key block: dQ, dK and dV together.
    [q, k, v biases: <f32>[d] when cfg.bias]; q_ref, do_ref, o_ref: [q_pad, d]; k_ref,
    v_ref: [kv_pad, d]; qseg_ref: [q_pad]; kseg_ref: [kv_pad]; lse_ref: <f32>[q_pad]. Walks
    the query blocks once: each block's dQ is complete (no other key block adds to it) and is
    written at once, while dK and dV accumulate over the blocks in float32. D_i =
    rowsum(dO_i * O_i) is computed here from the block's rows (each read once), instead of
    by a separate pass over O and dO. With biases it also writes the column sums of dQ, dK
    and dV (<f32>[d] each).

    Every query block is visited, with a window too: rows added to fill the last block have
    a zero cotangent (dO = 0, so D = 0 and dS = 0) and add exactly zero to dK and dV, and
    their dQ rows, sliced off later, are zero."""
    params_ref, (b_q, b_k, b_v), refs = _split_refs(refs, cfg)
    q_ref, k_ref, v_ref, qseg_ref, kseg_ref, do_ref, o_ref, lse_ref, *refs = refs
    if cfg.packed:  # one [length, 3, d] block: dQ, dK, dV at 0, 1, 2 of its middle axis
        (dqkv_ref, *db_refs), out_dtype = refs, refs[0].dtype

        def store(j, rows, x):
            dqkv_ref[rows, j, :] = x
    else:
        dq_ref, dk_ref, dv_ref, *db_refs = refs
        out_dtype = dq_ref.dtype

        def store(j, rows, x):
            (dq_ref, dk_ref, dv_ref)[j][rows, :] = x
    bq, _ = cfg.bwd_blocks
    d = q_ref.shape[1]
    b, h = pl.program_id(0), pl.program_id(1)
    k, v, k_seg = _biased(k_ref[...], b_k), _biased(v_ref[...], b_v), kseg_ref[...]

    def body(i, carry):
        dk, dv, dq_sum = carry
        qs = pl.ds(i * bq, bq)
        q, do = _scaled_q(_biased(q_ref[qs, :], b_q), cfg), do_ref[qs, :]
        delta = jnp.sum(o_ref[qs, :].astype(jnp.float32) * do.astype(jnp.float32), axis=1)
        s, allowed = _scores(q, k, qseg_ref[qs], k_seg, i * bq, 0, cfg)
        p = _probs(s, lse_ref[qs], i * bq, cfg)
        pv = p.astype(v.dtype)
        dp = _dot(do, v, trans_b=True)
        if cfg.threshold:
            keep = _keep(_row_hashes(params_ref, b, h, i * bq, bq, cfg), 0, k.shape[0], cfg)
            pv = jnp.where(keep, pv, 0)
            dp = jnp.where(keep, dp * cfg.keep_scale, 0.0)
        dv = dv + _dot(pv, do, trans_a=True)
        ds = jnp.where(allowed, p * (dp - delta[:, None]), 0.0).astype(q.dtype)
        dk = dk + _dot(ds, q, trans_a=True)
        dq = (_dot(ds, k) / cfg.q_scale).astype(out_dtype)
        store(0, qs, dq)
        if cfg.bias:
            dq_sum = dq_sum + jnp.sum(dq.astype(jnp.float32), axis=0)
        return dk, dv, dq_sum

    zeros = jnp.zeros(k_ref.shape, jnp.float32)
    dk, dv, dq_sum = lax.fori_loop(0, q_ref.shape[0] // bq, body,
                                   (zeros, zeros, jnp.zeros((d,), jnp.float32)))
    dk = dk.astype(out_dtype)
    dv = (dv * cfg.keep_scale).astype(out_dtype)
    every = pl.ds(0, k_ref.shape[0])
    store(1, every, dk)
    store(2, every, dv)
    if cfg.bias:  # one [3, d] block: the q, k, v bias gradients' partial sums
        db_ref, = db_refs
        db_ref[0, :] = dq_sum
        db_ref[1, :] = jnp.sum(dk.astype(jnp.float32), axis=0)
        db_ref[2, :] = jnp.sum(dv.astype(jnp.float32), axis=0)


def _fused_backward(cfg, q, k, v, biases, q_seg, kv_seg, params, o, lse, do):
    """dq, dk, dv in one kernel, one program per (example, head): keys fit one block. With
    biases also their <f32>[batch, 3, heads, d] partial gradients (q, k, v)."""
    batch, q_pad, heads, d = q.shape
    kv_pad = k.shape[1]
    full = lambda n: pl.BlockSpec((None, n, None, d), lambda b, h: (b, 0, h, 0))  # noqa: E731
    seg = lambda n: pl.BlockSpec((None, n), lambda b, h: (b, 0))  # noqa: E731
    bias_specs, bias_arrays = _bias_args(biases, lambda b, h: (h, 0), d)
    with_bias = biases is not None
    db_specs = [pl.BlockSpec((None, 3, None, d), lambda b, h: (b, 0, h, 0))] * with_bias
    db_shapes = [jax.ShapeDtypeStruct((batch, 3, heads, d), jnp.float32)] * with_bias
    if cfg.packed:  # one output, [batch, length, 3, heads, d]; its slices are dQ, dK, dV
        grad_specs = [pl.BlockSpec((None, q_pad, 3, None, d), lambda b, h: (b, 0, 0, h, 0))]
        grad_shapes = [jax.ShapeDtypeStruct((batch, q_pad, 3, heads, d), q.dtype)]
    else:
        grad_specs = [full(q_pad), full(kv_pad), full(kv_pad)]
        grad_shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    dqkv, *partials = pl.pallas_call(
        functools.partial(_fused_bwd_kernel, cfg=cfg),
        grid=(batch, heads),
        in_specs=[pl.BlockSpec((4,), lambda b, h: (0,)), *bias_specs, full(q_pad),
                  full(kv_pad), full(kv_pad), seg(q_pad), seg(kv_pad), full(q_pad),
                  full(q_pad), pl.BlockSpec((None, None, q_pad), lambda b, h: (b, h, 0))],
        out_specs=[*grad_specs, *db_specs],
        out_shape=[*grad_shapes, *db_shapes],
        compiler_params=_compiler_params(cfg, backward=True), interpret=cfg.interpret,
        name="flash_attention_bwd_fused",
    )(params, *bias_arrays, q, k, v, q_seg, kv_seg, do, o, lse)
    if cfg.packed:
        return (dqkv[:, :, 0], dqkv[:, :, 1], dqkv[:, :, 2], *partials)
    return (dqkv, *partials)


def _backward(cfg, res, do):
    """o, do: the unpadded [batch, q_len, heads, head_dim] output and its cotangent."""
    q, k, v, biases, q_seg, kv_seg, params, o, lse = res
    batch, q_pad, heads, d = q.shape
    kv_pad = k.shape[1]
    bq, bk = cfg.bwd_blocks
    do = do.astype(q.dtype)

    def pad(x):  # padded rows and columns of dO are zero: they add nothing to dQ, dK, dV
        if x.shape == q.shape:
            return x
        return jnp.pad(x, ((0, 0), (0, q_pad - x.shape[1]), (0, 0), (0, d - x.shape[3])))

    def bias_grads(partials):  # [..., heads, d] partial sums (q, k, v) -> [3, heads, d]
        if biases is None:
            return None
        return jnp.stack([x.reshape(-1, heads, d).sum(0) for x in partials])

    if kv_pad == bk:
        dq, dk, dv, *partials = _fused_backward(cfg, q, k, v, biases, q_seg, kv_seg, params,
                                                pad(o), lse, pad(do))
        db = None if biases is None else jnp.sum(partials[0], axis=0)  # [3, heads, d]
        return dq, dk, dv, db, None, None, None
    # D_i = rowsum(dO * O) (FlashAttention-2); valid with dropout (see the module doc); 0 on
    # padded rows. One XLA pass here: each key block of the dK/dV kernel walks all query
    # rows, so computing it inside would read O once per key block.
    delta = jnp.einsum("bqhd,bqhd->bhq", o.astype(jnp.float32), do.astype(jnp.float32))
    delta = jnp.pad(delta, ((0, 0), (0, 0), (0, q_pad - delta.shape[2])))
    do = pad(do)
    full = lambda n: pl.BlockSpec((None, n, None, d), lambda x, b, h: (b, 0, h, 0))  # noqa: E731
    part = lambda n: pl.BlockSpec((None, n, None, d), lambda x, b, h: (b, x, h, 0))  # noqa: E731
    seg_full = lambda n: pl.BlockSpec((None, n), lambda x, b, h: (b, 0))  # noqa: E731
    seg_part = lambda n: pl.BlockSpec((None, n), lambda x, b, h: (b, x))  # noqa: E731
    row_full = pl.BlockSpec((None, None, q_pad), lambda x, b, h: (b, h, 0))
    row_part = pl.BlockSpec((None, None, bq), lambda x, b, h: (b, h, x))
    params_spec = pl.BlockSpec((4,), lambda x, b, h: (0,))
    bias_specs, bias_arrays = _bias_args(biases, lambda x, b, h: (h, 0), d)
    args = (params, *bias_arrays, q, k, v, q_seg, kv_seg, do, lse, delta)
    db_spec = pl.BlockSpec((None, None, None, d), lambda x, b, h: (x, b, h, 0))
    db_shape = lambda n: jax.ShapeDtypeStruct((n, batch, heads, d), jnp.float32)  # noqa: E731
    with_bias = biases is not None
    common = dict(compiler_params=_compiler_params(cfg, backward=True),
                  interpret=cfg.interpret)

    dk, dv, *kv_partials = pl.pallas_call(
        functools.partial(_dkdv_kernel, cfg=cfg),
        grid=(kv_pad // bk, batch, heads),
        in_specs=[params_spec, *bias_specs, full(q_pad), part(bk), part(bk), seg_full(q_pad),
                  seg_part(bk), full(q_pad), row_full, row_full],
        out_specs=[part(bk), part(bk), *[db_spec] * (2 * with_bias)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype),
                   *[db_shape(kv_pad // bk)] * (2 * with_bias)],
        name="flash_attention_bwd_dkdv", **common,
    )(*args)
    dq, *q_partials = pl.pallas_call(
        functools.partial(_dq_kernel, cfg=cfg),
        grid=(q_pad // bq, batch, heads),
        in_specs=[params_spec, *bias_specs, part(bq), full(kv_pad), full(kv_pad), seg_part(bq),
                  seg_full(kv_pad), part(bq), row_part, row_part],
        out_specs=[part(bq), *[db_spec] * with_bias],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), *[db_shape(q_pad // bq)] * with_bias],
        name="flash_attention_bwd_dq", **common,
    )(*args)
    return dq, dk, dv, bias_grads(q_partials + kv_partials), None, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _flash(q, k, v, biases, q_seg, kv_seg, params, cfg):
    """The [batch, q_len, heads, head_dim] attention output of padded inputs (see
    flash_attention)."""
    return _unpad(_forward(q, k, v, biases, q_seg, kv_seg, params, cfg)[0], cfg)


def _unpad(o, cfg):
    if o.shape[1] == cfg.q_len and o.shape[3] == cfg.head_dim:
        return o
    return o[:, :cfg.q_len, :, :cfg.head_dim]


def _flash_fwd(q, k, v, biases, q_seg, kv_seg, params, cfg):
    # The backward pass needs the output and the float32 log-sum-exp. Named, so that a remat
    # policy that keeps "context" (the output, which the attention layer then uses
    # unnamed: see kernels.attention.names_context) and "attention_lse" keeps them, instead of
    # running this kernel again in the backward pass. With biases it keeps q, k, v as given,
    # before their biases: the kernels add them again on every load.
    o, lse = _forward(q, k, v, biases, q_seg, kv_seg, params, cfg)
    o, lse = checkpoint_name(_unpad(o, cfg), "context"), checkpoint_name(lse, "attention_lse")
    return o, (q, k, v, biases, q_seg, kv_seg, params, o, lse)


_flash.defvjp(_flash_fwd, _backward)
