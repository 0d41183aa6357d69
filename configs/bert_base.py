"""BERT-Base (L=12, H=768, A=12, 110M params), the paper's recipe."""

import ml_collections

from bert_jax.models.config import model_config


def get_config(arg=None):
    del arg
    config = ml_collections.ConfigDict()
    config.model = model_config(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072)
    return config
