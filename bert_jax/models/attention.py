"""Multi-head self-attention: the projections, then one of the attention paths of
`models/kernels/attention/` (chosen by `model.attention` and the platform)."""

from __future__ import annotations

import functools
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from bert_jax.models import fp8 as fp8_lib
from bert_jax.models.config import BertConfig
from bert_jax.models.dropout import Dropout
from bert_jax.models.kernels import attention as attention_kernels
from bert_jax.models.kernels.attention import xla as xla_attention
from bert_jax.models.kernels.backend import platform
from bert_jax.models.layers import DenseGeneral, add_bias, weight_init, zeros_init


class BertSelfAttention(nn.Module):
    """Projections are [embed] -> [heads, kv] DenseGenerals so that tensor parallelism can
    shard heads without reshapes; the Hugging Face / TF layout is a reshape of these.

    Names for the remat policies (models/remat.py): "query", "key", "value" (projections,
    compute dtype) and "context" (the attention output before the output projection). On
    a path that adds the Q, K, V biases itself (attention_kernels.takes_biases: the Pallas
    kernel on GPU) the projections are handed over, and named, before their biases.

    Rotary positions (`position_embedding="rotary"`) rotate Q and K before the attention
    path, with the layer's base (`rope_theta`, or `local_rope_theta` in a local layer). A
    local layer (`BertConfig.layer_window`) attends keys within `local_attention // 2` of
    the query: a band in the XLA path's mask; `window=` to `attention_kernels.resolve` and
    `attention_kernels.fused` for the other paths (global layers call them without it)."""

    config: BertConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, mask, positions=None, local=False, product_only=False, layer=None):
        """x: <dtype>[batch, length, embed]; mask: <bool>[batch, length] (True = real token),
        or for packed rows <int32>[batch, length] sequence ids (a token attends the tokens
        with its id; 0 = padding). positions: <int>[batch or 1, length], the rotary
        positions (None: 0 .. length - 1). local: whether this is a sliding-window layer,
        a Python bool, or a traced <bool>[] under nn.scan (the layers then share one body).
        product_only: return the output projection's (product before its bias, float32
        bias) instead of its output (models/kernels/residual_norm.py adds the bias in its kernel).
        layer: the layer's place in the stack, an int or under nn.scan a traced <int32>[]:
        cuDNN's dropout takes a compile-time seed per layer (cudnn_seeds)."""
        c = self.config
        drop = Dropout(rate=c.attention_probs_dropout_prob, impl=c.dropout_rng)
        training = not self.deterministic and c.attention_probs_dropout_prob > 0
        packed = jnp.issubdtype(mask.dtype, jnp.integer)
        window = c.local_attention // 2 if c.local_attention and local is not False else 0
        dropout_key = None

        def impl_for(w):
            # Init only needs shapes, and is traced without the step's mesh (so without the
            # platform it compiles for): every path has the same parameters.
            if self.is_initializing():
                return "xla"
            kw = {"window": w} if w else {}
            return attention_kernels.resolve(c.attention, platform(), c, training,
                                             packed=packed, **kw)

        # The paths this call may take: (impl,) or, for a traced local flag (nn.scan), the
        # local and the global layers' paths.
        one_path = not window or local is True
        paths = (impl_for(window),) if one_path else (impl_for(window), impl_for(0))
        # A kernel that adds the Q, K, V biases itself is handed the projections before
        # them (what the remat policies then keep as "query", "key", "value"), so that the
        # biased copies are never written. Only where that is the same sum and rounding as
        # the add here (float32 bias, no rotation between the add and the kernel).
        defer = (c.use_bias and c.position_embedding != "rotary"
                 and all(attention_kernels.takes_biases(p) for p in paths)
                 and jnp.promote_types(c.compute_dtype, c.storage_dtype) == jnp.float32)
        # model.fp8: each projection's product through its own FP8 op (models/fp8.py).
        fp8_op = fp8_lib.op_class(c)
        proj = lambda name, dtype=c.compute_dtype, **kw: DenseGeneral(  # noqa: E731
            features=(c.num_attention_heads, c.head_dim), axis=-1, use_bias=c.use_bias,
            dtype=dtype, param_dtype=c.storage_dtype,
            kernel_init=weight_init(c, ("embed", "heads", "kv")),
            bias_init=zeros_init(("heads", "kv")), name=name,
            **{"dot_general_cls": fp8_op, **kw})
        biases = None
        # The Pallas kernel writes dQ, dK, dV as one array: then the projections' input
        # gradient is one product against the three kernels stacked (qkv_products), in the
        # compute dtype: not under model.fp8, whose three products are FP8 ops.
        pack_grads = (defer and not c.fused_qkv and not c.fp8 and not self.is_initializing()
                      and all(attention_kernels.packs_grads(p, x.shape[1], c.pallas_options,
                                                            window) for p in paths))
        if c.fused_qkv:
            q, k, v, biases = _fused_projection(proj, x, c.compute_dtype, defer)
        elif pack_grads:
            q, k, v, biases = _packed_projection(proj, x, c.compute_dtype)
        elif defer:
            (q, k, v), biases = zip(*(_unbiased_projection(proj, name, x, fp8_op)
                                      for name in ("query", "key", "value")))
        else:  # [batch, length, heads, kv] each
            q, k, v = proj("query")(x), proj("key")(x), proj("value")(x)
        if biases is not None:
            biases = tuple(b.astype(jnp.float32) for b in biases)
        if c.position_embedding == "rotary":
            if positions is None:
                positions = jnp.arange(x.shape[1], dtype=jnp.int32)[None, :]
            theta = c.rope_theta
            if c.local_attention and local is not False:
                theta = jnp.where(local, jnp.float32(c.local_rope_theta),
                                  jnp.float32(c.rope_theta))
            q, k = rotary(q, positions, theta), rotary(k, positions, theta)
        q = checkpoint_name(q, "query")
        k = checkpoint_name(k, "key")
        v = checkpoint_name(v, "value")

        def attend(impl, w, band_on=True):
            if impl == "xla":
                # [batch, 1, k] key mask, or [batch, q, k] block-diagonal for packed rows.
                kv_mask = mask[:, :, None] == mask[:, None, :] if packed else mask[:, None, :]
                if w:
                    kv_mask = kv_mask & band_mask(x.shape[1], w, band_on)
                return xla_attention.attention(
                    q, k, v, kv_mask, dropout=lambda p: drop(p, deterministic=self.deterministic))
            kw = {"window": w} if w else {}  # global layers call it exactly as before

            def call(seed=0):
                return attention_kernels.fused(
                    impl, q, k, v, mask, dropout_rate=c.attention_probs_dropout_prob,
                    dropout_key=dropout_key, pallas_options=c.pallas_options,
                    biases=biases, packed_grads=pack_grads, cudnn_seed=seed, **kw)

            if impl != "cudnn" or dropout_key is None:
                return call()
            seeds = cudnn_seeds(self.path, c.num_hidden_layers)
            if layer is None or isinstance(layer, int):
                return call(seeds[layer or 0])
            # A traced index (nn.scan): one branch per layer, each with its own seed, so
            # that each compiled cuDNN call runs once a step (its cost: cudnn.py).
            return jax.lax.switch(layer, [functools.partial(call, s) for s in seeds])

        if one_path:
            impl, = paths
            if impl != "xla" and training:
                dropout_key = drop.make_key()
            ctx = attend(impl, window)
        else:  # a traced flag (nn.scan): one body for local and global layers
            local_impl, global_impl = paths
            if local_impl == global_impl == "xla":  # the band lifted on global layers
                ctx = attend("xla", window, local)
            elif "xla" in (local_impl, global_impl):
                raise attention_kernels.AttentionConfigError(
                    f"scan_layers with local layers on {local_impl} and global ones on "
                    f"{global_impl}: set model.attention to one path for both, or "
                    f"scan_layers=False")
            else:  # the kernel's window is static: a branch for each kind of layer
                if training:
                    dropout_key = drop.make_key()
                ctx = jax.lax.cond(local, lambda: attend(local_impl, window),
                                   lambda: attend(global_impl, 0))
        # A kernel that names its output itself keeps it for its own backward pass: a second
        # name would keep a second copy.
        if not all(attention_kernels.names_context(p) for p in paths):
            ctx = checkpoint_name(ctx, "context")
        ctx = nn.with_logical_constraint(ctx, ("batch", "length", "heads", "kv"))

        out = lambda name, **kw: DenseGeneral(  # noqa: E731
            features=c.hidden_size, axis=(-2, -1),
            dtype=c.compute_dtype, param_dtype=c.storage_dtype,
            kernel_init=weight_init(c, ("heads", "kv", "embed"), "out"), use_bias=c.use_bias,
            bias_init=zeros_init(("embed",)), name=name,
            **{"dot_general_cls": fp8_op, **kw})
        if product_only:
            return _unbiased_projection(out, "output", ctx, fp8_op)
        return out("output")(ctx)


def cudnn_seeds(path, layers: int) -> list[int]:
    """cuDNN's dropout seeds (compile-time ints: kernels/attention/cudnn.py) of the module at
    `path` as layer 0 .. layers - 1 of a stack: hashes of its names and the layer, so that
    every layer draws its own masks, scanned or not."""
    name = "/".join(map(str, path))
    return [zlib.crc32(f"{name}#{i}".encode()) & 0x7FFFFFFF for i in range(layers)]


def band_mask(length: int, window: int, local=True):
    """<bool>[1, length, length]: key j is within `window` of query i (|i - j| <= window).
    A traced `local` flag that is False lifts the band (every key allowed)."""
    i = jnp.arange(length, dtype=jnp.int32)
    band = jnp.abs(i[:, None] - i[None, :]) <= window
    if local is not True:
        band = band | ~jnp.asarray(local, bool)
    return band[None]


def rotary(x, positions, theta):
    """Rotary position embedding of x: <dtype>[batch, length, heads, kv] at positions
    <int>[batch or 1, length] with base `theta` (a float, or a traced float32 scalar).
    The rotate-half convention (the first and second halves of kv are the pairs), in
    float32, cast back to x's dtype: transformers' ModernBERT / Llama form."""
    d = x.shape[-1]
    exponent = jnp.arange(0, d, 2, dtype=jnp.float32) / d
    inv_freq = 1.0 / (jnp.asarray(theta, jnp.float32) ** exponent)
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, l, d/2]
    angles = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]  # [b, l, 1, d]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    xf = x.astype(jnp.float32)
    half = d // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


def _unbiased_projection(proj, name, x, fp8_op=None):
    """(x W, bias) of the DenseGeneral `name`: its product before the bias, exactly the one
    it computes (its own dot_general, recorded: jax.lax.dot_general, or an instance of
    `fp8_op`, the FP8 op class, made inside the module as it makes its own, so that its
    scaling state has the same name), and its bias parameter (as it promotes it). The
    module's biased output is left unused (the compiled step drops it); the parameters
    are the module's, unchanged."""
    seen = {}

    def recorded():
        op = jax.lax.dot_general if fp8_op is None else fp8_op()

        def dot_general(lhs, rhs, dims, precision=None):
            seen["product"] = op(lhs, rhs, dims, precision=precision)
            return seen["product"]
        return dot_general

    def promote(inputs, kernel, bias, dtype=None, inexact=True):
        seen["bias"] = bias
        return DenseGeneral.promote_dtype(inputs, kernel, bias, dtype=dtype, inexact=inexact)

    proj(name, dot_general_cls=recorded, promote_dtype=promote)(x)
    return seen["product"], seen["bias"]


def _kernels_and_biases(proj, x, dtype):
    """The Q, K, V DenseGenerals' kernels (promoted as each promotes them, then cast to the
    compute `dtype`) and their biases (float32), unchanged parameters: each module is
    applied to a single zero row with a dot_general that hands back its kernel, so its
    output is its bias."""
    kernels, biases = [], []
    for name in ("query", "key", "value"):
        grabbed = {}

        def grab(lhs, kernel, dims, precision=None, grabbed=grabbed):
            grabbed["kernel"] = kernel
            return jnp.zeros(lhs.shape[:1] + kernel.shape[1:], lhs.dtype)

        # Promoted as DenseGeneral promotes a bias: to at least its own dtype.
        layer = proj(name, dtype=None, dot_general=grab, dot_general_cls=None)
        biases.append(layer(jnp.zeros((1, x.shape[-1]), dtype))[0])
        kernels.append(grabbed["kernel"].astype(dtype))
    return kernels, biases


@jax.custom_vjp
def qkv_products(x, wq, wk, wv):
    """(x Wq, x Wk, x Wv), each as DenseGeneral computes its product (three GEMMs, outputs
    apart), whose input gradient is one product: dX = [dQ dK dV] [Wq Wk Wv]^T over the
    three stacked (and the kernels' gradients one product too). The stack of dQ, dK, dV is
    the array the Pallas kernel wrote them into (packed_grads), so XLA reads it as it is;
    three products would write three [tokens, embed] arrays for XLA to add."""
    return tuple(jax.lax.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))
                 for w in (wq, wk, wv))


def _qkv_products_fwd(x, wq, wk, wv):
    return qkv_products(x, wq, wk, wv), (x, wq, wk, wv)


def _qkv_products_bwd(res, grads):
    x, *ws = res
    g = jnp.stack(grads, axis=2)  # [batch, length, 3, heads, kv]
    w = jnp.stack(ws, axis=1)     # [embed, 3, heads, kv]
    dx = jnp.einsum("blthd,ethd->ble", g, w).astype(x.dtype)
    dw = jnp.einsum("ble,blthd->ethd", x, g)
    return (dx, *(dw[:, i].astype(ws[i].dtype) for i in range(3)))


qkv_products.defvjp(_qkv_products_fwd, _qkv_products_bwd)


def _packed_projection(proj, x, dtype):
    """Q, K, V before their biases (DenseGeneral's products, as _unbiased_projection takes
    them) through qkv_products, and the float32 biases: (q, k, v, (q_bias, k_bias,
    v_bias)). Same parameters."""
    kernels, biases = _kernels_and_biases(proj, x, dtype)
    q, k, v = qkv_products(x.astype(dtype), *kernels)
    return q, k, v, tuple(biases)


def _fused_projection(proj, x, dtype, defer_bias=False):
    """Q, K, V from one [embed] x [embed, 3, heads, kv] product (and one product for the
    input gradient in the backward pass) instead of three, with the parameters of the
    three DenseGenerals unchanged (names, shapes, initialisation: checkpoints and converters
    see no difference). Each DenseGeneral, in the dtype of its parameters, is applied to a
    single zero row with a dot_general that hands back its kernel, so its output is its
    bias; the product runs in the compute `dtype` and the bias is added as DenseGeneral
    adds it (models/layers.py), or with `defer_bias` returned beside them instead:
    (q, k, v, (q_bias, k_bias, v_bias) or None)."""
    kernels, biases = _kernels_and_biases(proj, x, dtype)
    kernel = jnp.stack(kernels, axis=1)  # [embed, 3, heads, kv]
    kernel = nn.with_logical_constraint(kernel, ("embed", None, "heads", "kv"))
    x = x.astype(dtype)
    qkv = jnp.einsum("ble,ethd->blthd", x, kernel)
    if not defer_bias:
        qkv = add_bias(qkv, jnp.stack(biases))
    # each [b, l, heads, kv]
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], tuple(biases) if defer_bias else None
