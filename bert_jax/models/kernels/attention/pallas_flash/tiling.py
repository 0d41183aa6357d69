"""The Pallas flash-attention kernels' tiling: the static parameters of a call (Cfg), the
block sizes of the forward and backward kernels and the padded lengths (schedule), the
blocks a query or key block visits under a sliding window (kv_block_range, q_block_range,
visited_blocks), Triton's settings, and the BlockSpecs of the projection biases. The
arithmetic on a tile is in masks.py; the kernels in forward.py and backward.py."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

try:  # jax's Triton-specific Pallas options (num_warps, num_stages); optional
    from jax.experimental.pallas import triton as _triton
except ImportError:  # pragma: no cover - a jax without it compiles with Triton's defaults
    _triton = None

# The longest key length whose backward pass runs as one fused kernel by default (one key
# block of this many keys; an explicit bwd_block_k / block_k decides instead).
_FUSED_KEYS = 128


class Cfg(NamedTuple):
    """Static parameters of one call (hashable: custom_vjp's nondiff argument)."""
    q_len: int            # unpadded lengths: the dropout row index uses q_len
    kv_len: int
    kv_padded: bool       # keys beyond kv_len were added to fill the last block
    q_scale: float        # sqrt(head_dim) rounded to the compute dtype, as xla.py divides q by
    threshold: int        # dropout drop threshold (uint32); 0 = no dropout
    keep_scale: float     # 1 / (1 - threshold / 2**32) rounded to the compute dtype
    total_heads: int
    fwd_blocks: tuple     # (block_q, block_k) of the forward kernel
    bwd_blocks: tuple     # (block_q, block_k) of the two backward kernels
    num_warps: int        # Triton's settings of the forward kernel
    num_stages: int
    interpret: bool
    window: int = 0       # sliding-window half width; 0 = global
    head_dim: int = 0     # unpadded head dim: the output is sliced to [:, :q_len, :, :head_dim]
    bias: bool = False    # q, k, v arrive before their per-head biases, added on every load
    packed: bool = False  # the fused backward kernel writes dQ, dK, dV as one [.., 3, ..] array
    bwd_num_warps: int = 0   # those of the backward kernels (0: the forward's)
    bwd_num_stages: int = 0


def schedule(q_len, kv_len, block_q, block_k, bwd_block_q, bwd_block_k):
    """(fwd_blocks, bwd_blocks, q_pad, kv_pad): the (block_q, block_k) of the forward and
    of the backward kernels and the lengths padded to a multiple of both."""
    fwd_blocks = (_block("block_q", block_q, 128, q_len),
                  _block("block_k", block_k, 64, kv_len))
    # Keys that fit _FUSED_KEYS make one backward key block by default: the fused backward
    # kernel then reads every input once (backward.py).
    bwd_k_default = _FUSED_KEYS if kv_len <= _FUSED_KEYS else 64
    bwd_blocks = (_block("bwd_block_q", bwd_block_q or block_q, 64, q_len),
                  _block("bwd_block_k", bwd_block_k or block_k, bwd_k_default, kv_len))
    q_pad = _round_up(q_len, max(fwd_blocks[0], bwd_blocks[0]))
    kv_pad = _round_up(kv_len, max(fwd_blocks[1], bwd_blocks[1]))
    return fwd_blocks, bwd_blocks, q_pad, kv_pad


def visited_blocks(length: int, window: int = 0, *, block_q=None, block_k=None,
                   bwd_block_q=None, bwd_block_k=None) -> dict:
    """What the three kernels of a self-attention call over `length` tokens visit, per
    (example, head): {"fwd", "dq", "dkdv"}: (block_q, block_k, visited block pairs,
    block pairs in the grid)}. For estimates of the work a window saves (benchmarks)."""
    fwd, bwd, q_pad, kv_pad = schedule(length, length, block_q, block_k, bwd_block_q,
                                       bwd_block_k)
    cfg = Cfg(q_len=length, kv_len=length, kv_padded=False, q_scale=1.0, threshold=0,
              keep_scale=1.0, total_heads=1, fwd_blocks=fwd, bwd_blocks=bwd, num_warps=4,
              num_stages=2, interpret=True, window=0 if window >= length - 1 else window)

    def count(outer, inner, n_outer, n_inner, bounds):
        ranges = (bounds(i * outer, outer, inner, n_inner, cfg) for i in range(n_outer))
        return sum(int(hi) - int(lo) for lo, hi in ranges)

    grid = lambda bq, bk: (q_pad // bq) * (kv_pad // bk)  # noqa: E731
    return {
        "fwd": (*fwd, count(fwd[0], fwd[1], q_pad // fwd[0], kv_pad // fwd[1], kv_block_range),
                grid(*fwd)),
        "dq": (*bwd, count(bwd[0], bwd[1], q_pad // bwd[0], kv_pad // bwd[1], kv_block_range),
               grid(*bwd)),
        "dkdv": (*bwd, count(bwd[1], bwd[0], kv_pad // bwd[1], q_pad // bwd[0], q_block_range),
                 grid(*bwd)),
    }


def pow2(n) -> bool:
    """Whether n is a power of two."""
    return n > 0 and not n & (n - 1)


def is_int(x) -> bool:
    """Whether x is an integer (not a bool)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _block(name, requested, default, length):
    """The block along a length: `requested` (None = `default`), cut to the length rounded
    up to a power of two (>= 16: Triton's smallest dot), so a block size set for long
    sequences does not pad short ones."""
    size = default
    if requested is not None:
        if not is_int(requested) or requested < 16 or not pow2(requested):
            raise ValueError(f"block sizes must be powers of two >= 16, got "
                             f"{name}={requested!r}")
        size = requested
    return min(size, max(16, pl.next_power_of_2(length)))


def tuning(name, requested, default, ok, what):
    """`requested` (None: `default`), checked: a positive integer for which ok() holds."""
    if requested is None:
        return default
    if not is_int(requested) or requested < 1 or not ok(requested):
        raise ValueError(f"{name} must be {what}, got {requested!r}")
    return requested


def _round_up(n, m):
    return -(-n // m) * m


def kv_block_range(q_start, bq, bk, n_blocks, cfg):
    """(first, end): the key blocks (of bk keys, n_blocks in all) that the query block of
    rows q_start .. q_start + bq - 1 visits: all of them for global attention, else those
    that meet [first row - window, last row + window] (band centres, real keys only). Works
    on Python ints and traced int32 scalars alike."""
    if not cfg.window:
        return 0, n_blocks
    first = jnp.minimum(q_start, cfg.q_len - 1)
    last = jnp.minimum(q_start + bq - 1, cfg.q_len - 1)
    # Non-negative operands: lax.div (truncating) is the floor division, and lowers in
    # every Pallas backend.
    lo = lax.div(jnp.maximum(first - cfg.window, 0), bk)
    hi = lax.div(jnp.minimum(last + cfg.window, cfg.kv_len - 1), bk) + 1
    return lo, hi


def q_block_range(k_start, bk, bq, n_blocks, cfg):
    """(first, end): the query blocks (of bq rows, n_blocks in all) that the dK/dV kernel's
    key block k_start .. k_start + bk - 1 visits: all for global attention, else those
    holding a real row whose band meets the key block. Rows added to fill the last query
    block are skipped where they are alone in a block: their output cotangent is zero, so
    they add exactly nothing to dK and dV."""
    if not cfg.window:
        return 0, n_blocks
    lo_row = jnp.maximum(k_start - cfg.window, 0)
    hi_row = jnp.minimum(k_start + bk - 1 + cfg.window, cfg.q_len - 1)
    lo = lax.div(lo_row, bq)
    return lo, jnp.where(lo_row <= hi_row, lax.div(hi_row, bq) + 1, lo)


def compiler_params(cfg, backward: bool = False):
    """Triton's settings of the forward kernel, or with `backward` of the backward ones."""
    params = (getattr(_triton, "CompilerParams", None)
              or getattr(_triton, "TritonCompilerParams", None))
    if params is None or cfg.interpret:  # pragma: no cover
        return None
    if backward:
        return params(num_warps=cfg.bwd_num_warps or cfg.num_warps,
                      num_stages=cfg.bwd_num_stages or cfg.num_stages)
    return params(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def bias_args(biases, index_map, d):
    """(in_specs, arrays) of the q, k, v biases, <f32>[3, heads, d], for a grid whose
    index_map returns the head's block: the array three times, each spec its row; nothing
    without biases."""
    if biases is None:
        return [], []
    specs = [pl.BlockSpec((None, None, d), lambda *g, j=j: (j, *index_map(*g)))
             for j in range(3)]
    return specs, [biases] * 3

