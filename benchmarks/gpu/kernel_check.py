"""The kernel check child, run before any timing: the fused attention paths against the XLA
reference on this device. The Pallas kernel with dropout (its hash masks must be the
reference's) and without; on a GPU, cuDNN without dropout. Outputs and q / k / v gradients,
with padding, float32 and bfloat16; each as max |diff| / max |reference| over the real
query rows. Then the other Pallas kernels against the expressions they replace: the
residual + LayerNorm (models/kernels/residual_norm.py, with and without dropout) and the
FFN's bias + GELU backward pass (models/kernels/gelu.py), outputs and every input's
gradient. On a GPU, last, cuDNN with its own dropout (benchmarks/attention_masks.py), as
`model.attention=cudnn` trains with it: padded and packed rows (both packed layouts),
output and gradients against the XLA path given the mask read back, and the masks'
statistics (a failed one is the row's error); --skip_mask_check leaves these out when
attention_masks.py ran just before. On CPU (--smoke) the same rows check a stand-in kernel
(the XLA path with the hash dropout), so that their code has run before a GPU session."""

from __future__ import annotations

from .common import exc_line


def run(spec: dict, out: dict) -> dict:
    """Fills out["checks"]: [{path, dtype, dropout, out_err, grad_err}] (or error instead of
    the figures) and out["shape"]: [batch, length, heads, head_dim]."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models.kernels import backend

    plat = backend.platform_name(jax.devices()[0].platform)
    b, n, h, d = (2, 32, 2, 16) if spec.get("smoke") else (4, 128, 16, 64)
    lengths = jnp.array([n, n - 37 % n, 5, 0][:b])
    mask = jnp.arange(n)[None, :] < lengths[:, None]
    checks = []
    paths = [("pallas", 0.1), ("pallas", 0.0)] + ([("cudnn", 0.0)] if plat == "gpu" else [])
    for dtype in ("float32", "bfloat16"):
        q, k, v = (jax.random.normal(r, (b, n, h, d), jnp.float32).astype(dtype)
                   for r in jax.random.split(jax.random.PRNGKey(0), 3))
        cot = jax.random.normal(jax.random.PRNGKey(3), (b, n, h, d), jnp.float32).astype(dtype)
        for path, rate in paths:
            if path == "cudnn" and dtype == "float32":
                continue
            row = dict(path=path, dtype=dtype, dropout=rate)
            try:
                row.update(compare(path, rate, (q, k, v), cot, mask, lengths))
            except Exception as e:  # noqa: BLE001 - reported, the suite goes on
                row["error"] = exc_line(e)
            checks.append(row)
        for path, rate in (("residual_norm", 0.1), ("residual_norm", 0.0), ("gelu", 0.0)):
            row = dict(path=path, dtype=dtype, dropout=rate)
            try:
                row.update(compare_layer_kernel(path, rate, dtype, small=spec.get("smoke")))
            except Exception as e:  # noqa: BLE001 - reported, the suite goes on
                row["error"] = exc_line(e)
            checks.append(row)
    if plat == "gpu" and not spec.get("skip_masks"):  # cuDNN's own dropout, read back
        import attention_masks  # benchmarks/, on sys.path as gpu_suite.py runs this
        checks += attention_masks.kernel_check_rows(small=bool(spec.get("smoke")))
    elif spec.get("smoke") and not spec.get("skip_masks"):  # CPU: the same rows' code
        import attention_masks
        checks += attention_masks.kernel_check_rows(small=True, standin=True)
    out["checks"] = checks
    out["shape"] = [b, n, h, d]
    return out


def compare(path: str, rate: float, qkv: tuple, cot, mask, lengths) -> dict:
    """{out_err, grad_err} of the fused `path` against the XLA attention."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models.kernels.attention import xla as xla_attention

    drop_key = jax.random.PRNGKey(11)
    fused = fused_attention(path, rate, mask, drop_key)

    def reference(q, k, v):
        return xla_attention.attention(q, k, v, mask[:, None, :],
                                       dropout=hash_dropout(rate, drop_key))

    def with_grads(fn):
        o, vjp = jax.vjp(fn, *qkv)
        return (o,) + vjp(cot)

    rows = mask[:, :, None, None] & (lengths[:, None, None, None] > 0)
    want = jax.jit(lambda: with_grads(reference))()
    got = jax.jit(lambda: with_grads(fused))()
    errs = []
    for g, w in zip(got, want):
        g = jnp.where(rows, g.astype(jnp.float32), 0)  # real query rows
        w = jnp.where(rows, w.astype(jnp.float32), 0)
        errs.append(float(jnp.max(jnp.abs(g - w)) / jnp.maximum(jnp.max(jnp.abs(w)), 1e-30)))
    return dict(out_err=errs[0], grad_err=max(errs[1:]))


def hash_dropout(rate: float, drop_key):
    """The model's hash Dropout as the XLA attention's `dropout` callable (None at rate 0)."""
    from bert_jax.models.dropout import Dropout

    if not rate:
        return None
    return lambda p: Dropout(rate, impl="hash").apply(
        {}, p, deterministic=False, rngs={"dropout": drop_key})


def fused_attention(path: str, rate: float, mask, drop_key):
    """fn(q, k, v) of the fused `path`: cuDNN through attention_ops.fused, or the Pallas
    kernel with the seeds the model's Dropout derives from `drop_key` inside flax's apply."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models.kernels import attention as attention_ops
    from bert_jax.models.kernels.attention import pallas_flash
    from bert_jax.models.dropout import Dropout

    def fused(q, k, v):
        if path == "cudnn":
            return attention_ops.fused("cudnn", q, k, v, mask)
        kv_seg = mask.astype(jnp.int32)
        seeds = None
        if rate:
            key = Dropout(rate, impl="hash").apply({}, rngs={"dropout": drop_key},
                                                   method="make_key")
            seeds = jax.random.bits(key, (2,), jnp.uint32)
        return pallas_flash.flash_attention(q, k, v, jnp.ones_like(kv_seg), kv_seg,
                                            dropout_rate=rate, seeds=seeds)
    return fused


def compare_layer_kernel(path: str, rate: float, dtype: str, small: bool = False) -> dict:
    """{out_err, grad_err} of norm_ops.residual_norm ("residual_norm") or gelu_ops.bias_gelu
    ("gelu") against the XLA expression each replaces, on BERT-Base-like rows (or a few
    small ones), as max |diff| / max |reference| over the output and over each gradient."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models.kernels import gelu as gelu_ops, residual_norm as norm_ops
    from bert_jax.models.dropout import draw_seeds, hash_dropout
    from bert_jax.models.layers import LayerNorm

    rows, width = (64, 96) if small else (4096, 768 if path == "residual_norm" else 3072)
    r = jax.random.split(jax.random.PRNGKey(5), 7)
    p = jax.random.normal(r[0], (rows, width)).astype(dtype)
    residual = (2 * jax.random.normal(r[1], (rows, width))).astype(dtype)
    bias, scale, shift = (s * jax.random.normal(k, (width,)) + o
                          for k, s, o in zip(r[2:5], (0.5, 0.2, 0.3), (0.0, 1.0, 0.0)))
    cot = jax.random.normal(r[5], (rows, width)).astype(dtype)
    seeds = draw_seeds(r[6]) if rate else None
    if path == "gelu":
        args = (p, bias)
        kernel = gelu_ops.bias_gelu  # (interpret mode on CPU: the suite's smoke run)
        reference = gelu_ops.reference
    else:
        args = (p, bias, residual, scale, shift)

        def kernel(*a):
            return norm_ops.residual_norm(*a, seeds, rate=rate, eps=1e-12)

        def reference(p, b, res, s, t):
            x = (p.astype(jnp.float32) + b).astype(p.dtype)
            x = res + (hash_dropout(x, seeds, rate) if seeds is not None else x)
            return LayerNorm(epsilon=1e-12, dtype=p.dtype, param_dtype=jnp.float32).apply(
                {"params": {"scale": s, "bias": t}}, x)

    def with_grads(fn):
        o, vjp = jax.vjp(fn, *args)
        return (o,) + vjp(cot)

    want = jax.jit(lambda: with_grads(reference))()
    got = jax.jit(lambda: with_grads(kernel))()
    errs = [float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)))
                  / max(float(jnp.max(jnp.abs(w.astype(jnp.float32)))), 1e-30))
            for g, w in zip(got, want)]
    return dict(out_err=errs[0], grad_err=max(errs[1:]))
