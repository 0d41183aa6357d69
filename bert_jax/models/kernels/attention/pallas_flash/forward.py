"""The Pallas flash-attention forward kernel: one program per (query block, example,
head) walks the key blocks (all of them, or those of the sliding window's band) with an
online softmax in float32, dropout applied to the probabilities from the hash mask, and
writes the output and the float32 log-sum-exp of every query row (what the backward pass
recomputes the probabilities from)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from bert_jax.models.kernels.attention.pallas_flash.masks import (
    biased, dot, keep_tile, row_hashes, scaled_q, scores, split_refs)
from bert_jax.models.kernels.attention.pallas_flash.tiling import (
    bias_args, compiler_params, kv_block_range)


def _fwd_kernel(*refs, cfg):
    """One (query block, example, head). [q_bias, k_bias, v_bias: <f32>[d] when cfg.bias];
    q_ref: [bq, d]; k_ref, v_ref: [kv_pad, d]; qseg_ref: [bq]; kseg_ref: [kv_pad]. Writes
    o_ref: [bq, d], lse_ref: <f32>[bq]."""
    params_ref, (b_q, b_k, b_v), refs = split_refs(refs, cfg)
    q_ref, k_ref, v_ref, qseg_ref, kseg_ref, o_ref, lse_ref = refs
    bq, bk = cfg.fwd_blocks
    qi, b, h = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q = scaled_q(biased(q_ref[...], b_q), cfg)
    q_seg = qseg_ref[...]
    row_hash = row_hashes(params_ref, b, h, qi * bq, bq, cfg) if cfg.threshold else None

    def body(j, carry):
        acc, m, l = carry
        ks = pl.ds(j * bk, bk)
        v = biased(v_ref[ks, :], b_v)
        s, _ = scores(q, biased(k_ref[ks, :], b_k), q_seg, kseg_ref[ks], qi * bq, j * bk,
                      cfg)
        # Online softmax in float32 (m: running max, l: running sum of exp(s - m)). Globally
        # the first key block holds key 0 (a real key, score >= MASKED), so m is finite from
        # then on and exp(-inf - m) = 0 rescales the empty initial state. With a window a
        # row's band may start in a later block than the first one visited: until then its
        # m stays -inf and is taken as 0, so that exp(-inf - 0) = 0 instead of NaN.
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if cfg.window else m_new
        alpha = jnp.exp(m - m_use)
        p = jnp.exp(s - m_use[:, None])
        l = alpha * l + jnp.sum(p, axis=1)
        # Probabilities go to the compute dtype before dropout and the P.V product, as in the
        # reference; 1/l and the dropout scale are applied to the float32 accumulator at the
        # end (the same product, up to rounding of the compute dtype).
        pv = p.astype(v.dtype)
        if cfg.threshold:
            pv = jnp.where(keep_tile(row_hash, j * bk, bk, cfg), pv, 0)
        acc = acc * alpha[:, None] + dot(pv, v)
        return acc, m_new, l

    init = (jnp.zeros(o_ref.shape, jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32),
            jnp.zeros((bq,), jnp.float32))
    lo, hi = kv_block_range(qi * bq, bq, bk, k_ref.shape[0] // bk, cfg)
    acc, m, l = lax.fori_loop(lo, hi, body, init)
    o_ref[...] = (acc * (cfg.keep_scale / l)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l)


def forward(q, k, v, biases, q_seg, kv_seg, params, cfg):
    """Padded inputs -> (o: [batch, q_pad, heads, d_pad], lse: <f32>[batch, heads, q_pad])."""
    batch, q_pad, heads, d = q.shape
    kv_pad = k.shape[1]
    bq, _ = cfg.fwd_blocks
    kv_spec = pl.BlockSpec((None, kv_pad, None, d), lambda i, b, h: (b, 0, h, 0))
    q_spec = pl.BlockSpec((None, bq, None, d), lambda i, b, h: (b, i, h, 0))
    bias_specs, bias_arrays = bias_args(biases, lambda i, b, h: (h, 0), d)
    return pl.pallas_call(
        functools.partial(_fwd_kernel, cfg=cfg),
        grid=(q_pad // bq, batch, heads),
        in_specs=[pl.BlockSpec((4,), lambda i, b, h: (0,)), *bias_specs, q_spec, kv_spec,
                  kv_spec, pl.BlockSpec((None, bq), lambda i, b, h: (b, i)),
                  pl.BlockSpec((None, kv_pad), lambda i, b, h: (b, 0))],
        out_specs=[q_spec, pl.BlockSpec((None, None, bq), lambda i, b, h: (b, h, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, q_pad), jnp.float32)],
        compiler_params=compiler_params(cfg), interpret=cfg.interpret,
        name="flash_attention_fwd",
    )(params, *bias_arrays, q, k, v, q_seg, kv_seg)
