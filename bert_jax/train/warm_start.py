"""`train.init_checkpoint`: start a run from weights trained elsewhere, for every task.

`source` is a bert_jax.convert.sources.InitSource (a model or Hugging Face directory, or
another run's workdir); `keys` are the top-level parameter trees taken from it (fine-tuning:
("bert",); None: every tree both have, so a pre-training warm start takes its heads too);
the others keep their fresh init. `check_shapes` runs before anything compiles. A workdir's
trees are restored by orbax straight onto the mesh; `full` (train.init_state="full") also
takes its optimizer state, step and RNG, so the schedule continues: the paper's phase 2.
"""

from __future__ import annotations

from typing import Optional, Sequence

import flax
import jax
import numpy as np

from bert_jax.convert.sources import locate
from bert_jax.convert.sources import InitSource, flat_shapes
from bert_jax.errors import UserError
from bert_jax.models.params import stack_layers
from bert_jax.train import checkpoint as ckpt_lib

ARCH_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "type_vocab_size", "max_position_embeddings")


class ArchitectureError(UserError, ValueError):
    """An init checkpoint whose model has another architecture than the run's."""


class InitCheckpointError(UserError, ValueError):
    """An init checkpoint without a tensor the run takes, or with another shape."""


def check_architecture(theirs, ours, what: str) -> None:
    """BertConfigs `theirs` (a checkpoint's) and `ours` (config.model) agree on every key
    that shapes a tensor; else an ArchitectureError naming each differing key."""
    diff = {k: (getattr(theirs, k), getattr(ours, k)) for k in ARCH_KEYS
            if getattr(theirs, k) != getattr(ours, k)}
    if diff:
        raise ArchitectureError(
            f"{what}: architecture differs from config.model (checkpoint, config): {diff}; "
            f"start from a checkpoint of this architecture, or set config.model to the "
            f"checkpoint's")


def taken_keys(source: InitSource, abstract_params, keys: Optional[Sequence[str]]) -> list:
    """The top-level trees a warm start takes: `keys`, or every one both have; "bert"
    must be among them."""
    have = source.top_keys()
    taken = list(keys) if keys is not None else [k for k in abstract_params if k in have]
    if "bert" not in have or "bert" not in taken:
        raise InitCheckpointError(f"train.init_checkpoint={source.path}: no 'bert' encoder params "
                        f"(top-level keys: {have})")
    return taken


def _layout(abstract_params) -> tuple[bool, int]:
    """(scanned layers, number of layers) of a params tree's encoder."""
    encoder = abstract_params["bert"]["encoder"]
    if "layers" in encoder:
        return True, int(jax.tree_util.tree_leaves(encoder["layers"])[0].shape[0])
    return False, sum(1 for k in encoder if k.startswith("layer_"))


def check_shapes(source: InitSource, abstract_params, keys: Optional[Sequence[str]]) -> None:
    """Every tensor of the trees taken exists in `source` with the model's shape; else a
    UserError naming the key and both shapes. Cheap (shapes only): call it before
    compiling anything."""
    taken = taken_keys(source, abstract_params, keys)
    got = source.shapes(*_layout(abstract_params))
    want = flat_shapes({k: abstract_params[k] for k in taken})
    missing = sorted(k for k in want if k not in got)
    if missing:
        raise InitCheckpointError(
            f"train.init_checkpoint={source.path}: tensors missing: {missing[0]} ... "
            f"({len(missing)} in all; the checkpoint has {sorted(got)[:5]} ...)")
    for k, shape in sorted(want.items()):
        if tuple(got[k]) != tuple(shape):
            c = source.config
            raise InitCheckpointError(
                f"train.init_checkpoint={source.path}: {k} has shape {tuple(got[k])} in the "
                f"checkpoint, the model expects {tuple(shape)} " + (
                    f"(checkpoint model hidden_size={c.hidden_size}, num_hidden_layers="
                    f"{c.num_hidden_layers}, intermediate_size={c.intermediate_size})"
                    if k.startswith("bert/") else "(another number of labels?)"))


def warm_start(source: InitSource, state, rng, abstract, shardings, tx, rng_sharding, *,
               keys: Optional[Sequence[str]] = None, full: bool = False):
    """(state, rng) with the trees taken from `source` (shapes checked by check_shapes)
    and a fresh optimizer state for them; `full`: a workdir's whole state and RNG."""
    if full and source.kind != "workdir":
        raise InitCheckpointError(f"config.train.init_state='full' needs a training workdir, but "
                        f"{source.path} is a {source.kind.replace('_', ' ')} (params only)")
    taken = taken_keys(source, abstract.params, keys)
    if source.kind == "workdir":
        ckpt = ckpt_lib.Checkpointer(locate(source.path)[0], every=1, read_only=True)
        try:
            if full:
                new_state, new_rng, _ = ckpt.restore(abstract, step=source.step,
                                                     rng_sharding=rng_sharding)
                return new_state, new_rng
            loaded = ckpt.restore_params({k: abstract.params[k] for k in taken},
                                         step=source.step)
        finally:
            ckpt.close()
    else:
        params = numpy_params(source, abstract.params)
        loaded = place_numpy({k: params[k] for k in taken},
                             {k: abstract.params[k] for k in taken},
                             {k: shardings.params[k] for k in taken})
    if jax.process_index() == 0:
        fresh = sorted(set(abstract.params) - set(taken))
        print(f"warm start: {taken} from {source.path}"
              + (f"; fresh init: {fresh}" if fresh else ""), flush=True)
    params = {**state.params, **loaded}
    opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
    return state.replace(params=params, opt_state=opt_state), rng


def place_numpy(tree, abstract, shardings):
    """A host numpy tree -> jax.Arrays of `abstract`'s shapes and dtypes on `shardings` (the
    same tree structure). Every process holds the host copy; each builds only its
    addressable shards (device_put cannot target other processes' devices)."""
    flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(tree))
    refs = flax.traverse_util.flatten_dict(abstract)
    places = flax.traverse_util.flatten_dict(shardings)
    return flax.traverse_util.unflatten_dict({
        k: jax.make_array_from_callback(
            ref.shape, places[k], lambda idx, x=np.asarray(flat[k], ref.dtype): x[idx])
        for k, ref in refs.items()})


def numpy_params(source: InitSource, abstract_params) -> dict:
    """A model or Hugging Face directory's params in the layer layout of `abstract_params`
    (predicting with a fine-tuned model's own head)."""
    scanned, layers = _layout(abstract_params)
    params = dict(source.params)
    if scanned and "bert" in params:
        params["bert"] = stack_layers({"bert": params["bert"]}, layers)["bert"]
    return params

