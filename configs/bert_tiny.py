"""BERT-Tiny (L=2, H=128, A=2): the quick start and the tests, on CPU in minutes."""

import ml_collections

from bert_jax.models.config import model_config


def get_config(arg=None):
    del arg
    config = ml_collections.ConfigDict()
    config.model = model_config(
        vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=512, max_position_embeddings=512)
    return config
