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
import optax

from bert_jax import sharding as sharding_lib
from bert_jax.models import fp8 as fp8_lib


@flax.struct.dataclass
class TrainState:
    """step: <int32>[] number of updates applied; params: the model's parameter tree
    (float32 storage); opt_state: the optax state (float32 moments); fp8: the FP8 scaling
    state of a model.fp8 model (bert_jax.models.fp8: amax histories and scales per
    product, float32), {} otherwise."""

    step: jax.Array
    params: Any
    opt_state: Any
    fp8: Any = flax.struct.field(default_factory=dict)


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


def _boxed_init(model, tx, inputs, rng):
    params, fp8 = fp8_lib.split(model.init({"params": rng}, **inputs))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      fp8=fp8)


def state_shardings(model, tx: optax.GradientTransformation, mesh, rules, inputs: dict):
    """(abstract unboxed TrainState of ShapeDtypeStructs, matching tree of NamedShardings).
    `inputs`: the model's keyword arguments for one example (shapes only; `dummy_inputs`
    for the BERT models, a task's `init_inputs()`)."""
    return _abstract_sharded(lambda r: _boxed_init(model, tx, inputs, r), mesh, rules)


def params_shardings(model, mesh, rules, inputs: dict):
    """(abstract params of ShapeDtypeStructs, matching tree of NamedShardings): the params
    of `state_shardings`, without an optimizer (evaluating given params)."""
    return _abstract_sharded(
        lambda r: fp8_lib.split(model.init({"params": r}, **inputs))[0], mesh, rules)


def _abstract_sharded(init, mesh, rules):
    """(`init`'s output as ShapeDtypeStructs carrying their shardings, the shardings) from
    the logical axis names of its boxed leaves; nothing is allocated."""
    # Init is traced with the rules but without a global mesh: flax's DenseGeneral builds its
    # kernel flat and unboxes it (applying the 3-axis logical constraint to a 2-D array)
    # before reshaping, which fails under a mesh. Placement comes from out_shardings anyway.
    with nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(init, jax.random.key(0))
        shardings = sharding_lib.logical_shardings(boxed, mesh, rules)
    abstract = nn.meta.unbox(boxed)
    abstract = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    return abstract, shardings


def abstract_params(model, inputs: dict):
    """The model's parameter tree as ShapeDtypeStructs (nothing allocated)."""
    return nn.meta.unbox(jax.eval_shape(
        lambda r: model.init({"params": r}, **inputs)["params"], jax.random.key(0)))


def init_state(model, tx, mesh, rules, rng, inputs: dict, shardings=None) -> TrainState:
    """A freshly initialised, sharded TrainState (params from `rng`; `inputs` as for
    state_shardings)."""
    if shardings is None:
        _, shardings = state_shardings(model, tx, mesh, rules, inputs)

    def init(r):
        return nn.meta.unbox(_boxed_init(model, tx, inputs, r))

    with nn.logical_axis_rules(rules):  # no global mesh: see state_shardings
        return jax.jit(init, out_shardings=shardings)(rng)
