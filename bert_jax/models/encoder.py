"""Transformer layer (post-LN as the paper, or pre-LN) and the layer stack (loop or nn.scan).

What a layer keeps for the backward pass is chosen by `model.remat`. The named values
(`checkpoint_name`) a policy may keep, per example per layer at length L, hidden H, heads A,
FFN F, in the compute dtype:
    query, key, value    3 x [L, H]     (attention.py)
    context              [L, H]         the attention output, input of its output projection
    attention_residual   [L, H]         x + attention(x): the first LayerNorm's input
    ffn_pre              [L, F]         the FFN's pre-activation (before GELU)
    output_residual      [L, H]         h + ffn(h): the second LayerNorm's input
The layer input is kept by every policy (the scan carry / the previous layer's output).
"minimal" keeps the first four rows and output_residual: about (6 L H) elements, 1.75 MiB at
L=128, H=1024 in bfloat16 with the input; the FFN's first product, GELU, the LayerNorms and
the attention probabilities are recomputed in the backward pass (about 11% more FLOPs, the
FFN's first product). "minimal_ffn" also keeps ffn_pre (+1 MiB there, no product recomputed).
"""

from __future__ import annotations

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name

from bert_jax.models.attention import BertSelfAttention
from bert_jax.models.config import BertConfig
from bert_jax.models.dropout import Dropout
from bert_jax.models.layers import activation, dense, layer_norm

_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "minimal": jax.checkpoint_policies.save_only_these_names(
        "query", "key", "value", "context", "attention_residual", "output_residual"),
    "minimal_ffn": jax.checkpoint_policies.save_only_these_names(
        "query", "key", "value", "context", "attention_residual", "ffn_pre",
        "output_residual"),
}


class BertLayer(nn.Module):
    config: BertConfig
    deterministic: bool = True
    scanned: bool = False  # under nn.scan: take and return a (carry, output) pair

    @nn.compact
    def __call__(self, x, mask):
        """x: <dtype>[batch, length, embed]; mask: <bool>[batch, length] (True = real token)
        or <int32>[batch, length] sequence ids of packed rows (models/attention.py)."""
        c = self.config
        drop = Dropout(rate=c.hidden_dropout_prob, impl=c.dropout_rng)
        attention = BertSelfAttention(c, self.deterministic, name="attention")
        attention_norm = layer_norm(c, "attention_norm")
        intermediate = dense(c, c.intermediate_size, ("embed", "mlp"), "intermediate")
        output = dense(c, c.hidden_size, ("mlp", "embed"), "output")
        output_norm = layer_norm(c, "output_norm")
        act = activation(c.hidden_act)

        def ffn(h):
            h = act(checkpoint_name(intermediate(h), "ffn_pre"))
            h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
            return output(h)

        def residual(a, b, name):
            return checkpoint_name(a + drop(b, deterministic=self.deterministic), name)

        if c.pre_ln:
            h = residual(x, attention(attention_norm(x), mask), "attention_residual")
            y = residual(h, ffn(output_norm(h)), "output_residual")
        else:
            h = attention_norm(residual(x, attention(x, mask), "attention_residual"))
            y = output_norm(residual(h, ffn(h), "output_residual"))
        y = nn.with_logical_constraint(y, ("batch", "length", "embed"))
        return (y, None) if self.scanned else y


class BertEncoder(nn.Module):
    """The layer stack. Unscanned params: layer_0 ... layer_{L-1}; scanned: one `layers`
    subtree whose leaves have a leading [layers] axis (see `models.params` to convert)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, mask, deterministic: bool = True):
        c = self.config
        layer_cls = BertLayer
        if c.remat != "none":
            layer_cls = nn.remat(BertLayer, policy=_REMAT_POLICIES[c.remat], prevent_cse=not c.scan_layers)
        if c.scan_layers:
            stack = nn.scan(
                layer_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=nn.broadcast,
                length=c.num_hidden_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = stack(c, deterministic, scanned=True, name="layers")(x, mask)
        else:
            for i in range(c.num_hidden_layers):
                x = layer_cls(c, deterministic, name=f"layer_{i}")(x, mask)
        if c.pre_ln:
            x = layer_norm(c, "final_norm")(x)
        return x
