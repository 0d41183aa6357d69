"""Multi-head self-attention with a padding mask; softmax in float32."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.config import BertConfig
from bert_jax.models.dropout import Dropout
from bert_jax.models.layers import weight_init, zeros_init


class BertSelfAttention(nn.Module):
    """Projections are [embed] -> [heads, kv] DenseGenerals so that tensor parallelism can
    shard heads without reshapes; the Hugging Face / TF layout is a reshape of these."""

    config: BertConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, mask):
        """x: <dtype>[batch, length, embed]; mask: <bool>[batch, length] (True = real token)."""
        c = self.config
        proj = lambda name: nn.DenseGeneral(  # noqa: E731
            features=(c.num_attention_heads, c.head_dim), axis=-1,
            dtype=c.compute_dtype, param_dtype=c.storage_dtype,
            kernel_init=weight_init(c, ("embed", "heads", "kv")),
            bias_init=zeros_init(("heads", "kv")), name=name)
        q = proj("query")(x)  # [batch, q_length, heads, kv]
        k = proj("key")(x)
        v = proj("value")(x)
        q = q / jnp.sqrt(c.head_dim).astype(q.dtype)

        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32)
        # Padded keys get the lowest float32: exp underflows to exactly 0, and a row with
        # no real key at all (an all-padding eval filler) stays finite (uniform).
        scores = jnp.where(mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(c.compute_dtype)
        probs = Dropout(rate=c.attention_probs_dropout_prob, impl=c.dropout_rng)(
            probs, deterministic=self.deterministic)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        ctx = nn.with_logical_constraint(ctx, ("batch", "length", "heads", "kv"))

        return nn.DenseGeneral(
            features=c.hidden_size, axis=(-2, -1),
            dtype=c.compute_dtype, param_dtype=c.storage_dtype,
            kernel_init=weight_init(c, ("heads", "kv", "embed")),
            bias_init=zeros_init(("embed",)), name="output")(ctx)
