"""Transformer layer (post-LN as the paper, or pre-LN) and the layer stack (loop or nn.scan).

What a layer keeps for the backward pass is chosen by `model.remat`. The named values
(`checkpoint_name`) a policy may keep, per example per layer at length L, hidden H, heads A,
FFN F, in the compute dtype:
    query, key, value    3 x [L, H]     (attention.py)
    context              [L, H]         the attention output, input of its output projection
    attention_lse        [A, L] float32 the Pallas kernel's log-sum-exp (with context, its
                                        backward pass needs no second forward kernel)
    attention_residual   [L, H]         x + attention(x): the first LayerNorm's input
    ffn_input            [L, H]         the FFN's input (post-LN: the first LayerNorm's
                                        output; pre-LN: the second's)
    ffn_pre              [L, F]         the FFN's first product x W_in, before its bias and
                                        GELU (the matmul's own output: naming the biased
                                        value would make the GELU kernel write a copy)
    output_residual      [L, H]         h + ffn(h): the second LayerNorm's input
    norm_stats           3 x [L] float32 each LayerNorm's mean, variance and 1/std
    dropout_seeds        a few uint32   each dropout's two hash seeds (models/dropout.py)
    attention_mask       [L] int32      the Pallas kernel's key segment ids
The layer input is kept by every policy (the scan carry / the previous layer's output).
"minimal" keeps query ... attention_residual, output_residual and the last three rows:
about (6 L H) elements, 1.75 MiB at L=128, H=1024 in bfloat16 with the input; the FFN's
first product, GELU, the LayerNorms' outputs and the attention probabilities are recomputed
in the backward pass (about 11% more FLOPs, the FFN's first product). "minimal_ffn" also
keeps ffn_pre and ffn_input (+1.25 MiB there): the backward pass recomputes no product and
no LayerNorm, only GELU. The last three rows are a few bytes per token, and keeping them
spares each layer's recomputation a re-reduction per LayerNorm and a handful of tiny
kernels (BERT-Large on the H100 target: benchmarks/RESULTS.md).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from bert_jax.models import fp8 as fp8_lib
from bert_jax.models.attention import BertSelfAttention
from bert_jax.models.config import BertConfig
from bert_jax.models.dropout import Dropout, draw_seeds
from bert_jax.models.kernels import gelu as gelu_kernel
from bert_jax.models.kernels import residual_norm as norm_kernel
from bert_jax.models.kernels.backend import platform
from bert_jax.models.layers import activation, dense, layer_norm

_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "minimal": jax.checkpoint_policies.save_only_these_names(
        "query", "key", "value", "context", "attention_lse", "attention_residual",
        "output_residual", "norm_stats", "dropout_seeds", "attention_mask"),
    "minimal_ffn": jax.checkpoint_policies.save_only_these_names(
        "query", "key", "value", "context", "attention_lse", "attention_residual", "ffn_pre",
        "ffn_input", "output_residual", "norm_stats", "dropout_seeds", "attention_mask"),
}


def _kernels_as(dtype):
    """A params-view function casting every float `kernel` leaf (the Dense weights) to
    `dtype`; biases and LayerNorm params keep theirs (Dense adds its bias in float32)."""
    def cast(variables):
        def leaf(path, x):
            named = any(getattr(k, "key", None) == "kernel" for k in path)
            if named and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
                return x.astype(dtype)
            return x
        return jax.tree_util.tree_map_with_path(leaf, variables)
    return cast


def fused_norms(config: BertConfig, shape, initializing: bool) -> bool:
    """Whether the layers take the residual + LayerNorm kernels (model.residual_norm) for
    activations of `shape`: they then pass each other (output, output) pairs (BertLayer)."""
    return (not config.pre_ln and not initializing
            and norm_kernel.path(config.residual_norm, platform(), config)
            and norm_kernel.fits(shape))


class BertLayer(nn.Module):
    config: BertConfig
    deterministic: bool = True
    scanned: bool = False  # under nn.scan: take and return a (carry, output) pair
    index: int = 0  # the layer's place in the stack (unscanned; under nn.scan an input)

    @nn.compact
    def __call__(self, x, mask, positions=None, index=None):
        """x: <dtype>[batch, length, embed]; mask: <bool>[batch, length] (True = real token)
        or <int32>[batch, length] sequence ids of packed rows (models/attention.py);
        positions: rotary positions <int>[batch or 1, length] (None: 0 .. length - 1);
        index: under nn.scan, the layer's traced <int32>[] place in the stack.
        With the residual + LayerNorm kernels (fused_norms), x and the output are pairs of
        the same activations: (the attention's input, the residual): the second LayerNorm's
        backward kernel then adds the next layer's two cotangents itself (XLA would add them
        in a kernel of its own first)."""
        c = self.config
        x, x_residual = x if isinstance(x, tuple) else (x, x)
        n = c.global_attn_every_n_layers
        if index is None:
            local = c.layer_window(self.index) > 0
        else:
            local = (index % n != 0) if c.layer_window(1) else False
        drop = Dropout(rate=c.hidden_dropout_prob, impl=c.dropout_rng)
        attention = BertSelfAttention(c, self.deterministic, name="attention")
        if c.layer0_attention_norm or self.index > 0 or index is not None:
            attention_norm = layer_norm(c, "attention_norm", "norm_stats")
        else:  # its input is the embedding LayerNorm's output
            attention_norm = lambda h: h  # noqa: E731
        width = c.intermediate_size
        intermediate = dense(c, width, ("embed", "mlp"), "intermediate", c.use_bias,
                             product_name="ffn_pre", fp8=True)
        gate = (dense(c, width, ("embed", "mlp"), "gate", c.use_bias, product_name="ffn_pre",
                      fp8=True)
                if c.ffn_type != "dense" else None)
        output = dense(c, c.hidden_size, ("mlp", "embed"), "output", c.use_bias, "out",
                       fp8=True)
        output_norm = layer_norm(c, "output_norm", "norm_stats")
        act = activation(c.hidden_act)

        # The bias + exact GELU with a one-kernel backward pass (model.gelu_backward):
        # "gelu" without remat, "gelu_matmul" (the second product included, the GELU output
        # recomputed in that kernel) under remat.
        kernel = (gelu_kernel.path(c.gelu_backward, platform(), c.compute_dtype, c.hidden_act,
                                   c.remat, fp8=c.fp8) if gate is None and c.use_bias else None)

        def ffn(h, product_only=False):
            if kernel == "gelu_matmul":
                p, bias = intermediate(h, product_only=True)
                p = nn.with_logical_constraint(p, ("batch", "length", "mlp"))
                return output(p, gelu_bias=bias, product_only=product_only)
            g = intermediate(h, fused_gelu=True) if kernel == "gelu" else act(intermediate(h))
            if gate is not None:  # GLU: act(x W_in) * (x W_gate)
                g = g * gate(h)
            g = nn.with_logical_constraint(g, ("batch", "length", "mlp"))
            return output(g, product_only=product_only)

        def residual(a, b, name):
            return checkpoint_name(a + drop(b, deterministic=self.deterministic), name)

        def attend(h, product_only=False):
            return attention(h, mask, positions, local, product_only=product_only,
                             layer=self.index if index is None else index)

        # Post-LN's bias + dropout + residual + LayerNorm as one kernel each way
        # (model.residual_norm): the sublayers hand over their products before the bias.
        fused = fused_norms(c, x.shape, self.is_initializing())
        if fused:
            rate = 0.0 if self.deterministic else c.hidden_dropout_prob

            def residual_norm(norm, a, out, copies=1):
                seeds = draw_seeds(drop.make_key()) if rate > 0 else None
                return norm(a, residual_of=(*out, seeds, rate), copies=copies)

            # two copies of the first LayerNorm's output, the FFN's input and the second's
            # residual: its backward kernel adds their cotangents itself
            h, h_residual = residual_norm(attention_norm, x_residual,
                                          attend(x, product_only=True), 2)
            h = checkpoint_name(h, "ffn_input")
            y = residual_norm(output_norm, h_residual, ffn(h, product_only=True), 2)
        elif c.pre_ln:
            h = residual(x, attend(attention_norm(x)), "attention_residual")
            y = residual(h, ffn(checkpoint_name(output_norm(h), "ffn_input")), "output_residual")
        else:
            h = checkpoint_name(attention_norm(residual(x, attend(x), "attention_residual")),
                                "ffn_input")
            y = output_norm(residual(h, ffn(h), "output_residual"))
        constrain = lambda a: nn.with_logical_constraint(  # noqa: E731
            a, ("batch", "length", "embed"))
        y = tuple(map(constrain, y)) if fused else constrain(y)
        return (y, None) if self.scanned else y


class BertEncoder(nn.Module):
    """The layer stack. Unscanned params: layer_0 ... layer_{L-1}; scanned: one `layers`
    subtree whose leaves have a leading [layers] axis (see `models.params` to convert).
    When layer 0 differs in its parameters (`layer0_attention_norm=False`), a scanned
    stack keeps it apart as `layer_0` and scans layers 1 .. L-1. Local and global layers
    share one scanned body: each gets its index as a scanned input."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, mask, deterministic: bool = True, positions=None):
        c = self.config
        layer_cls = BertLayer
        unroll = c.unroll_for(platform())
        if c.remat != "none":
            # A rolled scan keeps XLA from merging the backward pass's recomputation with the
            # forward pass (they are in different loops); straight-line layers (unscanned or
            # unrolled) need remat's barriers for that, else the recomputed values are kept.
            rolled = c.scan_layers and unroll == 1
            layer_cls = nn.remat(BertLayer, policy=_REMAT_POLICIES[c.remat], prevent_cse=not rolled)
            if not rolled and c.compute_dtype != c.storage_dtype and not self.is_initializing():
                # The barriers hold every input of the recomputation, the weights included:
                # cast outside them, each weight is cast once per step, in the forward pass,
                # and the backward pass reads that copy. Cast inside, the backward pass casts
                # again, and each float32 layer slice of a stacked weight is written out for
                # its barrier (BERT-Large, H100: 288 kernels and ~4 GiB a step). The values
                # and gradients are the same: the cast is the Dense layers' own.
                layer_cls = nn.map_variables(layer_cls, "params",
                                             trans_in_fn=_kernels_as(c.compute_dtype))
        pairs = fused_norms(c, x.shape, self.is_initializing())
        if pairs:  # the layers pass (output, output) pairs (BertLayer)
            x = (x, x)
        if c.scan_layers:
            first = 0
            if not c.layer0_attention_norm:
                x = layer_cls(c, deterministic, name="layer_0")(x, mask, positions)
                first = 1
            # Each scanned step gets its index with local layers (local or global) and on
            # cuDNN's attention (its dropout seed: attention.py); a numpy constant, so that
            # unrolled, XLA folds what each layer's index decides (lax.cond / lax.switch)
            if c.layer_window(1) or c.attention == "cudnn":
                in_axes = (nn.broadcast, nn.broadcast, 0)
                args = (mask, positions,
                        np.arange(first, c.num_hidden_layers, dtype=np.int32))
            else:
                in_axes, args = nn.broadcast, (mask, positions)
            length = c.num_hidden_layers - first
            stack = nn.scan(
                layer_cls,
                # each layer's FP8 scaling state stacked as its params are
                variable_axes={"params": 0, fp8_lib.COLLECTION: 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=in_axes,
                length=length,
                # execution only: the params stay stacked [length, ...] whatever it is
                unroll=min(unroll or length, length),
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = stack(c, deterministic, scanned=True, index=first, name="layers")(x, *args)
        else:
            for i in range(c.num_hidden_layers):
                x = layer_cls(c, deterministic, index=i, name=f"layer_{i}")(x, mask, positions)
        if pairs:
            x = x[0]
        if c.pre_ln:
            x = layer_norm(c, "final_norm")(x)
        return x
