"""Task heads. Each takes encoder outputs and returns float logits; losses live in tasks/."""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax.numpy as jnp

from bert_jax.models.config import BertConfig
from bert_jax.models.dropout import Dropout
from bert_jax.models.layers import activation, add_bias, dense, layer_norm, zeros_init


def gather_positions(sequence, positions):
    """sequence: [batch, length, embed], positions: <int>[batch, P] -> [batch, P, embed]."""
    return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


class MaskedLMHead(nn.Module):
    """Dense + activation + LayerNorm transform, then the decoder tied to the word
    embeddings plus an output bias. Called on the gathered masked positions only, so the
    [*, vocab] projection costs P, not L, rows per example."""

    config: BertConfig

    @nn.compact
    def __call__(self, hidden, attend: Callable):
        """hidden: [batch, P, embed] -> <dtype>[batch, P, vocab]."""
        c = self.config
        h = dense(c, c.hidden_size, ("embed", "mlp"), "transform", c.use_bias, "out")(hidden)
        h = activation(c.hidden_act)(h)
        h = layer_norm(c, "transform_norm")(h)
        logits = attend(h)
        bias = self.param("output_bias", zeros_init(("vocab",)), (c.vocab_size,), c.storage_dtype)
        return add_bias(logits, bias)  # a float32 bias gradient under bfloat16 compute


class ClassifierHead(nn.Module):
    """Dropout + Dense(num_labels): the one extra output layer of the paper's fine-tuning.
    Used on the pooled [CLS] (sequence tasks, NSP, multiple choice) or every position
    (token tasks, span QA)."""

    config: BertConfig
    num_labels: int
    dropout: bool = True

    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        if self.dropout:
            x = Dropout(rate=self.config.hidden_dropout_prob,
                        impl=self.config.dropout_rng)(x, deterministic=deterministic)
        return dense(self.config, self.num_labels, ("embed", "classes"), "dense",
                     role="classifier")(x)
