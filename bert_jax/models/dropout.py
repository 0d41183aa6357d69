"""Dropout whose mask comes from a counter-based hash instead of one threefry block per element.

    y = Dropout(rate, impl="hash")(x, deterministic=False)   # rng collection "dropout"

Why hand-written: flax's `nn.Dropout` draws `jax.random.bernoulli`, which with the default
(partitionable) threefry PRNG runs a full 20-round Threefry-2x32 block for every element.
On CPU that is the single largest non-matmul cost of a BERT step (benchmarks/RESULTS.md), and
jax's "rbg" / "unsafe_rbg" PRNGs take little off it. No library offers a cheaper dropout
mask, so:

  * one threefry draw per call (the flax `dropout` rng, so seeds, `fold_in(rng, step)`,
    `nn.scan`'s split rngs and resume-exactness behave exactly as with nn.Dropout) gives two
    32-bit seeds s1, s2;
  * element (row, col) of the mask, row = flat index over the leading axes and col = index
    on the last axis, hashes to  h = fmix32((fmix32(row ^ s1) ^ s2) + col * 0x9E3779B9)
    (fmix32 is MurmurHash3's 32-bit finaliser, a bijection with full avalanche: the hash
    of models/kernels/dropout_hash.py, which the kernels share); it is kept
    when h >= round(rate * 2**32), and kept values are scaled by 1 / (1 - that / 2**32), so
    E[y] = x exactly for the rate actually used (|that - rate| <= 2**-33).

The mask is a pure function of (key, global element index), built from `iota`s, so it is the
same on any mesh (XLA partitions the iotas) and is recomputed, not stored, where that is
cheaper. Much cheaper than threefry on CPU (`benchmarks/train_step.py` measures the step
both ways: `--dropout_rng=hash` / `jax`; figures in benchmarks/RESULTS.md). Statistical
checks (rate, independence across elements, rows, columns and keys) are in
tests/models/test_dropout.py. `impl="jax"` is flax's nn.Dropout bit for bit.

The default (`model.dropout_rng="hash"`). Fine-tuning quality was compared seed by seed,
since one run cannot separate a mask generator from the run-to-run spread (the SQuAD-format
acceptance set, benchmarks/finetune_minilm.py --task=squad; dev F1 per seed in
benchmarks/RESULTS.md): the spread across seeds dwarfs any difference between the two
generators. `impl="jax"` stays available for bit-for-bit parity with flax.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from bert_jax.models.config import DROPOUT_RNGS
from bert_jax.models.kernels.dropout_hash import GOLDEN, drop_threshold, fmix32


def hash_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """<uint32>[shape] pseudo-random bits, a pure function of (key, element index)."""
    if not shape:
        return jax.random.bits(key, (), jnp.uint32)
    return _seeded_bits(jax.random.bits(key, (2,), jnp.uint32), shape)


def _seeded_bits(seeds: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """hash_bits from the two <uint32> seeds it draws from its key (shape not empty)."""
    rows = math.prod(shape[:-1])
    if rows >= 2**32 or shape[-1] >= 2**32:
        raise ValueError(f"hash dropout supports < 2**32 rows and columns; got shape {shape}")
    row = jnp.zeros(shape, jnp.uint32)
    for axis in range(len(shape) - 1):
        row = row * jnp.uint32(shape[axis]) + jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
    col = jax.lax.broadcasted_iota(jnp.uint32, shape, len(shape) - 1)
    return fmix32((fmix32(row ^ seeds[0]) ^ seeds[1]) + col * jnp.uint32(GOLDEN))


def keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
    """<bool>[shape]: True where the element is kept (probability 1 - rate)."""
    return hash_bits(key, shape) >= jnp.uint32(drop_threshold(rate))


class Dropout(nn.Module):
    """Inverted dropout with the interface of flax's nn.Dropout (rate, deterministic,
    rng collection "dropout"); `impl` picks the mask generator (see the module doc)."""

    rate: float
    impl: str = "jax"
    rng_collection: str = "dropout"

    def make_key(self) -> jax.Array:
        """The key this module's __call__ would draw its mask from (same rng stream): for
        kernels that regenerate the hash mask themselves (models/kernels/)."""
        return self.make_rng(self.rng_collection)

    @nn.compact
    def __call__(self, x, deterministic: bool = True):
        if self.impl not in DROPOUT_RNGS:
            raise ValueError(f"dropout impl {self.impl!r}; expected one of {DROPOUT_RNGS}")
        if deterministic or self.rate == 0.0:
            return x
        key = self.make_rng(self.rng_collection)
        if self.impl == "jax":  # flax's nn.Dropout, same rng path and arithmetic
            keep_prob = 1.0 - self.rate
            mask = jax.random.bernoulli(key, p=keep_prob, shape=x.shape)
            return jax.lax.select(mask, x / keep_prob, jnp.zeros_like(x))
        if x.ndim == 0:
            keep = keep_mask(key, (), self.rate)
            return jnp.where(keep, x * _hash_scale(self.rate, x.dtype), jnp.zeros((), x.dtype))
        return hash_dropout(x, draw_seeds(key), self.rate)


def draw_seeds(key: jax.Array) -> jax.Array:
    """The two <uint32> seeds of a hash mask, drawn from `key`, with the checkpoint name
    "dropout_seeds": a remat policy that keeps them (8 bytes) spares the backward pass the
    threefry draw, a few tiny kernels per dropout per layer."""
    return checkpoint_name(jax.random.bits(key, (2,), jnp.uint32), "dropout_seeds")


def _hash_keep(seeds: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
    return _seeded_bits(seeds, shape) >= jnp.uint32(drop_threshold(rate))


def _hash_scale(rate: float, dtype) -> jax.Array:
    return jnp.asarray(1.0 / (1.0 - drop_threshold(rate) / 2.0**32), dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def hash_dropout(x: jax.Array, seeds: jax.Array, rate: float) -> jax.Array:
    """where(keep, x * scale, 0) with the hash mask of `seeds` (<uint32>[2]). Its gradient
    regenerates the mask from the seeds instead of keeping it: automatic differentiation
    would store a <bool> mask per element for the backward pass (a write and a read of
    [batch, length, features] per dropout), where hashing again is arithmetic only. The
    gradient's arithmetic is the one autodiff derives, so the values are the same."""
    keep = _hash_keep(seeds, x.shape, rate)
    return jnp.where(keep, x * _hash_scale(rate, x.dtype), jnp.zeros((), x.dtype))


def _hash_dropout_fwd(x, seeds, rate):
    return hash_dropout(x, seeds, rate), seeds


def _hash_dropout_bwd(rate, seeds, g):
    # The barrier keeps XLA from merging this mask with the forward pass's (the same pure
    # function of the seeds), which would store it again.
    keep = _hash_keep(jax.lax.optimization_barrier(seeds), g.shape, rate)
    return jnp.where(keep, g, jnp.zeros((), g.dtype)) * _hash_scale(rate, g.dtype), None


hash_dropout.defvjp(_hash_dropout_fwd, _hash_dropout_bwd)
