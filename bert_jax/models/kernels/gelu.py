"""The FFN's bias + exact GELU with a one-kernel backward pass on GPU (Pallas).

    y = bias_gelu(p, bias)          # == gelu_erf((p.astype(float32) + bias).astype(p.dtype))
    o = gelu_matmul(p, bias, w_out)  # == bias_gelu(p, bias) @ w_out, for remat (below)

p: the product x W_in in the compute dtype, [..., width]; bias: <float32>[width]. The forward
pass is XLA's (one fused elementwise kernel, as before). The backward pass, for a cotangent
g, is one Pallas kernel that reads p and g once and writes dh = GELU'(h) g, rounded to p's
dtype, and per-program float32 column sums of that dh, whose total (a few [programs, width]
rows added by XLA) is the bias gradient.

Why a kernel: XLA fuses that backward pass (GELU', the cast, the bias-gradient reduction)
into one kernel only when its cost model finds it worth computing GELU' twice. Compiling
BERT-Base's step for the H100 description in ../shared/gpu it does; for an H200 (more memory
bandwidth) it writes GELU' g as a float32 [tokens, width] array and reads it back for the
reduction and the cast: 1,347 MiB a layer instead of 579, 4.3 ms of a 56 ms step measured on
an H200 (benchmarks/RESULTS.md). The kernel moves the 579 MiB whatever the device.

Under remat the backward pass also needs the GELU's output again, for the gradient of the
FFN's second product. XLA recomputes it in the same kernel as GELU' g on the H100
description (1.0 GiB a layer at BERT-Large) and in a separate one on the H200's (2.0 GiB);
bias_gelu there would leave it a kernel of its own (1.25 GiB). gelu_matmul takes the second
product into its custom backward pass: its kernel writes the GELU's output beside dh (1.0
GiB on either description), and w_out's gradient is computed from it.

Numerics are jax's for the expression above: h is rounded to the compute dtype before GELU
(on GPU, XLA's excess-precision rewrite skips that rounding in its own fusions), the bias
gradient is the float32 sum of dh as rounded (what PyTorch's autocast accumulates). erf is
Eigen's rational approximation for float32 (Pallas has no erf on GPU), 5e-7 from the exact
erf as lax.erf is (tests/models/kernels/test_gelu.py).

model.gelu_backward picks the path (see path()): "auto" (on GPU for a bfloat16 / float16
exact-GELU FFN, bias_gelu without remat and gelu_matmul under it; else XLA's), "xla",
"pallas" (also on CPU, in Pallas' interpret mode: tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from bert_jax.models.kernels.backend import axes_size, check_tiles, platform, sharded_axes

try:  # jax's Triton-specific Pallas options; optional
    from jax.experimental.pallas import triton as _triton
except ImportError:  # pragma: no cover
    _triton = None



@dataclasses.dataclass(frozen=True)
class GeluTuning:
    """The backward kernel's launch parameters. They change speed, not results: dh and y
    are elementwise, bit for bit under any tuning; only the bias gradient's float32
    summation order follows rows and chunk (benchmarks/kernel_bandwidth.py checks both).

    rows: rows (tokens) per program, at most (the largest power of two dividing the rows,
      up to it): the column sums are written once per program.
    chunk: rows per step inside a program; [chunk, cols] float32 tiles, 32 values a
      thread at the defaults (8 x 512 over 4 warps), and a [chunk, cols] accumulator.
    cols: columns per program, at most (the largest power of two dividing the width).
    num_warps, num_stages: Triton's (stages would pipeline the loads of the loop over chunks).
    Not yet tuned on a GPU: 4 warps, so that each step's few float32 tiles and the
    accumulator stay in registers, which also bounds the warps an SM holds.
    benchmarks/kernel_bandwidth.py --sweep is the instrument (benchmarks/RESULTS.md)."""

    rows: int = 128
    chunk: int = 8
    cols: int = 512
    num_warps: int = 4
    num_stages: int = 1

    def __post_init__(self):
        check_tiles(self, ("rows", "chunk", "cols", "num_warps"))
        if self.chunk > self.rows or self.num_stages < 1:
            raise ValueError(f"GeluTuning: chunk <= rows and num_stages >= 1, got {self}")


TUNING = GeluTuning()  # what the model's kernels run with


def gelu_erf(x):
    """The exact GELU, x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2))): the formula PyTorch's
    `gelu` (so transformers' "gelu") and TF's `gelu(approximate=False)` evaluate.
    jax.nn.gelu(approximate=False) computes the same function through erfc(-x / sqrt(2)),
    whose XLA:CPU expansion (and its derivative) is slower than this form
    (benchmarks/RESULTS.md). Both are within float32 rounding of the float64 GELU and of
    its derivative (tests/models/test_layers.py).

    A bfloat16 or float16 input is computed in float32 and rounded once, as PyTorch's GELU
    kernels do for half-precision tensors (their float32 "opmath"); the formula in half
    precision would round after the scaling, the erf, the sum and each product. Both
    passes stay in one fused elementwise kernel: no more memory traffic."""
    if x.dtype in (jnp.bfloat16, jnp.float16):
        return gelu_erf(x.astype(jnp.float32)).astype(x.dtype)
    half = jnp.asarray(0.5, x.dtype)
    return x * half * (1 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, x.dtype)))


# erf(x) for float32: Eigen's rational approximation (XLA's float32 erf), clamped to
# [-4, 4], beyond which erf is +-1 in float32. Odd numerator, even denominator, in x^2.
# Also the exported SavedModel's erf (convert/savedmodel.py: TensorFlow has no chlo.erf).
_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
              -1.60960333262415e-02)
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
             -7.37332916720468e-03, -1.42647390514189e-02)


def erf_f32(x):
    """erf of a float32 array with elementwise ops only (usable inside Pallas kernels)."""
    x = jnp.clip(x, -4.0, 4.0)
    x2 = x * x
    p = jnp.float32(_ERF_ALPHA[0])
    for a in _ERF_ALPHA[1:]:
        p = p * x2 + jnp.float32(a)
    q = jnp.float32(_ERF_BETA[0])
    for b in _ERF_BETA[1:]:
        q = q * x2 + jnp.float32(b)
    return x * p / q


def gelu_grad_f32(x):
    """d/dx of x * Phi(x), float32: Phi(x) + x * phi(x)."""
    cdf = 0.5 * (1.0 + erf_f32(x * 0.7071067811865476))
    return cdf + x * (jnp.exp(-0.5 * x * x) * 0.3989422804014327)


def _largest_pow2_divisor(n: int, cap: int) -> int:
    d = 1
    while d < cap and n % (2 * d) == 0:
        d *= 2
    return d


def blocks(rows: int, width: int, tuning: GeluTuning = TUNING):
    """(row block, column block) of the backward kernel for [rows, width], or None when
    the shapes do not tile (a row block under tuning.chunk or a column block under 16: XLA
    then)."""
    br = _largest_pow2_divisor(rows, tuning.rows)
    bw = _largest_pow2_divisor(width, tuning.cols)
    if br < tuning.chunk or bw < 16:
        return None
    return br, bw


def _bwd_kernel(p_ref, b_ref, g_ref, *out_refs, with_output: bool, chunk: int):
    """One [br, bw] block: dh = GELU'(h) g rounded to the dtype, h = (p + b) rounded, and
    the float32 column sums of dh (part_ref: <f32>[bw]); with_output: also y = GELU(h)
    rounded (y_ref first), the forward's output again for a backward pass that needs it."""
    y_ref, dh_ref, part_ref = out_refs if with_output else (None, *out_refs)
    bias = b_ref[...].astype(jnp.float32)
    br = p_ref.shape[0]

    def body(i, acc):  # acc: <f32>[chunk, bw], summed over its rows once, at the end
        rows = pl.ds(i * chunk, chunk)
        p = p_ref[rows, :]
        h = (p.astype(jnp.float32) + bias[None, :]).astype(p.dtype).astype(jnp.float32)
        erf = erf_f32(h * 0.7071067811865476)
        if with_output:
            y_ref[rows, :] = (h * 0.5 * (1.0 + erf)).astype(y_ref.dtype)
        grad = 0.5 * (1.0 + erf) + h * (jnp.exp(-0.5 * h * h) * 0.3989422804014327)
        dh = (grad * g_ref[rows, :].astype(jnp.float32)).astype(dh_ref.dtype)
        dh_ref[rows, :] = dh
        return acc + dh.astype(jnp.float32)

    acc = jax.lax.fori_loop(0, br // chunk, body,
                            jnp.zeros((chunk, p_ref.shape[1]), jnp.float32))
    part_ref[...] = jnp.sum(acc, axis=0)


def _compiler_params(tuning: GeluTuning):
    params = (getattr(_triton, "CompilerParams", None)
              or getattr(_triton, "TritonCompilerParams", None))
    return None if params is None else params(num_warps=tuning.num_warps,
                                              num_stages=tuning.num_stages)


def gelu_backward(p, bias, g, *, with_output: bool = False, interpret: bool = False,
                  tuning: GeluTuning = TUNING):
    """(dh, db) of bias_gelu at p for the cotangent g: p, g <dtype>[rows, width], bias
    <f32>[width]; dh <dtype>[rows, width], db <f32>[width]. with_output: (y, dh, db), y the
    forward's output recomputed in the same pass. Shapes must tile (blocks(rows, width,
    tuning)); tuning: the launch parameters (the model's: TUNING)."""
    rows, width = p.shape
    br, bw = blocks(rows, width, tuning)
    block = pl.BlockSpec((br, bw), lambda i, j: (i, j))
    full = jax.ShapeDtypeStruct(p.shape, p.dtype)
    *outs, part = pl.pallas_call(
        functools.partial(_bwd_kernel, with_output=with_output, chunk=tuning.chunk),
        grid=(rows // br, width // bw),
        in_specs=[block, pl.BlockSpec((bw,), lambda i, j: (j,)), block],
        out_specs=[block] * (1 + with_output) + [pl.BlockSpec((None, bw), lambda i, j: (i, j))],
        out_shape=[full] * (1 + with_output) + [
            jax.ShapeDtypeStruct((rows // br, width), jnp.float32)],
        compiler_params=None if interpret else _compiler_params(tuning), interpret=interpret,
        name="gelu_backward",
    )(p, bias.astype(jnp.float32), g.astype(p.dtype))
    return (*outs, jnp.sum(part, axis=0))


def reference(p, bias):
    """The expression bias_gelu computes, differentiated by jax (XLA's backward pass)."""
    return gelu_erf((p.astype(jnp.float32) + bias.astype(jnp.float32)).astype(p.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _bias_gelu(p, bias, interpret):
    return reference(p, bias)


def _bias_gelu_fwd(p, bias, interpret):
    return reference(p, bias), (p, bias)


def _bias_gelu_bwd(interpret, res, g):
    p, bias = res
    lead, width = p.shape[:-1], p.shape[-1]
    out = _sharded_backward(p.reshape(-1, width), bias, g.reshape(-1, width), interpret, lead)
    if out is None:  # the shards do not tile the kernel's blocks: XLA's backward pass
        _, vjp = jax.vjp(reference, p, bias)
        return vjp(g)
    dh, db = out
    return dh.reshape(p.shape), db.astype(bias.dtype)


_bias_gelu.defvjp(_bias_gelu_fwd, _bias_gelu_bwd)


def _sharded_backward(p, bias, g, interpret, lead, with_output=False):
    """gelu_backward on [rows, width] operands; under a mesh, per shard (jax.shard_map):
    rows over the mesh axes of the "batch" rule, columns over those of "mlp" (a custom kernel
    is opaque to XLA's sharding propagation, which would gather the whole array). None when
    the shards do not tile the kernel's blocks."""
    sharded = sharded_axes(("batch", "mlp"))
    if sharded is None:
        return gelu_backward(p, bias, g, with_output=with_output, interpret=interpret)
    mesh, (row_axes, col_axes) = sharded
    size = lambda names: axes_size(mesh, names)  # noqa: E731
    if lead and lead[0] % size(row_axes):  # rows are batch-major: shard whole examples
        row_axes = ()
    if p.shape[1] % size(col_axes):
        col_axes = ()
    if blocks(p.shape[0] // size(row_axes), p.shape[1] // size(col_axes)) is None:
        return None
    x_spec = P(row_axes or None, col_axes or None)
    b_spec = P(col_axes or None)

    def local(p, bias, g):
        *outs, db = gelu_backward(p, bias, g, with_output=with_output, interpret=interpret)
        if row_axes:
            db = jax.lax.psum(db, row_axes)
        return (*outs, db)

    return jax.shard_map(local, mesh=mesh, in_specs=(x_spec, b_spec, x_spec),
                         out_specs=(x_spec,) * (1 + with_output) + (b_spec,),
                         check_vma=False)(p, bias, g)


def path(impl: str, plat: str, dtype, hidden_act: str, remat: str = "none",
         fp8: bool = False):
    """Which kernel model.gelu_backward=impl takes for an FFN of `hidden_act` in compute
    `dtype` on platform `plat` under model.remat=`remat`: None (XLA's backward pass), "gelu"
    (bias_gelu) or "gelu_matmul" (gelu_matmul, under remat). "auto": a kernel on GPU for an
    exact-GELU FFN in bfloat16 / float16. Under remat the backward pass needs the GELU's
    output again (the FFN's second product): gelu_matmul's kernel recomputes it beside
    GELU' g, reading the product once, where bias_gelu would leave XLA a second pass for
    it (BERT-Large's step: 6 GiB more than XLA's own fusion on the H100 description).
    With `fp8` (model.fp8) the FFN's second product is an FP8 op of its own, which
    gelu_matmul's backward pass (a plain product) would bypass: "gelu" instead."""
    if impl == "xla" or hidden_act != "gelu":
        return None
    if impl == "auto" and not (plat == "gpu"
                               and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)):
        return None
    return "gelu" if remat == "none" or fp8 else "gelu_matmul"


def bias_gelu(p, bias, *, interpret: bool | None = None):
    """gelu_erf((p.astype(float32) + bias).astype(p.dtype)) whose backward pass is the Pallas
    kernel (interpret=None: interpret mode iff the trace compiles for CPU). Falls back to
    the plain expression when the rows and width do not tile the kernel's blocks."""
    if blocks(math.prod(p.shape[:-1]), p.shape[-1]) is None:
        return reference(p, bias)
    if interpret is None:
        interpret = platform() == "cpu"
    return _bias_gelu(p, bias, bool(interpret))


def _matmul(y, w, precision=None):
    """y @ w over y's last axis, as Dense computes its product."""
    return jax.lax.dot_general(y, w, (((y.ndim - 1,), (0,)), ((), ())), precision=precision)


def matmul_reference(p, bias, w, precision=None):
    """The expression gelu_matmul computes, differentiated by jax."""
    return _matmul(reference(p, bias), w, precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gelu_matmul(p, bias, w, precision, interpret):
    return matmul_reference(p, bias, w, precision)


def _gelu_matmul_fwd(p, bias, w, precision, interpret):
    # The GELU's output is not kept: the backward kernel writes it again beside GELU' g.
    return matmul_reference(p, bias, w, precision), (p, bias, w)


def _gelu_matmul_bwd(precision, interpret, res, g):
    p, bias, w = res
    lead, width = p.shape[:-1], p.shape[-1]
    dy = jax.lax.dot_general(g, w, (((g.ndim - 1,), (1,)), ((), ())), precision=precision)
    out = _sharded_backward(p.reshape(-1, width), bias, dy.reshape(-1, width).astype(p.dtype),
                            interpret, lead, with_output=True)
    if out is None:  # the shards do not tile the kernel's blocks: jax's backward pass
        return jax.vjp(lambda p, b, w: matmul_reference(p, b, w, precision), p, bias, w)[1](g)
    y, dh, db = out
    g2 = g.reshape(-1, g.shape[-1])
    dw = jax.lax.dot_general(y, g2, (((0,), (0,)), ((), ())), precision=precision)
    return dh.reshape(p.shape), db.astype(bias.dtype), dw.astype(w.dtype)


_gelu_matmul.defvjp(_gelu_matmul_fwd, _gelu_matmul_bwd)


def gelu_matmul(p, bias, w, *, precision=None, interpret: bool | None = None):
    """bias_gelu(p, bias) @ w (the FFN's second product, before its bias) whose backward
    pass recomputes the GELU's output in the kernel that computes GELU' g: for a backward
    pass under remat, which needs that output for w's gradient. p: <dtype>[..., width];
    bias <f32>[width]; w <dtype>[width, out]. Falls back to the plain expression when the
    rows and width do not tile the kernel's blocks."""
    if blocks(math.prod(p.shape[:-1]), p.shape[-1]) is None:
        return matmul_reference(p, bias, w, precision)
    if interpret is None:
        interpret = platform() == "cpu"
    return _gelu_matmul(p, bias, w, precision, bool(interpret))
