"""The XLA attention path: scores, float32 softmax, dropout on the probabilities, values.
The reference every other path is tested against (tests/models/test_attention_ops.py)."""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp


def attention(q, k, v, kv_mask, *, dropout: Optional[Callable] = None):
    """q, k, v: <dtype>[batch, length, heads, kv] (q unscaled); kv_mask: <bool>[batch,
    q_length or 1, k_length] (True = the query may attend to the key); dropout: probs ->
    probs (None: no dropout). Returns <dtype>[batch, q_length, heads, kv]."""
    q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
    # Masked keys get the lowest float32: exp underflows to exactly 0, and a row with no
    # allowed key at all (an all-padding eval filler) stays finite (uniform).
    scores = jnp.where(kv_mask[:, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    if dropout is not None:
        probs = dropout(probs)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)
