"""jax's Pallas splash attention for TPU (`jax.experimental.pallas.ops.tpu.splash_attention`),
without dropout: the `pallas` path on a TPU.

Padding is given as segment ids (queries 1, keys their input_mask; packed rows: their sequence
ids for both); lengths are padded to a multiple of the 128-lane block inside. A row with no real key at all (an eval filler) is
let attend to its first key, so that its output and gradients stay finite: splash's backward
is not defined for a fully masked row. Such rows carry zero weight. Not yet run on TPU
hardware here: tests/models/kernels/test_attention.py checks it in interpret mode on CPU.

A sliding window (window > 0) is splash's LocalMask((window, window)) on every head, so splash
skips the blocks outside the band; segment ids still apply inside it. With a window a padding
query far from the real tokens would have no allowed key, so in padding rows the padding
tokens get segment id 0 as queries too: they attend the padding keys of their band (their
own among them) and the real tokens see only real keys. Padding queries' outputs carry zero
weight, so only they differ from xla.py's (which averages their band uniformly).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_LANES = 128


def attention(q, k, v, kv_mask, *, interpret: bool = False, window: int = 0):
    """q, k, v: <dtype>[batch, length, heads, kv] (q unscaled); kv_mask: <bool>[batch,
    length] (True = real token), or <int32>[batch, length] sequence ids of packed rows.
    window: 0 = global, > 0 = query i attends key j only if |i - j| <= window as well.
    Returns <dtype>[batch, length, heads, kv]."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    batch, length, heads, head_dim = q.shape
    if window >= length - 1:  # every key is within the band of every query: global
        window = 0
    q = q / jnp.sqrt(head_dim).astype(q.dtype)  # as xla.py scales
    kv_seg = kv_mask.astype(jnp.int32)
    packed = jnp.issubdtype(kv_mask.dtype, jnp.integer)
    if packed or window:  # every query has a key: itself
        q_seg = kv_seg
    else:
        q_seg = jnp.ones_like(kv_seg)
        empty = jnp.sum(kv_seg, axis=-1, keepdims=True) == 0
        kv_seg = jnp.where(empty & (jnp.arange(length)[None, :] == 0), 1, kv_seg)
    padded = -(-length // _LANES) * _LANES
    pad = padded - length
    if pad:
        q, k, v = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q, k, v))
        # Added queries and keys get an id of their own: no real query sees an added key,
        # and every added query (sliced off below) has keys, so it stays finite.
        kv_seg = jnp.pad(kv_seg, ((0, 0), (0, pad)), constant_values=-1)
        q_seg = jnp.pad(q_seg, ((0, 0), (0, pad)), constant_values=-1)
    block = min(512, padded) if padded % 512 == 0 else _LANES
    sizes = sk.BlockSizes(block_q=block, block_kv_compute=block, block_kv=block,
                          block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                          block_q_dq=block, block_kv_dq=block)
    kernel = sk.make_splash_mha(sm.MultiHeadMask([head_mask(padded, window)] * heads),
                                block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                interpret=interpret)
    seg = sk.SegmentIds(q=q_seg, kv=kv_seg)
    heads_major = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    out = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=s))(
        heads_major(q), heads_major(k), heads_major(v), seg)
    return heads_major(out)[:, :length]


def head_mask(length: int, window: int = 0):
    """One head's static splash mask for [length, length]: FullMask globally, LocalMask with
    the band |i - j| <= window for a sliding window (splash skips the blocks outside it)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    if window < 0:
        raise ValueError(f"window must be >= 0 (0 = global), got {window}")
    if not window:
        return sm.FullMask((length, length))
    return sm.LocalMask((length, length), window_size=(window, window), offset=0)
