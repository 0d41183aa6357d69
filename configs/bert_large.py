"""BERT-Large (L=24, H=1024, A=16, 340M params), the paper's recipe."""

import ml_collections

from bert_jax.models.config import model_config


def get_config(arg=None):
    del arg
    config = ml_collections.ConfigDict()
    config.model = model_config(
        vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, scan_layers=True)
    return config
