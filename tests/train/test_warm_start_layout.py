"""A warm start into a scanned encoder that keeps layer 0 apart (pre-LN without layer 0's
attention LayerNorm, ModernBERT's layout: `layer_0` beside `layers`): the run's layer count
is every layer, so a model directory's unscanned layers stack into exactly its tree."""

from __future__ import annotations

import jax
import numpy as np

from bert_jax.convert.sources import InitSource
from bert_jax.models import BertModel
from bert_jax.models.params import encoder_layout, flat_shapes
from bert_jax.train import state as state_lib
from bert_jax.train import warm_start
from tests.models.helpers import tiny_config


def _params(config):
    inputs = state_lib.dummy_inputs(8, None)
    return {"bert": state_lib.abstract_params(BertModel(config), inputs)}


def test_a_layer_0_kept_apart_counts_among_the_layers():
    config = tiny_config(num_hidden_layers=3, pre_ln=True, layer0_attention_norm=False,
                         scan_layers=True)
    abstract = _params(config)
    assert set(abstract["bert"]["encoder"]) >= {"layer_0", "layers"}
    assert encoder_layout(abstract) == (True, 3)
    assert encoder_layout(_params(config.replace(scan_layers=False))) == (False, 3)
    # A model directory holds the unscanned tree: it warm-starts the scanned run.
    saved = jax.tree_util.tree_map(lambda a: np.zeros(a.shape, a.dtype),
                                   _params(config.replace(scan_layers=False)))
    source = InitSource("/models/m", "model_dir", config.replace(scan_layers=False),
                        read=lambda: saved)
    assert warm_start.check_shapes(source, abstract, ["bert"]) == {}
    assert flat_shapes(warm_start.numpy_params(source, abstract)) == flat_shapes(abstract)


def test_a_model_directory_stacks_its_layers_in_shape_only_for_the_check(monkeypatch):
    """InitSource.shapes (the warm start's and the predictor's shape check) copies no
    tensor: the layers stack under jax.eval_shape; numpy_params stacks the same params'
    values, untouched, when they are loaded."""
    import jax.numpy as jnp

    config = tiny_config(num_hidden_layers=3, scan_layers=True)
    unscanned = _params(config.replace(scan_layers=False))
    saved = jax.tree_util.tree_map(
        lambda a: np.arange(np.prod(a.shape), dtype=a.dtype).reshape(a.shape), unscanned)
    source = InitSource("/models/m", "model_dir", config.replace(scan_layers=False),
                        read=lambda: saved)
    copies = []
    real_stack = jnp.stack

    def stack(xs, *args, **kwargs):
        copies.extend(x for x in xs if not isinstance(x, jax.core.Tracer))
        return real_stack(xs, *args, **kwargs)

    monkeypatch.setattr(jnp, "stack", stack)
    assert source.shapes(True, 3) == flat_shapes(_params(config))
    assert copies == []
    stacked = warm_start.numpy_params(source, _params(config))
    assert copies  # the load stacks the values
    layers = stacked["bert"]["encoder"]["layers"]
    for i in range(3):
        for (key, got), want in zip(
                jax.tree_util.tree_leaves_with_path(layers),
                jax.tree_util.tree_leaves(saved["bert"]["encoder"][f"layer_{i}"])):
            np.testing.assert_array_equal(got[i], want, err_msg=str(key))
