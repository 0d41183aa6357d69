"""BERT in flax.linen: config, encoder and every head."""

from bert_jax.models.bert import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bert_jax.models.config import BertConfig, ConfigError
from bert_jax.models.params import count_params, stack_layers, unstack_layers

__all__ = [
    "BertConfig", "ConfigError", "BertModel", "BertForPreTraining",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
    "BertForMultipleChoice", "count_params", "stack_layers", "unstack_layers",
]
