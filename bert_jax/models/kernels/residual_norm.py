"""Post-LN BERT's residual block end, bias + dropout + residual add + LayerNorm, as one Pallas
kernel each way on GPU.

    y = residual_norm(p, bias, residual, scale, shift, seeds, rate=0.1, eps=1e-12)
    # == LayerNorm(residual + hash_dropout((p.astype(float32) + bias).astype(p.dtype)))

p: a sublayer's output product before its bias (the attention output's or the FFN's second
Dense), <dtype>[..., hidden]; bias, scale, shift: <float32>[hidden]; residual: <dtype>[...,
hidden], the sublayer's input; seeds: the <uint32>[2] of dropout.draw_seeds (the mask is
models/dropout.py's hash mask of the global [tokens, hidden] array, so the same elements
are dropped as on the XLA path, on any mesh), or None for no dropout.

Why kernels: XLA runs this as four kernels forward (the add, the statistics, the reciprocal,
the normalisation; 240-289 MiB a site at BERT-Base 256 x 128) and six or seven backward
(the two row sums, a per-row kernel, the masked cast, the bias / scale / shift column sums
in two stages; 340-435 MiB with the add of the incoming cotangents). The forward kernel
reads p and the residual once and writes the LayerNorm's input z (kept for the backward
pass) and its output y (192 MiB); the backward kernel reads the cotangent and z once and
writes the residual's and p's cotangents and per-program float32 column sums of the bias,
scale and shift gradients (192 MiB), a few [programs, 4 x hidden] rows that XLA adds. With
copies=2 the output goes out twice, to two consumers (the FFN and the next residual; the
next layer's Q/K/V product and its residual: models/encoder.py), and the backward kernel
reads both cotangents, which XLA would otherwise add in a kernel of its own (144-240 MiB a
site). The bias, scale, shift and the dropout seeds reach the kernels as one [4, hidden]
operand (vectors()): one small kernel makes it from a layer's stacked parameters. No
library has these kernels for jax on GPU (Apex and Transformer Engine have them for
PyTorch).

Numerics are jax's for the expression above: the bias sum in float32 rounded to the dtype,
the dropout multiply and the residual add in the dtype (as on the XLA path), the statistics
in float32 from z as rounded (flax's fast variance, mean(z^2) - mean(z)^2 clipped at 0), the
output rounded once. The backward pass is the LayerNorm gradient in float32,
dz = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy scale, rounded to the dtype, then
the dropout mask and scale in the dtype; the parameter gradients are float32 sums. Up to
float32 summation order this is what jax's own backward pass of the expression computes,
with one rounding fewer: jax rounds the input gradient's two terms to the dtype and adds
them there (tests/models/kernels/test_residual_norm.py, in Pallas' interpret mode on CPU, where the
kernels spell their dtype roundings out: see _round).

model.residual_norm picks the path (see path()): "auto" (the kernels on GPU for a post-LN
model in bfloat16 / float16 with hash dropout and no remat; else XLA's), "xla", "pallas"
(also on CPU, in interpret mode: tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from bert_jax.models.kernels.backend import axes_size, check_tiles, platform, sharded_axes
from bert_jax.models.kernels.dropout_hash import GOLDEN, drop_threshold, fmix32

try:  # jax's Triton-specific Pallas options; optional
    from jax.experimental.pallas import triton as _triton
except ImportError:  # pragma: no cover
    _triton = None



@dataclasses.dataclass(frozen=True)
class NormTuning:
    """The two kernels' launch parameters. They change speed, not results, up to float32
    summation order: z is elementwise, bit for bit under any tuning; the statistics follow
    fwd_chunk, the column sums bwd_rows, bwd_step and bwd_chunk (benchmarks/
    kernel_bandwidth.py checks each tuning against the defaults).

    fwd_rows: rows per program of the forward kernel (each row's statistics in one pass).
    fwd_chunk, bwd_chunk: columns per load, at most: the hidden size is read as hidden /
      chunk power-of-two tiles (Triton's tiles are powers of two; 768 = 3 x 256).
    bwd_rows: rows per program of the backward kernel, at most (the largest power of two
      dividing the rows): its column sums are written once per program.
    bwd_step: rows per step inside a backward program; it keeps three float32 [bwd_step,
      hidden] arrays live (the normalised input, the scaled and the plain cotangent).
    *_num_warps, *_num_stages: Triton's, per kernel (stages pipeline the backward's loop
      over steps; the forward has no loop). Not yet tuned on a GPU:
      benchmarks/kernel_bandwidth.py --sweep is the instrument (benchmarks/RESULTS.md)."""

    fwd_rows: int = 8
    fwd_chunk: int = 256
    fwd_num_warps: int = 4
    fwd_num_stages: int = 1
    bwd_rows: int = 128
    bwd_step: int = 8
    bwd_chunk: int = 256
    bwd_num_warps: int = 4
    bwd_num_stages: int = 1

    def __post_init__(self):
        check_tiles(self, ("fwd_rows", "fwd_chunk", "fwd_num_warps", "bwd_rows", "bwd_step",
                           "bwd_chunk", "bwd_num_warps"))
        if self.bwd_step > self.bwd_rows or min(self.fwd_num_stages, self.bwd_num_stages) < 1:
            raise ValueError(f"NormTuning: bwd_step <= bwd_rows and stages >= 1, got {self}")


TUNING = NormTuning()  # what the model's kernels run with


def chunk(width: int, cap: int = TUNING.bwd_chunk) -> int | None:
    """The column tile for rows of `width`: its largest power-of-two divisor up to `cap`, or
    None when that is under 16 (XLA then)."""
    c = 1
    while c < cap and width % (2 * c) == 0:
        c *= 2
    return c if c >= 16 else None


def tiles(rows: int, width: int, tuning: NormTuning = TUNING) -> bool:
    """Whether [rows, width] operands fit the kernels' blocks."""
    return (chunk(width, tuning.fwd_chunk) is not None
            and chunk(width, tuning.bwd_chunk) is not None
            and rows % max(tuning.fwd_rows, tuning.bwd_step) == 0)


def backward_rows(rows: int, tuning: NormTuning = TUNING) -> int:
    """Rows per program of the backward kernel: the largest power of two dividing `rows`,
    up to tuning.bwd_rows."""
    n = tuning.bwd_step
    while n < tuning.bwd_rows and rows % (2 * n) == 0:
        n *= 2
    return n


def _seeds_u32(v_ref, k):
    """The k-th uint32 of the vectors' last row (the hash seeds and the row offset)."""
    return jax.lax.bitcast_convert_type(v_ref[3, k], jnp.uint32)


def _row_hash(v_ref, first_row, n):
    """<uint32>[n]: fmix32(row ^ s0) ^ s1 (dropout._seeded_bits) for rows first_row ..."""
    rows = (_seeds_u32(v_ref, 2) + jnp.asarray(first_row).astype(jnp.uint32)
            + jax.lax.iota(jnp.int32, n).astype(jnp.uint32))
    return fmix32(rows ^ _seeds_u32(v_ref, 0)) ^ _seeds_u32(v_ref, 1)


def _keep(row_hash, first_col, n, threshold):
    """<bool>[rows, n]: the hash mask's kept elements in columns first_col ..."""
    cols = (first_col + jax.lax.iota(jnp.int32, n)).astype(jnp.uint32) * np.uint32(GOLDEN)
    return fmix32(row_hash[:, None] + cols[None, :]) >= np.uint32(threshold)


def _round(x, dtype, exact):
    """float32 x rounded to `dtype` and back: the rounding of an operation in `dtype`.
    exact (interpret mode): XLA:CPU's excess-precision rewrite drops such a round trip, so
    the rounding is spelled out with reduce_precision, which it keeps: the kernels then
    compute on CPU what they compute on a GPU."""
    if exact and dtype in (jnp.bfloat16, jnp.float16):
        info = jnp.finfo(dtype)
        x = jax.lax.reduce_precision(x, exponent_bits=info.nexp, mantissa_bits=info.nmant)
    return x.astype(dtype).astype(jnp.float32)


def _fwd_kernel(v_ref, p_ref, r_ref, y_ref, z_ref, mean_ref, rstd_ref, *, threshold,
                drop_scale, eps, width, c, exact):
    n = p_ref.shape[0]
    dtype = p_ref.dtype
    row_hash = _row_hash(v_ref, pl.program_id(0) * n, n) if threshold else None
    zs, total, total_sq = [], jnp.zeros((n,), jnp.float32), jnp.zeros((n,), jnp.float32)
    for j in range(width // c):
        cols = pl.ds(j * c, c)
        # in float32, each rounding of the XLA path's dtype arithmetic spelled out
        t = _round(p_ref[:, cols].astype(jnp.float32) + v_ref[0, cols][None, :], dtype, exact)
        if threshold:
            scale = jnp.float32(_round(jnp.float32(drop_scale), dtype, False))
            t = jnp.where(_keep(row_hash, j * c, c, threshold), _round(t * scale, dtype, exact),
                          0.0)
        z = _round(r_ref[:, cols].astype(jnp.float32) + t, dtype, exact)
        z_ref[:, cols] = z.astype(dtype)
        zs.append(z)
        total += jnp.sum(z, axis=1)
        total_sq += jnp.sum(z * z, axis=1)
    mean = total / width
    var = jnp.maximum(total_sq / width - mean * mean, 0.0)
    rstd = jax.lax.rsqrt(var + eps)
    mean_ref[...] = mean
    rstd_ref[...] = rstd
    for j, z in enumerate(zs):
        cols = pl.ds(j * c, c)
        y = ((z - mean[:, None]) * (rstd[:, None] * v_ref[1, cols][None, :])
             + v_ref[2, cols][None, :])
        y_ref[:, cols] = y.astype(y_ref.dtype)


def _bwd_kernel(v_ref, *refs, threshold, drop_scale, width, c, n_dy, exact, step):
    dy_refs, (z_ref, mean_ref, rstd_ref, dr_ref, dp_ref, part_ref) = refs[:n_dy], refs[n_dy:]
    n = z_ref.shape[0]
    dtype = z_ref.dtype
    nc = width // c
    first = pl.program_id(0) * n

    def body(i, acc):  # acc: (scale, shift, bias) gradient sums, nc <f32>[c] tiles each
        rows = pl.ds(i * step, step)
        mean = mean_ref[rows][:, None]
        rstd = rstd_ref[rows][:, None]
        xs, gs, dys = [], [], []
        a = jnp.zeros((step,), jnp.float32)
        b = jnp.zeros((step,), jnp.float32)
        for j in range(nc):
            cols = pl.ds(j * c, c)
            x = (z_ref[rows, cols].astype(jnp.float32) - mean) * rstd
            dy = dy_refs[0][rows, cols].astype(jnp.float32)
            for other in dy_refs[1:]:  # the output's copies' cotangents, summed here
                dy += other[rows, cols].astype(jnp.float32)
            g = dy * v_ref[1, cols][None, :]
            a += jnp.sum(g, axis=1)
            b += jnp.sum(g * x, axis=1)
            xs.append(x)
            gs.append(g)
            dys.append(dy)
        a = a[:, None] / width
        b = b[:, None] / width
        row_hash = _row_hash(v_ref, first + i * step, step) if threshold else None
        d_scale, d_shift, d_bias = (list(t) for t in acc)
        for j in range(nc):
            cols = pl.ds(j * c, c)
            dz = _round(rstd * (gs[j] - a - xs[j] * b), dtype, exact)
            dr_ref[rows, cols] = dz.astype(dtype)
            dp = dz
            if threshold:
                scale = jnp.float32(_round(jnp.float32(drop_scale), dtype, False))
                dp = _round(jnp.where(_keep(row_hash, j * c, c, threshold), dz, 0.0) * scale,
                            dtype, exact)
            dp_ref[rows, cols] = dp.astype(dtype)
            d_bias[j] += jnp.sum(dp, axis=0)
            d_scale[j] += jnp.sum(dys[j] * xs[j], axis=0)
            d_shift[j] += jnp.sum(dys[j], axis=0)
        return tuple(d_scale), tuple(d_shift), tuple(d_bias)

    zero = tuple(jnp.zeros((c,), jnp.float32) for _ in range(nc))
    d_scale, d_shift, d_bias = jax.lax.fori_loop(0, n // step, body, (zero, zero, zero))
    # the rows of the vectors' gradient: bias, scale, shift, and none for the seeds' row
    for k, tiles_ in enumerate((d_bias, d_scale, d_shift, zero)):
        for j, t in enumerate(tiles_):
            part_ref[pl.ds(k * width + j * c, c)] = t


def _drop_scale(rate: float) -> float:
    """dropout's scale for kept elements (_hash_scale), as a Python float."""
    return 1.0 / (1.0 - drop_threshold(rate) / 2.0**32)


def _compiler_params(num_warps: int, num_stages: int):
    params = (getattr(_triton, "CompilerParams", None)
              or getattr(_triton, "TritonCompilerParams", None))
    return None if params is None else params(num_warps=num_warps, num_stages=num_stages)


def vectors(bias, scale, shift, seeds, row_offset=0):
    """<float32>[4, width]: the operand the kernels take for the bias, the LayerNorm's scale
    and shift, and (bit for bit, as float32 bits) the two uint32 hash seeds (zeros without
    dropout) and the rows' global offset. One operand: XLA makes it in one small kernel
    from the layer's stacked parameters (three operands would be three slice kernels)."""
    width = bias.shape[-1]
    s = jnp.zeros((2,), jnp.uint32) if seeds is None else seeds.astype(jnp.uint32)
    u = jnp.concatenate([s, jnp.asarray(row_offset, jnp.uint32).reshape(1),
                         jnp.zeros((width - 3,), jnp.uint32)])
    return jnp.stack([bias.astype(jnp.float32), scale.astype(jnp.float32),
                      shift.astype(jnp.float32),
                      jax.lax.bitcast_convert_type(u, jnp.float32)])


def _with_row_offset(v, offset):
    """vectors() with `offset` added to its row offset (a shard's first global row)."""
    u = jax.lax.bitcast_convert_type(v[3], jnp.uint32)
    return v.at[3].set(jax.lax.bitcast_convert_type(u.at[2].add(offset), jnp.float32))


def forward(p, residual, v, *, rate, eps, interpret=False, tuning: NormTuning = TUNING):
    """The forward kernel on [rows, width] operands and vectors() v: (y, z, mean, rstd),
    y and z <dtype>[rows, width], mean and rstd <f32>[rows]. tuning: the launch parameters
    (the model's: TUNING; rows must tile them, tiles())."""
    rows, width = p.shape
    c = chunk(width, tuning.fwd_chunk)
    n = tuning.fwd_rows
    block = pl.BlockSpec((n, width), lambda i: (i, 0))
    stat = pl.BlockSpec((n,), lambda i: (i,))
    return pl.pallas_call(
        functools.partial(_fwd_kernel, threshold=drop_threshold(rate),
                          drop_scale=_drop_scale(rate), eps=eps, width=width, c=c,
                          exact=interpret),
        grid=(rows // n,),
        in_specs=[pl.BlockSpec((4, width), lambda i: (0, 0)), block, block],
        out_specs=[block, block, stat, stat],
        out_shape=[jax.ShapeDtypeStruct((rows, width), p.dtype)] * 2
        + [jax.ShapeDtypeStruct((rows,), jnp.float32)] * 2,
        compiler_params=None if interpret else _compiler_params(tuning.fwd_num_warps,
                                                                tuning.fwd_num_stages),
        interpret=interpret, name="residual_norm_fwd",
    )(v, p, residual.astype(p.dtype))


def backward(dys, z, mean, rstd, v, *, rate, interpret=False, tuning: NormTuning = TUNING):
    """The backward kernel on [rows, width] operands: dys, the cotangents of the output's
    copies (summed in the kernel); returns (d_residual, d_p, d_v) with d_v <f32>[4, width]
    the float32 column sums: bias, scale and shift gradients, zeros for the seeds' row.
    tuning: the launch parameters (the model's: TUNING)."""
    rows, width = z.shape
    c = chunk(width, tuning.bwd_chunk)
    n = backward_rows(rows, tuning)
    block = pl.BlockSpec((n, width), lambda i: (i, 0))
    stat = pl.BlockSpec((n,), lambda i: (i,))
    programs = rows // n
    dr, dp, part = pl.pallas_call(
        functools.partial(_bwd_kernel, threshold=drop_threshold(rate),
                          drop_scale=_drop_scale(rate), width=width, c=c, n_dy=len(dys),
                          exact=interpret, step=tuning.bwd_step),
        grid=(programs,),
        in_specs=[pl.BlockSpec((4, width), lambda i: (0, 0))] + [block] * (len(dys) + 1)
        + [stat, stat],
        out_specs=[block, block, pl.BlockSpec((None, 4 * width), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((rows, width), z.dtype)] * 2
        + [jax.ShapeDtypeStruct((programs, 4 * width), jnp.float32)],
        compiler_params=None if interpret else _compiler_params(tuning.bwd_num_warps,
                                                                tuning.bwd_num_stages),
        interpret=interpret, name="residual_norm_bwd",
    )(v, *(d.astype(z.dtype) for d in dys), z, mean, rstd)
    return dr, dp, jnp.sum(part, axis=0).reshape(4, width)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _residual_norm(p, residual, v, rate, eps, copies, interpret):
    y = _sharded(forward, (p, residual, v), dict(rate=rate, eps=eps, interpret=interpret))[0]
    return (y,) * copies


def _residual_norm_fwd(p, residual, v, rate, eps, copies, interpret):
    y, z, mean, rstd = _sharded(forward, (p, residual, v),
                                dict(rate=rate, eps=eps, interpret=interpret))
    return (y,) * copies, (z, mean, rstd, v)


def _residual_norm_bwd(rate, eps, copies, interpret, res, dys):
    z, mean, rstd, v = res
    dr, dp, dv = _sharded(backward, (tuple(dys), z, mean, rstd, v),
                          dict(rate=rate, interpret=interpret))
    return dp, dr, dv


_residual_norm.defvjp(_residual_norm_fwd, _residual_norm_bwd)


def _row_axes():
    """(mesh, the mesh axes the rows are sharded over (the "batch" rule), whether the hidden
    axis ("embed") is sharded); (None, (), False) without a mesh."""
    sharded = sharded_axes(("batch", "embed"))
    if sharded is None:
        return None, (), False
    mesh, (rows, embed) = sharded
    return mesh, rows, bool(embed)


def _sharded(kernel, args, kw):
    """kernel(*args, **kw): forward (p, residual, v) or backward (dys, z, mean, rstd, v) on
    [rows, width] operands; under a mesh, per shard of examples (jax.shard_map over the
    "batch" rule's axes: a custom kernel is opaque to XLA's sharding propagation), each
    told its rows' global offset for the dropout hash."""
    mesh, row_axes, _ = _row_axes()
    if not row_axes:
        return kernel(*args, **kw)
    rows, stats = P(row_axes, None), P(row_axes)
    if kernel is forward:
        in_specs, out_specs = (rows, rows, P()), (rows, rows, stats, stats)
    else:
        in_specs = ((rows,) * len(args[0]), rows, stats, stats, P())
        out_specs = (rows, rows, P())

    def local(*a):
        *a, v = a
        offset = jax.lax.axis_index(row_axes).astype(jnp.uint32) * np.uint32(a[1].shape[0])
        out = kernel(*a, _with_row_offset(v, offset), **kw)
        if kernel is backward:  # the column sums are per shard: add them up
            out = (*out[:2], jax.lax.psum(out[2], row_axes))
        return out

    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=False)(*args)


def path(impl: str, plat: str, config) -> bool:
    """Whether model.residual_norm=impl takes the kernels for `config` on platform `plat`:
    a post-LN model (BERT's) with biases and LayerNorm biases whose dropout masks the
    kernels can draw (hash, or no dropout). "auto": also on GPU only, in bfloat16 /
    float16, without remat (a remat policy names the LayerNorm's input and statistics,
    which the kernels keep as their own residuals)."""
    if impl == "xla" or config.pre_ln or not (config.use_bias and config.norm_bias
                                              and config.layer0_attention_norm):
        return False
    if config.hidden_dropout_prob > 0 and config.dropout_rng != "hash":
        return False
    if impl == "auto":
        return (plat == "gpu" and config.remat == "none"
                and jnp.dtype(config.compute_dtype) in (jnp.bfloat16, jnp.float16))
    return True


def fits(shape) -> bool:
    """Whether activations of `shape` ([..., hidden], batch-major) fit the kernels here:
    each shard's rows tile the blocks, and the hidden axis is not sharded."""
    mesh, row_axes, embed_sharded = _row_axes()
    if embed_sharded:
        return False
    shards = axes_size(mesh, row_axes) if row_axes else 1
    if shape[0] % shards:
        return False
    return tiles(math.prod(shape[:-1]) // shards, shape[-1])


def residual_norm(p, bias, residual, scale, shift, seeds, *, rate: float, eps: float,
                  copies: int = 1, interpret: bool | None = None):
    """LayerNorm(residual + hash_dropout((p + bias) in p's dtype)) * scale + shift through
    the kernels (module doc). p, residual: <dtype>[..., hidden] (batch-major leading axes;
    check fits(p.shape) first); bias, scale, shift: [hidden]; seeds: <uint32>[2] or None
    (no dropout: rate is then ignored). copies=2 returns the output twice, for two
    consumers whose cotangents the backward kernel then adds itself (XLA would add them
    in a kernel of its own first). interpret=None: interpret mode iff the trace compiles
    for CPU."""
    if not fits(p.shape):
        raise ValueError(f"residual_norm: activations {p.shape} do not fit the kernels "
                         f"(check kernels.residual_norm.fits first)")
    if interpret is None:
        interpret = platform() == "cpu"
    if seeds is None:
        rate = 0.0
    width = p.shape[-1]
    flat = lambda a: a.reshape(-1, width)  # noqa: E731
    ys = _residual_norm(flat(p), flat(residual).astype(p.dtype),
                        vectors(bias, scale, shift, seeds), float(rate), float(eps),
                        int(copies), bool(interpret))
    ys = tuple(y.reshape(p.shape) for y in ys)
    return ys if copies > 1 else ys[0]
