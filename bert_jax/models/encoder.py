"""Transformer layer (post-LN as the paper, or pre-LN) and the layer stack (loop or nn.scan)."""

from __future__ import annotations

import flax.linen as nn
import jax

from bert_jax.models.attention import BertSelfAttention
from bert_jax.models.config import BertConfig
from bert_jax.models.dropout import Dropout
from bert_jax.models.layers import activation, dense, layer_norm

_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class BertLayer(nn.Module):
    config: BertConfig
    deterministic: bool = True
    scanned: bool = False  # under nn.scan: take and return a (carry, output) pair

    @nn.compact
    def __call__(self, x, mask):
        """x: <dtype>[batch, length, embed]; mask: <bool>[batch, length]."""
        c = self.config
        drop = Dropout(rate=c.hidden_dropout_prob, impl=c.dropout_rng)
        attention = BertSelfAttention(c, self.deterministic, name="attention")
        attention_norm = layer_norm(c, "attention_norm")
        intermediate = dense(c, c.intermediate_size, ("embed", "mlp"), "intermediate")
        output = dense(c, c.hidden_size, ("mlp", "embed"), "output")
        output_norm = layer_norm(c, "output_norm")
        act = activation(c.hidden_act)

        def ffn(h):
            h = act(intermediate(h))
            h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
            return output(h)

        if c.pre_ln:
            h = x + drop(attention(attention_norm(x), mask), deterministic=self.deterministic)
            y = h + drop(ffn(output_norm(h)), deterministic=self.deterministic)
        else:
            h = attention_norm(x + drop(attention(x, mask), deterministic=self.deterministic))
            y = output_norm(h + drop(ffn(h), deterministic=self.deterministic))
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
