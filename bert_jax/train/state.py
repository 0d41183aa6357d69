"""The training state, the model built from a config, and sharded initialisation.

Initialisation never builds a full copy of the model on one host: `jax.eval_shape` traces
`init` to get shapes and the logical axis names of every parameter (and, through optax's
tree maps, of the optimizer moments), the rules turn those into NamedShardings, and a jitted
init with those `out_shardings` materialises each shard where it lives.
"""

from __future__ import annotations

import contextlib
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import sharding as sharding_lib
from bert_jax.models.bert import BertForPreTraining
from bert_jax.models.config import BertConfig, from_config_dict


@flax.struct.dataclass
class TrainState:
    """step: <int32>[] number of updates applied; params: the model's parameter tree
    (float32 storage); opt_state: the optax state (float32 moments)."""

    step: jax.Array
    params: Any
    opt_state: Any


def model_config(config) -> BertConfig:
    return from_config_dict(config.model)


def create_model(config) -> BertForPreTraining:
    """BertForPreTraining from the `model` section; `model.nsp=False` drops the NSP head."""
    return BertForPreTraining(model_config(config), nsp=bool(config.model.get("nsp", True)))


def dummy_inputs(seq_len: int, max_predictions: int | None, batch: int = 1) -> dict:
    """Placeholder model inputs (shapes only matter) for init. max_predictions=None: no
    masked-LM slots (the fine-tuning models: sequence, token and span heads)."""
    ids = jnp.zeros((batch, seq_len), jnp.int32)
    inputs = dict(input_ids=ids, attention_mask=jnp.ones_like(ids), token_type_ids=ids)
    if max_predictions is not None:
        inputs["masked_lm_positions"] = jnp.zeros((batch, max_predictions), jnp.int32)
    return inputs


@contextlib.contextmanager
def mesh_context(mesh, rules):
    """Everything traced inside sees the mesh (for flax's logical activation constraints)
    and the logical-axis rules."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        yield


def _boxed_init(model, tx, seq_len, max_predictions, rng):
    variables = model.init({"params": rng}, **dummy_inputs(seq_len, max_predictions))
    params = variables["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def state_shardings(model, tx: optax.GradientTransformation, mesh, rules, seq_len: int,
                    max_predictions: int | None):
    """(abstract unboxed TrainState of ShapeDtypeStructs, matching tree of NamedShardings).
    Any model called as model(input_ids=, attention_mask=, token_type_ids=[,
    masked_lm_positions=]): pre-training, or a fine-tuning task model (max_predictions None)."""
    rng = jax.random.key(0)
    # Init is traced with the rules but without a global mesh: flax's DenseGeneral builds its
    # kernel flat and unboxes it (applying the 3-axis logical constraint to a 2-D array)
    # before reshaping, which fails under a mesh. Placement comes from out_shardings anyway.
    with nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(
            lambda r: _boxed_init(model, tx, seq_len, max_predictions, r), rng)
        shardings = sharding_lib.logical_shardings(boxed, mesh, rules)
    abstract = nn.meta.unbox(boxed)
    abstract = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    return abstract, shardings


def init_state(model, tx, mesh, rules, rng, seq_len: int, max_predictions: int | None,
               shardings=None) -> TrainState:
    """A freshly initialised, sharded TrainState (params from `rng`)."""
    if shardings is None:
        _, shardings = state_shardings(model, tx, mesh, rules, seq_len, max_predictions)

    def init(r):
        return nn.meta.unbox(_boxed_init(model, tx, seq_len, max_predictions, r))

    with nn.logical_axis_rules(rules):  # no global mesh: see state_shardings
        return jax.jit(init, out_shardings=shardings)(rng)


def state_with_params(state: TrainState, params: Any, tx, shardings) -> TrainState:
    """`state` with `params` swapped in (a warm start) and a fresh optimizer state for them,
    placed on the state's shardings. `params` must have the state's tree structure."""
    # Every process holds the whole host copy; each builds only its addressable shards
    # (device_put cannot target other processes' devices).
    params = jax.tree_util.tree_map(
        lambda x, ref, s: jax.make_array_from_callback(
            ref.shape, s, lambda idx, x=np.asarray(x, ref.dtype): x[idx]),
        params, state.params, shardings.params)
    opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
    return state.replace(params=params, opt_state=opt_state)


def param_norm(params) -> jax.Array:
    return optax.tree.norm(params)
