"""cuDNN's fused flash attention (GPU, bfloat16 / float16), without dropout.

Global attention only: `jax.nn.dot_product_attention` describes a two-sided
`local_window_size` (its XLA implementation applies |i - j| <= window for (window, window)),
but its cuDNN implementation takes only a left (causal) window and raises for a right one,
so a sliding-window layer cannot run here (attention_ops.resolve refuses it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def attention(q, k, v, kv_mask):
    """q, k, v: <half>[batch, length, heads, kv] (q unscaled); kv_mask: <bool>[batch,
    k_length], True for the real tokens, which must come first (BERT's trailing padding).
    Returns <half>[batch, q_length, heads, kv].

    Padding is given to cuDNN as key lengths. A row with no real token (an eval filler) is
    given length 1 so that its output stays finite; such rows carry zero weight."""
    lengths = jnp.maximum(jnp.sum(kv_mask.astype(jnp.int32), axis=-1), 1)
    return jax.nn.dot_product_attention(
        q, k, v, scale=float(q.shape[-1]) ** -0.5, key_value_seq_lengths=lengths,
        implementation="cudnn")
