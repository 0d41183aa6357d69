"""What every Pallas flash-attention kernel computes on one tile: the product (dot), q
scaled as the XLA path scales it, the projection biases added as a separate add would round
them, the scores with the segment, padding and sliding-window masks, the dropout mask from
the shared hash (kernels/dropout_hash.py: bit for bit the one dropout.keep_mask draws), and
the probabilities regenerated from the forward's log-sum-exp. Shapes: a tile is [bq, bk]
(scores, probabilities) of a [bq, d] query block and a [bk, d] key block."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from bert_jax.models.kernels.dropout_hash import GOLDEN, fmix32

# A disallowed score is the lowest float32, exactly as in xla.py: exp underflows to 0 next to
# any real score, and a row with no allowed key (all scores equal) is uniform over its keys.
MASKED = float(np.finfo(np.float32).min)


def dot(a, b, trans_a: bool = False, trans_b: bool = False):
    """a @ b of two 2-D blocks (either transposed), accumulated in float32: what
    pallas' dot does, through lax.dot_general, which every Pallas backend lowers."""
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def split_refs(refs, cfg):
    """(params_ref, (q, k, v bias vectors or Nones), the other refs) of a kernel's
    arguments: the bias refs (<f32>[d] each) follow params_ref when cfg.bias."""
    if not cfg.bias:
        return refs[0], (None, None, None), refs[1:]
    return refs[0], tuple(r[...] for r in refs[1:4]), refs[4:]


def biased(x, bias):
    """A loaded [n, d] tile plus its per-column bias in float32, rounded back to the
    tile's dtype, as a separate bias add would (bias None: the tile itself)."""
    if bias is None:
        return x
    return (x.astype(jnp.float32) + bias[None, :]).astype(x.dtype)


def bias_grad(refs, grads):
    """Writes each <f32>[d] column sum of `grads` (tiles already rounded to the output
    dtype) to its ref of `refs` (none when the call has no biases)."""
    for ref, g in zip(refs, grads):
        ref[...] = jnp.sum(g.astype(jnp.float32), axis=0)


def scaled_q(q, cfg):
    """q / sqrt(head_dim) in the compute dtype, as xla.py (exact multiply for powers of 2)."""
    c = cfg.q_scale
    return q * (1.0 / c) if math.log2(c).is_integer() else q / c


def scores(q, k, q_seg, k_seg, q_start, k_start, cfg):
    """<f32>[bq, bk] scores q k^T (float32 accumulation) with disallowed keys at MASKED and
    padded keys (index >= kv_len) and keys outside the window at -inf, and the
    <bool>[bq, bk] segment mask."""
    s = dot(q, k, trans_b=True)
    allowed = q_seg[:, None] == k_seg[None, :]
    s = jnp.where(allowed, s, MASKED)
    if cfg.kv_padded:
        col = k_start + lax.broadcasted_iota(jnp.int32, (1, s.shape[1]), 1)
        s = jnp.where(col < cfg.kv_len, s, -jnp.inf)
    if cfg.window:
        s = jnp.where(_in_band(q_start, s.shape[0], k_start, s.shape[1], cfg), s, -jnp.inf)
    return s, allowed


# Sliding window. A query row i has the band |r - j| <= window with r = min(i, q_len - 1):
# the rows added to fill the last query block borrow the last real row's band, so that every
# row, added ones included, has a real key in its band (its own position) and stays finite.
# Keys outside the band are -inf, not MASKED: a row with no allowed key in its band (a
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


def row_hashes(params_ref, b, h, q_start, bq, cfg):
    """<uint32>[bq]: fmix32(row ^ s0) ^ s1 for the block's global hash rows."""
    u32 = lambda x: jnp.asarray(x).astype(jnp.uint32)  # noqa: E731
    s0, s1, b_off, h_off = (params_ref[n] for n in range(4))
    base = ((u32(b) + b_off) * np.uint32(cfg.total_heads) + u32(h) + h_off) * np.uint32(cfg.q_len)
    rows = base + u32(q_start + lax.iota(jnp.int32, bq))
    return fmix32(rows ^ s0) ^ s1


def keep_tile(row_hash, k_start, bk, cfg):
    """<bool>[bq, bk]: True where dropout keeps the element (dropout.keep_mask's hash)."""
    cols = (k_start + lax.iota(jnp.int32, bk)).astype(jnp.uint32) * np.uint32(GOLDEN)
    return fmix32(row_hash[:, None] + cols[None, :]) >= np.uint32(cfg.threshold)


def probs(s, lse, q_start, cfg):
    """<f32>[bq, bk] probabilities from the forward's log-sum-exp. A row with no allowed key
    has lse = MASKED + log(n) == MASKED in float32 (log(n) is far below half an ulp), so
    exp(s - lse) = 1 on its n keys (all kv_len keys, or those of its band): it is rescaled
    to the reference's 1/n. No real row has lse == MASKED (its lse is >= its largest
    allowed score > MASKED)."""
    if cfg.window:
        r = _band_rows(q_start, s.shape[0], cfg)[:, 0]
        n = (jnp.minimum(r + cfg.window, cfg.kv_len - 1) - jnp.maximum(r - cfg.window, 0) + 1)
        inv = jnp.where(lse == MASKED, 1.0 / n.astype(jnp.float32), 1.0)
    else:
        inv = jnp.where(lse == MASKED, float(np.float32(1) / np.float32(cfg.kv_len)), 1.0)
    return jnp.exp(s - lse[:, None]) * inv[:, None]
