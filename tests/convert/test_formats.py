"""The format objects (bert_jax/convert/formats.py): for every source, a random tree of every
tensor it names (ModernBERT with its bias rows, which no golden has) is written in the
source's layout with the shapes the kinds promise before any read, and read back bit for
bit; the readers and writers pick the format from the config or config.json."""

from __future__ import annotations

import flax
import numpy as np
import pytest

from bert_jax.convert import hf_files, tensors
from bert_jax.convert.hf import BERT
from bert_jax.convert.hf_modernbert import MODERNBERT, config_from_hf
from bert_jax.convert.tf import TF1
from bert_jax.models.config import BertConfig

BERT_CONFIG = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=24,
                         max_position_embeddings=32)
MODERN_CONFIG = config_from_hf({
    "model_type": "modernbert", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
    "num_hidden_layers": 3, "num_attention_heads": 4, "max_position_embeddings": 32,
    "attention_bias": True, "mlp_bias": True, "classifier_bias": True, "norm_bias": True,
    "local_attention": 8, "global_attn_every_n_layers": 3})
CASES = {"tf1": (TF1, BERT_CONFIG), "bert": (BERT, BERT_CONFIG),
         "modernbert": (MODERNBERT, MODERN_CONFIG)}


def random_tree(fmt, config) -> dict:
    """Every tensor `fmt` names for `config`, random (a 3-label classifier where it has one)."""
    shapes = tensors.our_shapes(config)
    h = config.hidden_size
    shapes.update({("classifier", "dense", "kernel"): (h, 3),
                   ("classifier", "dense", "bias"): (3,)})
    rng = np.random.default_rng(0)
    flat = {path: rng.normal(size=shapes[path]).astype(np.float32)
            for _, path, _ in fmt.rows(config)}
    return flax.traverse_util.unflatten_dict(flat)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_row_round_trips_bit_exact(case):
    fmt, config = CASES[case]
    params = random_tree(fmt, config)
    fmt.check_writable(params, config)
    state = fmt.arrays(params, config)
    flat = flax.traverse_util.flatten_dict(params)
    rows = fmt.rows(config, fmt.export_prefix(params))
    for name, path, kind in rows:  # the shapes the importer checks, before any read
        assert state[name].shape == kind.source_shape(flat[path].shape, config), name
    available = {name: state[name].shape for name in state}
    planned, report = fmt.plan(available, config, case)
    back = flax.traverse_util.flatten_dict(
        tensors.read_params(planned, state.__getitem__, config, report))
    assert sorted(back) == sorted(flat)
    for path, value in flat.items():
        assert back[path].dtype == value.dtype and np.array_equal(back[path], value), path
    tied = sorted(set(state) - {name for name, _, _ in rows})
    assert report.unexpected == [] and report.skipped == tied
    assert tied == {"tf1": [], "bert": ["cls.predictions.decoder.bias",
                                        "cls.predictions.decoder.weight"],
                    "modernbert": ["decoder.weight"]}[case]


def test_fused_tensors_stack_our_tensors_in_order():
    """Wqkv is [query; key; value] of torch's [out, in] weights; Wi is [input; gate]."""
    params = random_tree(MODERNBERT, MODERN_CONFIG)
    state = MODERNBERT.arrays(params, MODERN_CONFIG)
    layer, h = params["bert"]["encoder"]["layer_1"], MODERN_CONFIG.hidden_size
    want = np.concatenate([layer["attention"][p]["kernel"].reshape(h, h).T
                           for p in ("query", "key", "value")])
    np.testing.assert_array_equal(state["model.layers.1.attn.Wqkv.weight"], want)
    np.testing.assert_array_equal(state["model.layers.1.mlp.Wi.bias"],
                                  np.concatenate([layer["intermediate"]["bias"],
                                                  layer["gate"]["bias"]]))


def test_the_format_is_picked_from_the_config():
    assert hf_files.hf_format(BERT_CONFIG) is BERT
    assert hf_files.hf_format(MODERN_CONFIG) is MODERNBERT
    assert hf_files.hf_format(BERT_CONFIG.replace(ffn_type="geglu")) is MODERNBERT
    assert hf_files.hf_format_of({"model_type": "modernbert"}) is MODERNBERT
    assert hf_files.hf_format_of({"model_type": "bert"}) is BERT
    assert hf_files.hf_format_of({}) is BERT  # and BERT's reader names another model_type
