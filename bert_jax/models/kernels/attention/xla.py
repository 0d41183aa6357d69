"""The XLA attention path: scores, float32 softmax, dropout on the probabilities, values.
The reference every other path is tested against (tests/models/kernels/test_attention.py)."""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp


def band_mask(length: int, window: int):
    """<bool>[length, length]: True where query row i may see key j under a sliding window
    of half width `window`, i.e. |i - j| <= window (window=0: all True, global attention).
    The band that attention(..., window=window) applies."""
    pos = jnp.arange(length)
    if not window:
        return jnp.ones((length, length), bool)
    return jnp.abs(pos[:, None] - pos[None, :]) <= window


def attention(q, k, v, kv_mask, *, dropout: Optional[Callable] = None, window: int = 0):
    """q, k, v: <dtype>[batch, length, heads, kv] (q unscaled); kv_mask: <bool>[batch,
    q_length or 1, k_length] (True = the query may attend to the key); dropout: probs ->
    probs (None: no dropout); window: 0 = global, > 0 = a sliding window on top of kv_mask:
    query i may also attend key j only if |i - j| <= window (band_mask; self-attention,
    q_length == k_length). Returns <dtype>[batch, q_length, heads, kv].

    A query with no allowed key (padding far from any real token, an all-padding row) is
    the uniform average of the values it could see without kv_mask: all keys, or those of
    its band. Passing kv_mask & band_mask(length, window) with window=0 gives the same
    result on every query that has an allowed key in its band."""
    if window < 0:
        raise ValueError(f"window must be >= 0 (0 = global), got {window}")
    if window and q.shape[1] != k.shape[1]:
        raise ValueError(f"a sliding window is for self-attention: {q.shape[1]} queries, "
                         f"{k.shape[1]} keys")
    q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
    # Masked keys get the lowest float32: exp underflows to exactly 0, and a row with no
    # allowed key at all (an all-padding eval filler) stays finite (uniform).
    scores = jnp.where(kv_mask[:, None, :, :], scores, jnp.finfo(jnp.float32).min)
    if window:
        # Keys outside the band are -inf, below the masked ones, so that a row with no
        # allowed key is uniform over its band only; its own key keeps every row finite.
        scores = jnp.where(band_mask(q.shape[1], window), scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    if dropout is not None:
        probs = dropout(probs)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)
