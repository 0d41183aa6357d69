"""The FFN's bias + exact GELU with a one-kernel backward pass on GPU (Pallas).

    y = bias_gelu(p, bias)     # == gelu_erf((p.astype(float32) + bias).astype(p.dtype))

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

Numerics are jax's for the expression above: h is rounded to the compute dtype before GELU
(on GPU, XLA's excess-precision rewrite skips that rounding in its own fusions), the bias
gradient is the float32 sum of dh as rounded (what PyTorch's autocast accumulates). erf is
Eigen's rational approximation for float32 (Pallas has no erf on GPU), 5e-7 from the exact
erf as lax.erf is (tests/models/test_gelu_ops.py).

model.gelu_backward picks the path: "auto" (this kernel on GPU for a bfloat16 / float16
exact-GELU FFN without remat, else XLA's; see applies), "xla", "pallas" (also on CPU, in
Pallas' interpret mode: tests).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

try:  # jax's Triton-specific Pallas options; optional
    from jax.experimental.pallas import triton as _triton
except ImportError:  # pragma: no cover
    _triton = None

ROWS = 128   # rows (tokens) per program: the column sums are written once per ROWS rows
CHUNK = 16   # rows per step inside a program
COLS = 512   # columns per program (the largest power of two dividing the width, up to it)

# erf(x) for float32: Eigen's rational approximation (XLA's float32 erf), clamped to
# [-4, 4], beyond which erf is +-1 in float32. Odd numerator, even denominator, in x^2.
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


def blocks(rows: int, width: int):
    """(row block, column block) of the backward kernel for [rows, width], or None when
    the shapes do not tile (a row block under CHUNK or a column block under 16: XLA then)."""
    br = _largest_pow2_divisor(rows, ROWS)
    bw = _largest_pow2_divisor(width, COLS)
    if br < CHUNK or bw < 16:
        return None
    return br, bw


def _bwd_kernel(p_ref, b_ref, g_ref, dh_ref, part_ref):
    """One [br, bw] block: dh = GELU'(h) g rounded to the dtype, h = (p + b) rounded, and
    the float32 column sums of dh (part_ref: <f32>[bw])."""
    bias = b_ref[...].astype(jnp.float32)
    br = p_ref.shape[0]

    def body(i, acc):
        rows = pl.ds(i * CHUNK, CHUNK)
        p = p_ref[rows, :]
        h = (p.astype(jnp.float32) + bias[None, :]).astype(p.dtype).astype(jnp.float32)
        dh = (gelu_grad_f32(h) * g_ref[rows, :].astype(jnp.float32)).astype(dh_ref.dtype)
        dh_ref[rows, :] = dh
        return acc + jnp.sum(dh.astype(jnp.float32), axis=0)

    part_ref[...] = jax.lax.fori_loop(0, br // CHUNK, body,
                                      jnp.zeros((p_ref.shape[1],), jnp.float32))


def _compiler_params():
    params = (getattr(_triton, "CompilerParams", None)
              or getattr(_triton, "TritonCompilerParams", None))
    return None if params is None else params(num_warps=4, num_stages=1)


def gelu_backward(p, bias, g, *, interpret: bool = False):
    """(dh, db) of bias_gelu at p for the cotangent g: p, g <dtype>[rows, width], bias
    <f32>[width]; dh <dtype>[rows, width], db <f32>[width]. Shapes must tile (blocks())."""
    rows, width = p.shape
    br, bw = blocks(rows, width)
    dh, part = pl.pallas_call(
        _bwd_kernel,
        grid=(rows // br, width // bw),
        in_specs=[pl.BlockSpec((br, bw), lambda i, j: (i, j)),
                  pl.BlockSpec((bw,), lambda i, j: (j,)),
                  pl.BlockSpec((br, bw), lambda i, j: (i, j))],
        out_specs=[pl.BlockSpec((br, bw), lambda i, j: (i, j)),
                   pl.BlockSpec((None, bw), lambda i, j: (i, j))],
        out_shape=[jax.ShapeDtypeStruct(p.shape, p.dtype),
                   jax.ShapeDtypeStruct((rows // br, width), jnp.float32)],
        compiler_params=None if interpret else _compiler_params(), interpret=interpret,
        name="gelu_backward",
    )(p, bias.astype(jnp.float32), g.astype(p.dtype))
    return dh, jnp.sum(part, axis=0)


def reference(p, bias):
    """The expression bias_gelu computes, differentiated by jax (XLA's backward pass)."""
    from bert_jax.models.layers import gelu_erf

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


def _sharded_backward(p, bias, g, interpret, lead):
    """gelu_backward on [rows, width] operands; under a mesh, per shard (jax.shard_map):
    rows over the mesh axes of the "batch" rule, columns over those of "mlp" (a custom kernel
    is opaque to XLA's sharding propagation, which would gather the whole array). None when
    the shards do not tile the kernel's blocks."""
    import flax.linen as nn
    from jax.sharding import PartitionSpec as P

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return gelu_backward(p, bias, g, interpret=interpret)
    spec = nn.logical_to_mesh_axes(("batch", "mlp"))
    axes = lambda a: () if a is None else (a,) if isinstance(a, str) else tuple(a)  # noqa: E731
    row_axes = tuple(n for n in axes(spec[0]) if mesh.shape[n] > 1)
    col_axes = tuple(n for n in axes(spec[1]) if mesh.shape[n] > 1)
    size = lambda names: math.prod(mesh.shape[n] for n in names)  # noqa: E731
    if lead and lead[0] % size(row_axes):  # rows are batch-major: shard whole examples
        row_axes = ()
    if p.shape[1] % size(col_axes):
        col_axes = ()
    if blocks(p.shape[0] // size(row_axes), p.shape[1] // size(col_axes)) is None:
        return None
    x_spec = P(row_axes or None, col_axes or None)
    b_spec = P(col_axes or None)

    def local(p, bias, g):
        dh, db = gelu_backward(p, bias, g, interpret=interpret)
        if row_axes:
            db = jax.lax.psum(db, row_axes)
        return dh, db

    return jax.shard_map(local, mesh=mesh, in_specs=(x_spec, b_spec, x_spec),
                         out_specs=(x_spec, b_spec), check_vma=False)(p, bias, g)


def applies(impl: str, platform: str, dtype, hidden_act: str, remat: str = "none") -> bool:
    """Whether model.gelu_backward=impl takes this kernel for an FFN of `hidden_act` in
    compute `dtype` on `platform` under model.remat=`remat`. "auto": GPU, bfloat16 /
    float16, exact GELU, no remat. Under a remat policy the backward pass recomputes the
    GELU's output too (the FFN's second product needs it), and XLA computes it and GELU' g
    in one kernel that reads the product once: BERT-Large's step (minimal_ffn) moved 6 GiB
    more with this kernel (the recomputation then a kernel of its own)."""
    if impl == "xla" or hidden_act != "gelu":
        return False
    if impl == "pallas":
        return True
    return (platform == "gpu" and remat == "none"
            and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16))


def bias_gelu(p, bias, *, interpret: bool | None = None):
    """gelu_erf((p.astype(float32) + bias).astype(p.dtype)) whose backward pass is the Pallas
    kernel (interpret=None: interpret mode iff the trace compiles for CPU). Falls back to
    the plain expression when the rows and width do not tile the kernel's blocks."""
    width = p.shape[-1]
    rows = 1
    for n in p.shape[:-1]:
        rows *= n
    if blocks(rows, width) is None:
        return reference(p, bias)
    if interpret is None:
        from bert_jax.models.attention_ops.backend import platform

        interpret = platform() == "cpu"
    return _bias_gelu(p, bias, bool(interpret))
