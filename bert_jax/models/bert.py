"""BertModel (embeddings + encoder + pooler) and the models with heads."""

from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp

from bert_jax.models.config import BertConfig
from bert_jax.models.embeddings import BertEmbeddings, restart_positions
from bert_jax.models.encoder import BertEncoder
from bert_jax.models.heads import ClassifierHead, MaskedLMHead, gather_positions
from bert_jax.models.layers import dense


class BertModel(nn.Module):
    """The encoder. Returns (sequence_output [batch, length, embed],
    pooled_output [batch, embed] = tanh(dense([CLS])), or [batch, K, embed] at
    `cls_positions`; with `pooler=False` the [CLS] hidden state itself).

    Packed rows (several sequences per row, each `[CLS] A [SEP] B [SEP]`): `sequence_ids`
    <int>[batch, length] numbers the sequences of a row 1, 2, ... (0 = padding); attention
    never crosses sequences, positions restart at every sequence (unless `position_ids`
    are given) and `cls_positions` <int>[batch, K] picks each sequence's [CLS] for the
    pooler. A sequence then gets the outputs it gets alone in a row of its own."""

    config: BertConfig

    def setup(self):
        c = self.config
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        if c.pooler:
            self.pooler = dense(c, c.hidden_size, ("embed", "mlp"), "pooler", c.use_bias, "out")

    def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
                 position_ids: Optional[jnp.ndarray] = None, deterministic: bool = True,
                 sequence_ids: Optional[jnp.ndarray] = None,
                 cls_positions: Optional[jnp.ndarray] = None):
        """input_ids, attention_mask (1 = token, 0 = padding), token_type_ids:
        <int>[batch, length]; sequence_ids, cls_positions: packed rows (class doc)."""
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if sequence_ids is not None:
            mask = sequence_ids.astype(jnp.int32)  # the attention's packed-row form
            if position_ids is None:
                position_ids = restart_positions(mask)
        else:
            mask = (jnp.ones_like(input_ids) if attention_mask is None
                    else attention_mask).astype(bool)
        x = self.embeddings(input_ids, token_type_ids, position_ids, deterministic=deterministic)
        rotary = position_ids if self.config.position_embedding == "rotary" else None
        x = self.encoder(x, mask, deterministic=deterministic, positions=rotary)
        cls = x[:, 0] if cls_positions is None else gather_positions(x, cls_positions)
        pooled = jnp.tanh(self.pooler(cls)) if self.config.pooler else cls
        return x, pooled

    def attend(self, x):
        return self.embeddings.attend(x)


class BertForPreTraining(nn.Module):
    """MLM (+ NSP unless nsp=False). Returns (mlm_logits [batch, P, vocab],
    nsp_logits [batch, 2] or None). With masked_lm_positions=None the MLM head runs on
    every position (P = length). Packed rows (BertModel's doc): sequence_ids,
    position_ids, and next_sentence_positions <int>[batch, K] (each sequence's [CLS]),
    which make nsp_logits [batch, K, 2]."""

    config: BertConfig
    nsp: bool = True

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
                 masked_lm_positions=None, deterministic: bool = True, sequence_ids=None,
                 position_ids=None, next_sentence_positions=None):
        bert = BertModel(self.config, name="bert")
        sequence, pooled = bert(input_ids, attention_mask, token_type_ids, position_ids,
                                deterministic=deterministic, sequence_ids=sequence_ids,
                                cls_positions=next_sentence_positions)
        if masked_lm_positions is not None:
            sequence = gather_positions(sequence, masked_lm_positions)
        mlm_logits = MaskedLMHead(self.config, name="mlm")(sequence, bert.attend)
        nsp_logits = None
        if self.nsp:
            nsp_logits = ClassifierHead(self.config, 2, dropout=False, name="nsp")(pooled)
        return mlm_logits, nsp_logits


class BertForSequenceClassification(nn.Module):
    """Logits [batch, num_labels] on the pooled [CLS]; num_labels=1 is regression (STS-B)."""

    config: BertConfig
    num_labels: int

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
                 deterministic: bool = True):
        _, pooled = BertModel(self.config, name="bert")(
            input_ids, attention_mask, token_type_ids, deterministic=deterministic)
        return ClassifierHead(self.config, self.num_labels, name="classifier")(
            pooled, deterministic=deterministic)


class BertForTokenClassification(nn.Module):
    """Logits [batch, length, num_labels] at every position (NER)."""

    config: BertConfig
    num_labels: int

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
                 deterministic: bool = True):
        sequence, _ = BertModel(self.config, name="bert")(
            input_ids, attention_mask, token_type_ids, deterministic=deterministic)
        return ClassifierHead(self.config, self.num_labels, name="classifier")(
            sequence, deterministic=deterministic)


class BertForQuestionAnswering(nn.Module):
    """Span QA: (start_logits, end_logits), each [batch, length]."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
                 deterministic: bool = True):
        sequence, _ = BertModel(self.config, name="bert")(
            input_ids, attention_mask, token_type_ids, deterministic=deterministic)
        logits = ClassifierHead(self.config, 2, dropout=False, name="qa_outputs")(sequence)
        return logits[..., 0], logits[..., 1]


class BertForMultipleChoice(nn.Module):
    """Inputs [batch, choices, length]; logits [batch, choices] (one score per choice, the
    paper's SWAG head: a vector dotted with each choice's pooled [CLS]). Any leading dims
    are flattened into the encoder's batch and restored ([batch, length] -> [batch], as
    init with a single placeholder sequence calls it)."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None,
                 deterministic: bool = True):
        lead, length = input_ids.shape[:-1], input_ids.shape[-1]
        flat = lambda a: None if a is None else a.reshape(-1, length)  # noqa: E731
        _, pooled = BertModel(self.config, name="bert")(
            flat(input_ids), flat(attention_mask), flat(token_type_ids),
            deterministic=deterministic)
        scores = ClassifierHead(self.config, 1, name="classifier")(
            pooled, deterministic=deterministic)
        return scores.reshape(lead)
