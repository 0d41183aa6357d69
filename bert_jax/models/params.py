"""Parameter-tree utilities: counting, shapes by key, converting between the unscanned
(`encoder/layer_{i}`) and scanned (`encoder/layers`, leading [layers] axis) layouts, and
telling which one a tree or a checkpoint's keys hold."""

from __future__ import annotations

from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np


def count_params(tree: Any) -> int:
    """Number of scalars in a tree of arrays or ShapeDtypeStructs (boxed or not)."""
    tree = flax.linen.meta.unbox(tree)
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(tree)))


def flat_shapes(tree) -> dict[str, tuple]:
    """Every leaf's shape by "/"-joined key, e.g. {"bert/pooler/dense/kernel": (768, 768)}."""
    return {"/".join(k): tuple(np.shape(v)) for k, v in
            flax.traverse_util.flatten_dict(flax.core.unfreeze(tree)).items()}


def layer_layout(keys) -> Optional[bool]:
    """Whether parameter keys (tuples or "/"-joined strings) hold the encoder's layers
    stacked (model.scan_layers=True: `encoder/layers`) or one tree per layer (`encoder/
    layer_<i>` only); None without an encoder."""
    parts = [k.split("/") if isinstance(k, str) else list(k) for k in keys]
    names = {p[i + 1] for p in parts for i in range(len(p) - 1) if p[i] == "encoder"}
    if "layers" in names:
        return True
    return False if any(n.startswith("layer_") for n in names) else None


def encoder_layout(params) -> tuple[bool, int]:
    """(layers stacked, number of layers) of a params tree's encoder (params["bert"]
    ["encoder"]; arrays or ShapeDtypeStructs): what `stack_layers` takes. A stacked encoder
    may keep layer 0 apart (`layer_0` beside `layers`): it counts."""
    encoder = params["bert"]["encoder"]
    if "layers" in encoder:
        return True, (int(jax.tree_util.tree_leaves(encoder["layers"])[0].shape[0])
                      + int("layer_0" in encoder))
    return False, sum(1 for k in encoder if k.startswith("layer_"))


def _find_encoder(tree: dict, path=()):
    """Yields (path, subtree) for every dict that has an 'encoder' child."""
    if not isinstance(tree, dict):
        return
    if "encoder" in tree:
        yield path, tree
    for k, v in tree.items():
        if k != "encoder":
            yield from _find_encoder(v, path + (k,))


def _structure(tree):
    return jax.tree_util.tree_structure(flax.core.unfreeze(tree))


def stack_layers(params: dict, num_layers: int) -> dict:
    """layer_0..layer_{N-1} -> layers (leaves stacked on axis 0). Returns a new tree.
    A layer_0 whose parameters differ from layer_1's (a pre-LN layer 0 without its
    attention LayerNorm) stays apart, as the scanned encoder keeps it. Under
    jax.eval_shape it stacks shapes alone."""
    params = flax.core.unfreeze(params)
    for _, parent in list(_find_encoder(params)):
        enc = dict(parent["encoder"])
        first = int(num_layers > 1 and _structure(enc["layer_0"]) != _structure(enc["layer_1"]))
        layers = [enc.pop(f"layer_{i}") for i in range(first, num_layers)]
        enc["layers"] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)
        parent["encoder"] = enc
    return params


def unstack_layers(params: dict, num_layers: int) -> dict:
    """layers (leading [layers] axis) -> layer_0..layer_{N-1}. Returns a new tree.
    With a layer_0 kept apart beside `layers`, these are layers 1..N-1."""
    params = flax.core.unfreeze(params)
    for _, parent in list(_find_encoder(params)):
        enc = dict(parent["encoder"])
        stacked = enc.pop("layers")
        first = int("layer_0" in enc)
        for i in range(first, num_layers):
            enc[f"layer_{i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i - first], stacked)
        parent["encoder"] = enc
    return params

