"""model.init_scheme="modernbert": each weight's init std follows transformers'
ModernBertPreTrainedModel._init_weights, written out here (initializer_range r = 0.02,
L layers, hidden H): query / key / value, the FFN input and gate, and the word embeddings
N(0, r); the attention and FFN outputs and the MLM transform N(0, r / sqrt(2 L)); a
classifier head N(0, H ** -0.5); each truncated at +-2 std (its initializer_cutoff_factor).
The default ("bert") keeps r for every weight."""

from __future__ import annotations

import math

import flax
import jax
import numpy as np
import pytest

from bert_jax.models.bert import BertForPreTraining
from bert_jax.models.config import BertConfig, ConfigError
from bert_jax.models.heads import ClassifierHead
from bert_jax.train.state import dummy_inputs

R, L, H = 0.02, 4, 128
# The standard deviation of N(0, 1) truncated to [-2, 2].
PHI2 = math.exp(-2.0) / math.sqrt(2 * math.pi)
TRUNCATED = math.sqrt(1 - 2 * 2 * PHI2 / math.erf(2 / math.sqrt(2)))


def _config(scheme: str) -> BertConfig:
    return BertConfig(vocab_size=1000, hidden_size=H, num_hidden_layers=L,
                      num_attention_heads=2, intermediate_size=256, max_position_embeddings=64,
                      position_embedding="rotary", ffn_type="geglu", use_bias=False,
                      norm_bias=False, pre_ln=True, layer0_attention_norm=False,
                      pooler=False, type_vocab_size=0, init_scheme=scheme)


def _weights(config: BertConfig) -> dict:
    params = BertForPreTraining(config, nsp=False).init(jax.random.key(0),
                                                        **dummy_inputs(8, 2))["params"]
    flat = flax.traverse_util.flatten_dict(flax.linen.meta.unbox(params), sep="/")
    return {k: np.asarray(v) for k, v in flat.items() if k.endswith(("kernel", "embedding"))}


def _role(key: str) -> str:
    if key.endswith(("attention/output/kernel", "/output/kernel", "mlm/transform/kernel")):
        return "out"
    return "in"


@pytest.mark.parametrize("scheme", ["modernbert", "bert"])
def test_init_std_per_tensor_type_follows_the_formula(scheme):
    weights = _weights(_config(scheme))
    want = {"in": R, "out": R / math.sqrt(2 * L) if scheme == "modernbert" else R}
    roles = {_role(k) for k in weights}
    assert roles == {"in", "out"}
    assert sum(_role(k) == "out" for k in weights) == 2 * L + 1   # 2 per layer + the MLM transform
    for key, w in sorted(weights.items()):
        std = want[_role(key)]
        # >= 16k samples each: the sample std is within 3% of the truncated normal's.
        assert w.std() == pytest.approx(std * TRUNCATED, rel=0.03), key
        assert np.abs(w).max() <= 2 * std * (1 + 1e-6), key
        assert np.abs(w).max() > 1.9 * std, key                     # cut at 2 std, not less


def test_classifier_head_std_is_hidden_to_the_minus_half():
    for scheme, std in (("modernbert", H ** -0.5), ("bert", R)):
        head = ClassifierHead(_config(scheme), 512, dropout=False)
        params = flax.linen.meta.unbox(head.init(jax.random.key(1), np.zeros((1, H),
                                                                             np.float32)))
        kernel = np.asarray(params["params"]["dense"]["kernel"])
        assert kernel.std() == pytest.approx(std * TRUNCATED, rel=0.03), scheme


def test_unknown_scheme_is_refused():
    with pytest.raises(ConfigError, match="init_scheme='xavier'"):
        BertConfig(init_scheme="xavier")
