"""Shared building blocks: initialisers with logical axis names, Dense, LayerNorm, activations."""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.config import BertConfig


class _Partitioned(nn.LogicallyPartitioned):
    """flax's LogicallyPartitioned, except that a value whose rank differs from its names
    is unboxed without the sharding constraint: DenseGeneral initialises its kernel flat
    (2-D) and unboxes it before reshaping to the named rank, which under a global mesh
    would apply a 3-name constraint to a 2-D array and fail (flax 0.12)."""

    def unbox(self, apply_constraint=True):
        if jnp.ndim(self.value) != len(self.names):
            return self.value
        return super().unbox(apply_constraint)


def _with_logical_partitioning(fn, names):
    def wrapper(*args, **kwargs):
        return _Partitioned(fn(*args, **kwargs), tuple(names))
    return wrapper


def weight_init(config: BertConfig, axes: Sequence[str]):
    """Truncated normal (+-2 std, std = initializer_range), as the original TF code."""
    return _with_logical_partitioning(
        nn.initializers.truncated_normal(stddev=config.initializer_range), tuple(axes))


def zeros_init(axes: Sequence[str]):
    return _with_logical_partitioning(nn.initializers.zeros_init(), tuple(axes))


def ones_init(axes: Sequence[str]):
    return _with_logical_partitioning(nn.initializers.ones_init(), tuple(axes))


def dense(config: BertConfig, features: int, axes: tuple[str, str], name: str) -> nn.Dense:
    """A Dense layer whose kernel is named `axes` (in, out) and bias `axes[1]`."""
    return nn.Dense(
        features,
        dtype=config.compute_dtype,
        param_dtype=config.storage_dtype,
        kernel_init=weight_init(config, axes),
        bias_init=zeros_init(axes[1:]),
        name=name,
    )


def layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
    # flax computes the mean / variance in float32 even for a bfloat16 input.
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps,
        dtype=config.compute_dtype,
        param_dtype=config.storage_dtype,
        scale_init=ones_init(("embed",)),
        bias_init=zeros_init(("embed",)),
        name=name,
    )


def gelu_erf(x):
    """The exact GELU, x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2))): the formula PyTorch's
    `gelu` (so transformers' "gelu") and TF's `gelu(approximate=False)` evaluate.
    jax.nn.gelu(approximate=False) computes the same function through erfc(-x / sqrt(2)),
    whose XLA:CPU expansion (and its derivative) is slower than this form
    (benchmarks/RESULTS.md). Both are within float32 rounding of the float64 GELU and of
    its derivative (tests/models/test_layers.py)."""
    half = jnp.asarray(0.5, x.dtype)
    return x * half * (1 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, x.dtype)))


def activation(name: str):
    if name == "gelu":
        return gelu_erf
    if name in ("gelu_new", "gelu_tanh"):
        return lambda x: jax.nn.gelu(x, approximate=True)
    if name == "relu":
        return jax.nn.relu
    if name == "tanh":
        return jnp.tanh
    if name == "silu":
        return jax.nn.silu
    raise ValueError(f"unknown activation {name!r}")
