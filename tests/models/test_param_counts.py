"""Parameter counts of the paper's models, through jax.eval_shape (nothing is allocated)."""

import jax
import jax.numpy as jnp
import pytest

from bert_jax.models import BertConfig, BertForPreTraining, BertModel, count_params

BASE = BertConfig()
LARGE = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                   intermediate_size=4096)


def _count(model, **kw):
    ids = jnp.zeros((1, 8), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids, **kw))
    return count_params(shapes["params"])


@pytest.mark.parametrize("config, encoder, pretraining", [
    (BASE, 109_482_240, 110_106_428),
    (LARGE, 335_141_888, 336_226_108),
])
@pytest.mark.parametrize("scan", [False, True])
def test_counts(config, encoder, pretraining, scan):
    config = config.replace(scan_layers=scan)
    assert _count(BertModel(config)) == encoder
    # The MLM decoder is tied to the word embeddings: counted once.
    positions = jnp.zeros((1, 2), jnp.int32)
    assert _count(BertForPreTraining(config), masked_lm_positions=positions) == pretraining
