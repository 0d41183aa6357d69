"""Word + position + token-type embeddings (positions and token types optional), LayerNorm,
dropout."""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.config import BertConfig
from bert_jax.models.dropout import Dropout
from bert_jax.models.kernels.backend import platform
from bert_jax.models.layers import layer_norm, weight_init


def restart_positions(sequence_ids):
    """Position of every token within its own sequence: <int>[batch, length] sequence ids of
    packed rows (each sequence one contiguous run) -> <int32>[batch, length], 0 at the first
    token of every run. Padding (id 0) counts as a run of its own."""
    ids = sequence_ids.astype(jnp.int32)
    index = jax.lax.broadcasted_iota(jnp.int32, ids.shape, 1)
    first = jnp.concatenate([jnp.ones_like(ids[:, :1], bool), ids[:, 1:] != ids[:, :-1]], 1)
    return index - jax.lax.cummax(jnp.where(first, index, 0), axis=1)


def select_rows(table, ids):
    """table[ids] for a table of a few rows, as a chain of selects: its gradient is one
    masked sum per row instead of a scatter-add of every position into a few rows (which
    a GPU serializes). ids: <int>[...] -> [..., features]; ids outside the table get row 0."""
    ids = ids[..., None]
    out = jnp.broadcast_to(table[0], ids.shape[:-1] + table.shape[1:])
    for t in range(1, table.shape[0]):
        out = jnp.where(ids == t, table[t], out)
    return out


class BertEmbeddings(nn.Module):
    """The three lookups read rows of the float32 tables, which are added and normalised
    in float32; only the LayerNorm's output is in the compute dtype. Under bfloat16
    compute the tables' gradients are then float32 sums, as PyTorch's autocast keeps them
    (nn.Embed casts the whole table to the compute dtype before the gather, which makes
    the word table's gradient a bfloat16 scatter-add). The token types are selected, not
    gathered, except in float32 on CPU (see __call__)."""

    config: BertConfig

    def setup(self):
        c = self.config
        embed = lambda n, axes, name: nn.Embed(  # noqa: E731
            n, c.hidden_size, dtype=c.compute_dtype, param_dtype=c.storage_dtype,
            embedding_init=weight_init(c, axes, "embedding"), name=name)
        self.word_embeddings = embed(c.vocab_size, ("vocab", "embed"), "word_embeddings")
        # Rotary positions live in the attention; type_vocab_size=0 has no segment table.
        if c.position_embedding == "learned":
            self.position_embeddings = embed(
                c.max_position_embeddings, ("length", "embed"), "position_embeddings")
        if c.type_vocab_size:
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
        c = self.config
        wide = jnp.promote_types(c.storage_dtype, jnp.float32)
        rows = lambda embed, ids: jnp.take(embed.embedding, ids, axis=0).astype(wide)  # noqa: E731
        x = rows(self.word_embeddings, input_ids)
        if c.position_embedding == "learned":
            x = x + rows(self.position_embeddings, position_ids)
        if c.type_vocab_size:
            types = self.token_type_embeddings
            if c.compute_dtype == jnp.float32 and platform() == "cpu":
                # The gather, as always: its gradient's summation order, the scatter's, is
                # the one every float32 CPU run so far took (bit for bit).
                token_type = rows(types, token_type_ids)
            else:
                token_type = select_rows(types.embedding.astype(wide), token_type_ids)
            x = x + token_type
        x = self.norm(x)
        x = self.dropout(x, deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))

    def attend(self, x):
        """Tied decoder: <dtype>[..., embed] -> <dtype>[..., vocab] = x @ word_embeddings.T."""
        return self.word_embeddings.attend(x)
