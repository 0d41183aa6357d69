"""Word + position + token-type embeddings, LayerNorm, dropout."""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.config import BertConfig
from bert_jax.models.dropout import Dropout
from bert_jax.models.layers import layer_norm, weight_init


def restart_positions(sequence_ids):
    """Position of every token within its own sequence: <int>[batch, length] sequence ids of
    packed rows (each sequence one contiguous run) -> <int32>[batch, length], 0 at the first
    token of every run. Padding (id 0) counts as a run of its own."""
    ids = sequence_ids.astype(jnp.int32)
    index = jax.lax.broadcasted_iota(jnp.int32, ids.shape, 1)
    first = jnp.concatenate([jnp.ones_like(ids[:, :1], bool), ids[:, 1:] != ids[:, :-1]], 1)
    return index - jax.lax.cummax(jnp.where(first, index, 0), axis=1)


class BertEmbeddings(nn.Module):
    config: BertConfig

    def setup(self):
        c = self.config
        embed = lambda n, axes, name: nn.Embed(  # noqa: E731
            n, c.hidden_size, dtype=c.compute_dtype, param_dtype=c.storage_dtype,
            embedding_init=weight_init(c, axes), name=name)
        self.word_embeddings = embed(c.vocab_size, ("vocab", "embed"), "word_embeddings")
        self.position_embeddings = embed(
            c.max_position_embeddings, ("length", "embed"), "position_embeddings")
        self.token_type_embeddings = embed(
            c.type_vocab_size, ("classes", "embed"), "token_type_embeddings")
        self.norm = layer_norm(c, "LayerNorm")
        self.dropout = Dropout(rate=c.hidden_dropout_prob, impl=c.dropout_rng)

    def __call__(self, input_ids, token_type_ids, position_ids: Optional[jnp.ndarray] = None,
                 deterministic: bool = True):
        """input_ids, token_type_ids: <int>[batch, length]; position_ids: <int>[batch or 1,
        length] (default 0 .. length - 1) -> <dtype>[batch, length, embed]."""
        length = input_ids.shape[-1]
        if length > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {length} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}")
        if position_ids is None:
            position_ids = jnp.arange(length, dtype=jnp.int32)[None, :]
        x = (self.word_embeddings(input_ids)
             + self.position_embeddings(position_ids)
             + self.token_type_embeddings(token_type_ids))
        x = self.norm(x)
        x = self.dropout(x, deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))

    def attend(self, x):
        """Tied decoder: <dtype>[..., embed] -> <dtype>[..., vocab] = x @ word_embeddings.T."""
        return self.word_embeddings.attend(x)
