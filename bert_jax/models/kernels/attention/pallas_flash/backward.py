"""The Pallas flash-attention backward pass (the custom_vjp's backward rule), recomputing
the probabilities block by block from the forward's log-sum-exp. Keys that fit one backward
key block (up to 128 by default): one fused kernel per (example, head) walks the query
blocks once and writes dQ, dK, dV, with D_i = rowsum(dO * O) computed inside. Longer keys:
D_i from XLA, then one kernel per key block (dK, dV) and one per query block (dQ).

With biases, each backward program also writes the float32 column sums of the dQ, dK or dV
rows it wrote (as rounded): the bias gradients are then a sum over [programs, heads, d]
instead of a pass of XLA over the whole gradients. Rows and columns added by the padding
have zero gradients (dO is zero there, and padded keys get neither probability nor dS), so
they add nothing to the sums."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from bert_jax.models.kernels.attention.pallas_flash.masks import (
    bias_grad, biased, dot, keep_tile, probs, row_hashes, scaled_q, scores, split_refs)
from bert_jax.models.kernels.attention.pallas_flash.tiling import (
    bias_args, compiler_params, kv_block_range, q_block_range)


def _dkdv_kernel(*refs, cfg):
    """One (key block, example, head). [q, k, v biases: <f32>[d] when cfg.bias]; q_ref,
    do_ref: [q_pad, d]; k_ref, v_ref: [bk, d]; qseg_ref: [q_pad]; kseg_ref: [bk]; lse_ref,
    delta_ref: <f32>[q_pad]. Writes dk, dv [and the column sums of each, <f32>[d]]."""
    params_ref, (b_q, b_k, b_v), refs = split_refs(refs, cfg)
    (q_ref, k_ref, v_ref, qseg_ref, kseg_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref,
     *db_refs) = refs
    bq, bk = cfg.bwd_blocks
    kj, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    k, v, k_seg = biased(k_ref[...], b_k), biased(v_ref[...], b_v), kseg_ref[...]

    def body(i, carry):
        dk, dv = carry
        qs = pl.ds(i * bq, bq)
        q, do = scaled_q(biased(q_ref[qs, :], b_q), cfg), do_ref[qs, :]
        s, allowed = scores(q, k, qseg_ref[qs], k_seg, i * bq, kj * bk, cfg)
        p = probs(s, lse_ref[qs], i * bq, cfg)
        pv = p.astype(v.dtype)
        dp = dot(do, v, trans_b=True)  # d(P * Z), float32
        if cfg.threshold:
            keep = keep_tile(row_hashes(params_ref, b, h, i * bq, bq, cfg), kj * bk, bk, cfg)
            pv = jnp.where(keep, pv, 0)
            dp = jnp.where(keep, dp * cfg.keep_scale, 0.0)  # dP = d(P * Z) * Z
        dv = dv + dot(pv, do, trans_a=True)  # keep_scale applied once at the end
        # Disallowed entries get no gradient (xla.py's where): in a row with no allowed key
        # P is uniform, not 0, so the select matters there.
        ds = jnp.where(allowed, p * (dp - delta_ref[qs][:, None]), 0.0)
        dk = dk + dot(ds.astype(q.dtype), q, trans_a=True)
        return dk, dv

    zeros = jnp.zeros(dk_ref.shape, jnp.float32)
    lo, hi = q_block_range(kj * bk, bk, bq, q_ref.shape[0] // bq, cfg)
    dk, dv = lax.fori_loop(lo, hi, body, (zeros, zeros))
    dk = dk.astype(dk_ref.dtype)  # q was scaled already: dK = dS^T (q / sqrt(d))
    dv = (dv * cfg.keep_scale).astype(dv_ref.dtype)
    dk_ref[...], dv_ref[...] = dk, dv
    bias_grad(db_refs, (dk, dv))


def _dq_kernel(*refs, cfg):
    """One (query block, example, head). [q, k, v biases: <f32>[d] when cfg.bias]; q_ref,
    do_ref: [bq, d]; k_ref, v_ref: [kv_pad, d]; qseg_ref: [bq]; kseg_ref: [kv_pad]; lse_ref,
    delta_ref: <f32>[bq]. Writes dq [and its column sums, <f32>[d]]."""
    params_ref, (b_q, b_k, b_v), refs = split_refs(refs, cfg)
    (q_ref, k_ref, v_ref, qseg_ref, kseg_ref, do_ref, lse_ref, delta_ref, dq_ref,
     *db_refs) = refs
    bq, bk = cfg.bwd_blocks
    qi, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q, do, q_seg = scaled_q(biased(q_ref[...], b_q), cfg), do_ref[...], qseg_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    row_hash = row_hashes(params_ref, b, h, qi * bq, bq, cfg) if cfg.threshold else None

    def body(j, dq):
        ks = pl.ds(j * bk, bk)
        k = biased(k_ref[ks, :], b_k)
        s, allowed = scores(q, k, q_seg, kseg_ref[ks], qi * bq, j * bk, cfg)
        p = probs(s, lse, qi * bq, cfg)
        dp = dot(do, biased(v_ref[ks, :], b_v), trans_b=True)
        if cfg.threshold:
            keep = keep_tile(row_hash, j * bk, bk, cfg)
            dp = jnp.where(keep, dp * cfg.keep_scale, 0.0)
        ds = jnp.where(allowed, p * (dp - delta[:, None]), 0.0)
        return dq + dot(ds.astype(k.dtype), k)

    lo, hi = kv_block_range(qi * bq, bq, bk, k_ref.shape[0] // bk, cfg)
    dq = lax.fori_loop(lo, hi, body, jnp.zeros(dq_ref.shape, jnp.float32))
    dq = (dq / cfg.q_scale).astype(dq_ref.dtype)  # chain rule through q / sqrt(d)
    dq_ref[...] = dq
    bias_grad(db_refs, (dq,))


def _fused_bwd_kernel(*refs, cfg):
    """One (example, head) whose keys are one backward key block: dQ, dK and dV together.
    [q, k, v biases: <f32>[d] when cfg.bias]; q_ref, do_ref, o_ref: [q_pad, d]; k_ref,
    v_ref: [kv_pad, d]; qseg_ref: [q_pad]; kseg_ref: [kv_pad]; lse_ref: <f32>[q_pad]. Walks
    the query blocks once: each block's dQ is complete (no other key block adds to it) and is
    written at once, while dK and dV accumulate over the blocks in float32. D_i =
    rowsum(dO_i * O_i) is computed here from the block's rows (each read once), instead of
    by a separate pass over O and dO. With biases it also writes the column sums of dQ, dK
    and dV (<f32>[d] each).

    Every query block is visited, with a window too: rows added to fill the last block have
    a zero cotangent (dO = 0, so D = 0 and dS = 0) and add exactly zero to dK and dV, and
    their dQ rows, sliced off later, are zero."""
    params_ref, (b_q, b_k, b_v), refs = split_refs(refs, cfg)
    q_ref, k_ref, v_ref, qseg_ref, kseg_ref, do_ref, o_ref, lse_ref, *refs = refs
    if cfg.packed:  # one [length, 3, d] block: dQ, dK, dV at 0, 1, 2 of its middle axis
        (dqkv_ref, *db_refs), out_dtype = refs, refs[0].dtype

        def store(j, rows, x):
            dqkv_ref[rows, j, :] = x
    else:
        dq_ref, dk_ref, dv_ref, *db_refs = refs
        out_dtype = dq_ref.dtype

        def store(j, rows, x):
            (dq_ref, dk_ref, dv_ref)[j][rows, :] = x
    bq, _ = cfg.bwd_blocks
    d = q_ref.shape[1]
    b, h = pl.program_id(0), pl.program_id(1)
    k, v, k_seg = biased(k_ref[...], b_k), biased(v_ref[...], b_v), kseg_ref[...]

    def body(i, carry):
        dk, dv, dq_sum = carry
        qs = pl.ds(i * bq, bq)
        q, do = scaled_q(biased(q_ref[qs, :], b_q), cfg), do_ref[qs, :]
        delta = jnp.sum(o_ref[qs, :].astype(jnp.float32) * do.astype(jnp.float32), axis=1)
        s, allowed = scores(q, k, qseg_ref[qs], k_seg, i * bq, 0, cfg)
        p = probs(s, lse_ref[qs], i * bq, cfg)
        pv = p.astype(v.dtype)
        dp = dot(do, v, trans_b=True)
        if cfg.threshold:
            keep = keep_tile(row_hashes(params_ref, b, h, i * bq, bq, cfg), 0, k.shape[0], cfg)
            pv = jnp.where(keep, pv, 0)
            dp = jnp.where(keep, dp * cfg.keep_scale, 0.0)
        dv = dv + dot(pv, do, trans_a=True)
        ds = jnp.where(allowed, p * (dp - delta[:, None]), 0.0).astype(q.dtype)
        dk = dk + dot(ds, q, trans_a=True)
        dq = (dot(ds, k) / cfg.q_scale).astype(out_dtype)
        store(0, qs, dq)
        if cfg.bias:
            dq_sum = dq_sum + jnp.sum(dq.astype(jnp.float32), axis=0)
        return dk, dv, dq_sum

    zeros = jnp.zeros(k_ref.shape, jnp.float32)
    dk, dv, dq_sum = lax.fori_loop(0, q_ref.shape[0] // bq, body,
                                   (zeros, zeros, jnp.zeros((d,), jnp.float32)))
    dk = dk.astype(out_dtype)
    dv = (dv * cfg.keep_scale).astype(out_dtype)
    every = pl.ds(0, k_ref.shape[0])
    store(1, every, dk)
    store(2, every, dv)
    if cfg.bias:  # one [3, d] block: the q, k, v bias gradients' partial sums
        db_ref, = db_refs
        db_ref[0, :] = dq_sum
        db_ref[1, :] = jnp.sum(dk.astype(jnp.float32), axis=0)
        db_ref[2, :] = jnp.sum(dv.astype(jnp.float32), axis=0)


def _fused_backward(cfg, q, k, v, biases, q_seg, kv_seg, params, o, lse, do):
    """dq, dk, dv in one kernel, one program per (example, head): keys fit one block. With
    biases also their <f32>[batch, 3, heads, d] partial gradients (q, k, v)."""
    batch, q_pad, heads, d = q.shape
    kv_pad = k.shape[1]
    full = lambda n: pl.BlockSpec((None, n, None, d), lambda b, h: (b, 0, h, 0))  # noqa: E731
    seg = lambda n: pl.BlockSpec((None, n), lambda b, h: (b, 0))  # noqa: E731
    bias_specs, bias_arrays = bias_args(biases, lambda b, h: (h, 0), d)
    with_bias = biases is not None
    db_specs = [pl.BlockSpec((None, 3, None, d), lambda b, h: (b, 0, h, 0))] * with_bias
    db_shapes = [jax.ShapeDtypeStruct((batch, 3, heads, d), jnp.float32)] * with_bias
    if cfg.packed:  # one output, [batch, length, 3, heads, d]; its slices are dQ, dK, dV
        grad_specs = [pl.BlockSpec((None, q_pad, 3, None, d), lambda b, h: (b, 0, 0, h, 0))]
        grad_shapes = [jax.ShapeDtypeStruct((batch, q_pad, 3, heads, d), q.dtype)]
    else:
        grad_specs = [full(q_pad), full(kv_pad), full(kv_pad)]
        grad_shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)]
    dqkv, *partials = pl.pallas_call(
        functools.partial(_fused_bwd_kernel, cfg=cfg),
        grid=(batch, heads),
        in_specs=[pl.BlockSpec((4,), lambda b, h: (0,)), *bias_specs, full(q_pad),
                  full(kv_pad), full(kv_pad), seg(q_pad), seg(kv_pad), full(q_pad),
                  full(q_pad), pl.BlockSpec((None, None, q_pad), lambda b, h: (b, h, 0))],
        out_specs=[*grad_specs, *db_specs],
        out_shape=[*grad_shapes, *db_shapes],
        compiler_params=compiler_params(cfg, backward=True), interpret=cfg.interpret,
        name="flash_attention_bwd_fused",
    )(params, *bias_arrays, q, k, v, q_seg, kv_seg, do, o, lse)
    if cfg.packed:
        return (dqkv[:, :, 0], dqkv[:, :, 1], dqkv[:, :, 2], *partials)
    return (dqkv, *partials)


def backward(cfg, res, do):
    """o, do: the unpadded [batch, q_len, heads, head_dim] output and its cotangent."""
    q, k, v, biases, q_seg, kv_seg, params, o, lse = res
    batch, q_pad, heads, d = q.shape
    kv_pad = k.shape[1]
    bq, bk = cfg.bwd_blocks
    do = do.astype(q.dtype)

    def pad(x):  # padded rows and columns of dO are zero: they add nothing to dQ, dK, dV
        if x.shape == q.shape:
            return x
        return jnp.pad(x, ((0, 0), (0, q_pad - x.shape[1]), (0, 0), (0, d - x.shape[3])))

    def bias_grads(partials):  # [..., heads, d] partial sums (q, k, v) -> [3, heads, d]
        if biases is None:
            return None
        return jnp.stack([x.reshape(-1, heads, d).sum(0) for x in partials])

    if kv_pad == bk:
        dq, dk, dv, *partials = _fused_backward(cfg, q, k, v, biases, q_seg, kv_seg, params,
                                                pad(o), lse, pad(do))
        db = None if biases is None else jnp.sum(partials[0], axis=0)  # [3, heads, d]
        return dq, dk, dv, db, None, None, None
    # D_i = rowsum(dO * O) (FlashAttention-2); valid with dropout (see the module doc); 0 on
    # padded rows. One XLA pass here: each key block of the dK/dV kernel walks all query
    # rows, so computing it inside would read O once per key block.
    delta = jnp.einsum("bqhd,bqhd->bhq", o.astype(jnp.float32), do.astype(jnp.float32))
    delta = jnp.pad(delta, ((0, 0), (0, 0), (0, q_pad - delta.shape[2])))
    do = pad(do)
    full = lambda n: pl.BlockSpec((None, n, None, d), lambda x, b, h: (b, 0, h, 0))  # noqa: E731
    part = lambda n: pl.BlockSpec((None, n, None, d), lambda x, b, h: (b, x, h, 0))  # noqa: E731
    seg_full = lambda n: pl.BlockSpec((None, n), lambda x, b, h: (b, 0))  # noqa: E731
    seg_part = lambda n: pl.BlockSpec((None, n), lambda x, b, h: (b, x))  # noqa: E731
    row_full = pl.BlockSpec((None, None, q_pad), lambda x, b, h: (b, h, 0))
    row_part = pl.BlockSpec((None, None, bq), lambda x, b, h: (b, h, x))
    params_spec = pl.BlockSpec((4,), lambda x, b, h: (0,))
    bias_specs, bias_arrays = bias_args(biases, lambda x, b, h: (h, 0), d)
    args = (params, *bias_arrays, q, k, v, q_seg, kv_seg, do, lse, delta)
    db_spec = pl.BlockSpec((None, None, None, d), lambda x, b, h: (x, b, h, 0))
    db_shape = lambda n: jax.ShapeDtypeStruct((n, batch, heads, d), jnp.float32)  # noqa: E731
    with_bias = biases is not None
    common = dict(compiler_params=compiler_params(cfg, backward=True),
                  interpret=cfg.interpret)

    dk, dv, *kv_partials = pl.pallas_call(
        functools.partial(_dkdv_kernel, cfg=cfg),
        grid=(kv_pad // bk, batch, heads),
        in_specs=[params_spec, *bias_specs, full(q_pad), part(bk), part(bk), seg_full(q_pad),
                  seg_part(bk), full(q_pad), row_full, row_full],
        out_specs=[part(bk), part(bk), *[db_spec] * (2 * with_bias)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype),
                   *[db_shape(kv_pad // bk)] * (2 * with_bias)],
        name="flash_attention_bwd_dkdv", **common,
    )(*args)
    dq, *q_partials = pl.pallas_call(
        functools.partial(_dq_kernel, cfg=cfg),
        grid=(q_pad // bq, batch, heads),
        in_specs=[params_spec, *bias_specs, part(bq), full(kv_pad), full(kv_pad), seg_part(bq),
                  seg_full(kv_pad), part(bq), row_part, row_part],
        out_specs=[part(bq), *[db_spec] * with_bias],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), *[db_shape(q_pad // bq)] * with_bias],
        name="flash_attention_bwd_dq", **common,
    )(*args)
    return dq, dk, dv, bias_grads(q_partials + kv_partials), None, None, None
