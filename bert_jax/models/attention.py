"""Multi-head self-attention: the projections, then one of the attention paths of
`models/attention_ops` (chosen by `model.attention` and the platform)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from bert_jax.models import attention_ops
from bert_jax.models.attention_ops import xla as xla_attention
from bert_jax.models.config import BertConfig
from bert_jax.models.dropout import Dropout
from bert_jax.models.layers import DenseGeneral, add_bias, weight_init, zeros_init


class BertSelfAttention(nn.Module):
    """Projections are [embed] -> [heads, kv] DenseGenerals so that tensor parallelism can
    shard heads without reshapes; the Hugging Face / TF layout is a reshape of these.

    Names for the remat policies (models/remat.py): "query", "key", "value" (projections,
    compute dtype) and "context" (the attention output before the output projection)."""

    config: BertConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x, mask):
        """x: <dtype>[batch, length, embed]; mask: <bool>[batch, length] (True = real token),
        or for packed rows <int32>[batch, length] sequence ids (a token attends the tokens
        with its id; 0 = padding)."""
        c = self.config
        proj = lambda name, dtype=c.compute_dtype, **kw: DenseGeneral(  # noqa: E731
            features=(c.num_attention_heads, c.head_dim), axis=-1,
            dtype=dtype, param_dtype=c.storage_dtype,
            kernel_init=weight_init(c, ("embed", "heads", "kv")),
            bias_init=zeros_init(("heads", "kv")), name=name, **kw)
        if c.fused_qkv:
            q, k, v = _fused_projection(proj, x, c.compute_dtype)
        else:  # [batch, length, heads, kv] each
            q, k, v = proj("query")(x), proj("key")(x), proj("value")(x)
        q = checkpoint_name(q, "query")
        k = checkpoint_name(k, "key")
        v = checkpoint_name(v, "value")

        drop = Dropout(rate=c.attention_probs_dropout_prob, impl=c.dropout_rng)
        training = not self.deterministic and c.attention_probs_dropout_prob > 0
        # Init only needs shapes, and is traced without the step's mesh (so without the
        # platform it compiles for): every path has the same parameters.
        packed = jnp.issubdtype(mask.dtype, jnp.integer)
        impl = "xla" if self.is_initializing() else attention_ops.resolve(
            c.attention, attention_ops.platform(), c, training, packed=packed)
        if impl == "xla":
            # [batch, 1, k] key mask, or [batch, q, k] block-diagonal for packed rows.
            kv_mask = mask[:, :, None] == mask[:, None, :] if packed else mask[:, None, :]
            ctx = xla_attention.attention(
                q, k, v, kv_mask, dropout=lambda p: drop(p, deterministic=self.deterministic))
        else:
            ctx = attention_ops.fused(
                impl, q, k, v, mask, dropout_rate=c.attention_probs_dropout_prob,
                dropout_key=drop.make_key() if training else None,
                pallas_options=c.pallas_options)
        ctx = checkpoint_name(ctx, "context")
        ctx = nn.with_logical_constraint(ctx, ("batch", "length", "heads", "kv"))

        return DenseGeneral(
            features=c.hidden_size, axis=(-2, -1),
            dtype=c.compute_dtype, param_dtype=c.storage_dtype,
            kernel_init=weight_init(c, ("heads", "kv", "embed")),
            bias_init=zeros_init(("embed",)), name="output")(ctx)


def _fused_projection(proj, x, dtype):
    """Q, K, V from one [embed] x [embed, 3, heads, kv] product (and one product for the
    input gradient in the backward pass) instead of three, with the parameters of the
    three DenseGenerals unchanged (names, shapes, initialisation: checkpoints and converters
    see no difference). Each DenseGeneral, in the dtype of its parameters, is applied to a
    single zero row with a dot_general that hands back its kernel, so its output is its
    bias; the product runs in the compute `dtype` and the bias is added as DenseGeneral
    adds it (models/layers.py)."""
    kernels, biases = [], []
    for name in ("query", "key", "value"):
        grabbed = {}

        def grab(lhs, kernel, dims, precision=None, grabbed=grabbed):
            grabbed["kernel"] = kernel
            return jnp.zeros(lhs.shape[:1] + kernel.shape[1:], lhs.dtype)

        # Promoted as DenseGeneral promotes a bias: to at least its own dtype.
        layer = proj(name, dtype=None, dot_general=grab)
        biases.append(layer(jnp.zeros((1, x.shape[-1]), dtype))[0])
        kernels.append(grabbed["kernel"].astype(dtype))
    kernel = jnp.stack(kernels, axis=1)  # [embed, 3, heads, kv]
    kernel = nn.with_logical_constraint(kernel, ("embed", None, "heads", "kv"))
    x = x.astype(dtype)
    qkv = add_bias(jnp.einsum("ble,ethd->blthd", x, kernel), jnp.stack(biases))
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each [b, l, heads, kv]
