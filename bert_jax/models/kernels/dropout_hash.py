"""The counter-based hash of the hash dropout (`model.dropout_rng="hash"`), shared by the XLA
path (models/dropout.py) and the kernels that regenerate its mask themselves (the Pallas
attention kernel, the residual + LayerNorm kernels), so that every path drops the same
elements, bit for bit.

Element (row, col) of a mask drawn from the two <uint32> seeds s1, s2 hashes to

    h = fmix32((fmix32(row ^ s1) ^ s2) + col * GOLDEN)

(wrapping uint32 arithmetic) and is kept iff h >= drop_threshold(rate); models/dropout.py
says why and how rows and columns are numbered.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

GOLDEN = 0x9E3779B9  # odd, so col -> col * GOLDEN is a bijection mod 2**32


def fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's finaliser on uint32 (wrapping arithmetic)."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def drop_threshold(rate: float) -> int:
    """The uint32 threshold: an element is dropped when its hash is below it."""
    return int(round(rate * 2.0**32))
