"""Layer-wise learning-rate decay (`optimizer.layer_decay`): the factor of every parameter
of a real classifier tree (looped and scanned layers), the update against the undecayed one
over two steps for AdamW and LAMB, and the errors."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax import optim
from bert_jax.models import BertForSequenceClassification
from bert_jax.models.params import stack_layers
from tests.models.helpers import random_batch, tiny_config

LAYERS = 3


def _names(path):
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def _flat(tree):
    return {_names(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _expected_factor(names, decay=0.5):
    """Written out by hand for L = 3: heads and pooler 1, layer i decay ** (3 - i),
    embeddings decay ** 4; a scanned leaf has the three layers' factors."""
    if "embeddings" in names:
        return decay ** 4
    for i in range(LAYERS):
        if f"layer_{i}" in names:
            return decay ** (LAYERS - i)
    if "layers" in names:
        return np.array([decay ** 3, decay ** 2, decay ** 1])
    return 1.0


@pytest.mark.parametrize("scan", [False, True])
def test_factors_on_a_classifier_tree(scan):
    config = tiny_config(num_hidden_layers=LAYERS, scan_layers=scan)
    model = BertForSequenceClassification(config, num_labels=3)
    shapes = nn.meta.unbox(jax.eval_shape(
        lambda: model.init(jax.random.key(0), *random_batch(config))["params"]))
    factors = _flat(optim.layer_decay_factors(0.5, shapes))
    leaves = _flat(shapes)
    assert set(factors) == set(leaves)
    groups = {"embeddings": 0, "layer": 0, "top": 0}
    for names, f in factors.items():
        want = _expected_factor(names)
        assert f.dtype == np.float32, names
        if np.ndim(want):
            assert f.shape == (LAYERS,) + (1,) * (len(leaves[names].shape) - 1), names
            np.testing.assert_array_equal(f.reshape(-1), want, err_msg=str(names))
        else:
            assert f.shape == () and float(f) == want, names
        groups["embeddings" if "embeddings" in names else
               "layer" if "encoder" in names else "top"] += 1
    # 3 tables + LayerNorm (2); pooler (2) + classifier (2) at the full rate; 16 tensors a
    # layer (q, k, v, attention out, intermediate, output: kernel + bias; 2 LayerNorms).
    assert groups["embeddings"] == 5 and groups["top"] == 4
    assert groups["layer"] == (16 if scan else 16 * LAYERS)


def _small_tree(scan: bool):
    """The classifier tree's naming with a few leaves: embeddings, three layers, pooler and
    head (real trees are checked above; this keeps the compiled updates small)."""
    gen = np.random.default_rng(1)

    def arr(*shape):
        return jnp.asarray(gen.standard_normal(shape), jnp.float32)

    layers = {f"layer_{i}": {"attention": {"query": {"kernel": arr(4, 4), "bias": arr(4)}},
                             "output_norm": {"scale": arr(4)}} for i in range(LAYERS)}
    tree = {"bert": {"embeddings": {"word_embeddings": {"embedding": arr(10, 4)},
                                    "LayerNorm": {"scale": arr(4)}},
                     "encoder": layers,
                     "pooler": {"kernel": arr(4, 4), "bias": arr(4)}},
            "classifier": {"kernel": arr(4, 3), "bias": arr(3)}}
    return stack_layers(tree, LAYERS) if scan else tree


def _tx(name, layer_decay, clip=1.0):
    opt = ml_collections.ConfigDict(dict(name=name, b1=0.9, b2=0.999, eps=1e-6,
                                         weight_decay=0.01, clip_norm=clip,
                                         layer_decay=layer_decay))
    sched = ml_collections.ConfigDict(dict(lr=0.1, warmup_steps=0, decay="constant"))
    return optim.make_optimizer(opt, sched, 100)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
@pytest.mark.parametrize("scan", [False, True])
def test_update_is_the_undecayed_update_times_the_factor(name, scan):
    """Two steps, clipping on (global norm ~9 > 1): each update of the decayed optimizer is
    the plain optimizer's update times the layer's factor, as the moments and LAMB's trust
    ratios do not depend on the learning rate; the optimizer states are the same."""
    params = _small_tree(scan)
    gen = np.random.default_rng(0)
    grads = [jax.tree_util.tree_map(
        lambda p: jnp.asarray(gen.standard_normal(p.shape), p.dtype), params) for _ in range(2)]
    plain, decayed = _tx(name, 1.0), _tx(name, 0.5)

    @jax.jit
    def both(g, s_plain, s_decayed):
        return plain.update(g, s_plain, params), decayed.update(g, s_decayed, params)

    s_plain, s_decayed = plain.init(params), decayed.init(params)
    assert jax.tree_util.tree_structure(s_plain) == jax.tree_util.tree_structure(s_decayed)
    for g in grads:
        (u_plain, s_plain), (u_decayed, s_decayed) = both(g, s_plain, s_decayed)
        u_plain, u_decayed = _flat(u_plain), _flat(u_decayed)
        assert len(u_plain) == (15 if not scan else 9)
        for names, u in u_plain.items():
            f = _expected_factor(names)
            f = np.reshape(f, (-1,) + (1,) * (u.ndim - 1)) if np.ndim(f) else f
            assert np.any(np.asarray(u)), names
            np.testing.assert_allclose(np.asarray(u_decayed[names]), np.asarray(u) * f,
                                       rtol=1e-6, atol=1e-12, err_msg=str(names))
        for a, b in zip(jax.tree_util.tree_leaves(s_plain),
                        jax.tree_util.tree_leaves(s_decayed)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_layer_decay_one_leaves_the_optimizer_as_it_is():
    inner = optim.lamb(0.1)
    assert optim.with_layer_decay(inner, 1.0) is inner


@pytest.mark.parametrize("value", [0.0, -0.5, 1.5])
def test_out_of_range_is_an_error(value):
    with pytest.raises(ValueError, match=r"config.optimizer.layer_decay="):
        _tx("adamw", value)


def test_a_tree_without_encoder_layers_fails_at_init():
    tx = _tx("adamw", 0.8)
    with pytest.raises(ValueError, match="needs a BERT encoder"):
        tx.init({"dense": {"kernel": jnp.ones((2, 2))}})


def test_misnumbered_layers_are_an_error():
    tree = _small_tree(False)
    tree["bert"]["encoder"]["layer_5"] = tree["bert"]["encoder"].pop("layer_1")
    with pytest.raises(ValueError, match=r"not numbered 0..L-1 \(found layer_\[0, 2, 5\]\)"):
        optim.layer_depths(tree)


def test_the_key_exists_in_every_task_config():
    from bert_jax.train.config import load_config

    for spec in ("configs/glue.py:mrpc", "configs/squad.py:1.1", "configs/ner.py",
                 "configs/swag.py"):
        config = load_config(spec, {"optimizer.layer_decay": 0.8})
        assert config.optimizer.layer_decay == 0.8, spec
    assert load_config("configs/bert_tiny.py").optimizer.layer_decay == 1.0


def test_finetune_refuses_a_bad_value_before_reading_any_data(tmp_path):
    from bert_jax.tasks import finetune
    from tests.tasks.finetune_common import tiny_pairs_config

    config = tiny_pairs_config()
    config.task.data_dir = str(tmp_path / "no_such_dir")  # never reached
    config.optimizer.layer_decay = 1.5
    with pytest.raises(ValueError, match=r"config.optimizer.layer_decay=1.5; expected"):
        finetune.run(config, str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()
