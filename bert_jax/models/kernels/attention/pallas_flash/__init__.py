"""Flash attention in Pallas with the hash attention-probability dropout inside the kernel.

    o = flash_attention(q, k, v, q_segment_ids, kv_segment_ids, dropout_rate=0.1,
                        seeds=jax.random.bits(dropout_key, (2,), jnp.uint32))

The numerics of the XLA reference (kernels/attention/xla.py) with FlashAttention-2's
schedule: the [q, k] probabilities never leave the kernel. Forward: one program per (query
block, example, head) walks the key blocks with an online softmax; it writes the output and
the float32 log-sum-exp of every query row. Backward (custom_vjp), recomputing the
probabilities block by block from the log-sum-exp: when the keys fit one backward key block
(up to 128 keys by default, BERT's usual length), one fused kernel per (example, head) walks
the query blocks once and writes dQ, dK, dV, with D_i = rowsum(dO * O) computed inside;
longer keys take D_i from XLA, then one kernel per key block (dK, dV) and one per query
block (dQ). The output and log-sum-exp the backward pass needs are named "context" and
"attention_lse" for the remat policies.

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
Where each part is: this file, the entry point and its checks, the custom_vjp; tiling.py,
the blocks, padding and sliding-window loop bounds; masks.py, the arithmetic on one tile
(scores, masks, the dropout hash, probabilities); forward.py and backward.py, the kernels.
Tests: tests/models/kernels/test_pallas_flash.py (against xla.attention +
Dropout(impl="hash")).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import pallas as pl

from bert_jax.models.kernels.attention.pallas_flash.backward import backward
from bert_jax.models.kernels.attention.pallas_flash.forward import forward
from bert_jax.models.kernels.attention.pallas_flash.tiling import (
    Cfg, is_int, pow2, schedule, tuning, visited_blocks)
from bert_jax.models.kernels.backend import platform
from bert_jax.models.kernels.dropout_hash import drop_threshold

__all__ = ["flash_attention", "packs_grads", "visited_blocks"]


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
    per program) want more warps to stay in registers than the forward's one [bq, d]. None
    of these change the result beyond summation order.
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
    if not is_int(window) or window < 0:
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

    fwd_blocks, bwd_blocks, q_pad, kv_pad = schedule(q_len, kv_len, block_q, block_k,
                                                     bwd_block_q, bwd_block_k)
    num_warps = tuning("num_warps", num_warps, 4, lambda n: n <= 32 and pow2(n),
                       "a power of two <= 32")
    num_stages = tuning("num_stages", num_stages, 2, lambda n: True, "an integer >= 1")
    bwd_num_warps = tuning("bwd_num_warps", bwd_num_warps, num_warps,
                           lambda n: n <= 32 and pow2(n), "a power of two <= 32")
    bwd_num_stages = tuning("bwd_num_stages", bwd_num_stages, num_stages, lambda n: True,
                            "an integer >= 1")
    d_pad = max(16, pl.next_power_of_2(head_dim))  # Triton: power-of-two tiles, dots >= 16
    as_dtype = lambda x: float(np.asarray(x, q.dtype))  # noqa: E731 - round to compute dtype
    cfg = Cfg(q_len=q_len, kv_len=kv_len, kv_padded=kv_pad != kv_len,
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
    # MASKED), so even a row with no allowed key averages exactly the kv_len real values.
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
    _, bwd, _, kv_pad = schedule(length, length, block_q, block_k, bwd_block_q, bwd_block_k)
    return kv_pad == bwd[1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _flash(q, k, v, biases, q_seg, kv_seg, params, cfg):
    """The [batch, q_len, heads, head_dim] attention output of padded inputs (see
    flash_attention)."""
    return _unpad(forward(q, k, v, biases, q_seg, kv_seg, params, cfg)[0], cfg)


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
    o, lse = forward(q, k, v, biases, q_seg, kv_seg, params, cfg)
    o, lse = checkpoint_name(_unpad(o, cfg), "context"), checkpoint_name(lse, "attention_lse")
    return o, (q, k, v, biases, q_seg, kv_seg, params, o, lse)


_flash.defvjp(_flash_fwd, backward)
