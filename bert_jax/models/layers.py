"""Shared building blocks: initialisers with logical axis names, Dense, LayerNorm, activations."""

from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import normalization as _flax_norm
from flax.linen.dtypes import canonicalize_dtype, promote_dtype
from jax.ad_checkpoint import checkpoint_name

from bert_jax.models import fp8 as fp8_lib
from bert_jax.models.config import BertConfig
from bert_jax.models.kernels import gelu as gelu_kernel
from bert_jax.models.kernels import residual_norm as norm_kernel
from bert_jax.models.kernels.gelu import gelu_erf  # the FFN's GELU lives beside its kernels


class _Partitioned(nn.LogicallyPartitioned):
    """flax's LogicallyPartitioned, except that a value whose rank differs from its names
    is unboxed without the sharding constraint: DenseGeneral initialises its kernel flat
    (2-D) and unboxes it before reshaping to the named rank, which under a global mesh
    would apply a 3-name constraint to a 2-D array and fail (flax 0.12)."""

    def unbox(self, apply_constraint=True):
        if jnp.ndim(self.value) != len(self.names):
            return self.value
        return super().unbox(apply_constraint)


def _with_logical_partitioning(fn, names):
    def wrapper(*args, **kwargs):
        return _Partitioned(fn(*args, **kwargs), tuple(names))
    return wrapper


INIT_ROLES = ("in", "out", "embedding", "classifier")


def init_std(config: BertConfig, role: str = "in") -> float:
    """The standard deviation (before truncation) of a weight of `role`: BERT's scheme
    (init_scheme="bert") uses initializer_range for every weight. ModernBERT's ("modernbert",
    transformers' ModernBertPreTrainedModel._init_weights): initializer_range for "in"
    (query / key / value, the FFN input and gate) and "embedding"; initializer_range /
    sqrt(2 * num_hidden_layers) for "out" (the attention and FFN outputs, the MLM transform,
    the pooler), so the residual stream's variance does not grow with depth; hidden_size
    ** -0.5 for "classifier" heads."""
    if role not in INIT_ROLES:
        raise ValueError(f"init role {role!r}; expected one of {INIT_ROLES}")
    r = config.initializer_range
    if config.init_scheme != "modernbert" or role in ("in", "embedding"):
        return r
    if role == "out":
        return r / math.sqrt(2.0 * config.num_hidden_layers)
    return config.hidden_size ** -0.5


def weight_init(config: BertConfig, axes: Sequence[str], role: str = "in"):
    """Truncated normal of std init_std(config, role), cut at +-2 std: the original TF
    code's, and transformers' ModernBERT's (its initializer_cutoff_factor, 2.0)."""
    return _with_logical_partitioning(
        nn.initializers.truncated_normal(stddev=init_std(config, role)), tuple(axes))


def zeros_init(axes: Sequence[str]):
    return _with_logical_partitioning(nn.initializers.zeros_init(), tuple(axes))


def ones_init(axes: Sequence[str]):
    return _with_logical_partitioning(nn.initializers.ones_init(), tuple(axes))


def promote_all_but_bias(inputs, kernel, bias, dtype=None, inexact=True):
    inputs, kernel = promote_dtype(inputs, kernel, dtype=dtype, inexact=inexact)
    return inputs, kernel, bias


class Dense(nn.Dense):
    """nn.Dense whose bias is added in the parameters' dtype: x @ W in the compute dtype,
    then (that + bias) cast to the compute dtype. Under bfloat16 compute with float32
    params the bias gradient is then a float32 sum over batch x length (nn.Dense adds a
    bfloat16 bias, so the sum runs in bfloat16), as PyTorch's autocast accumulates it.
    With equal dtypes the ops are nn.Dense's, bit for bit; dtype=None promotes all three
    to their common dtype, as nn.Dense does."""

    promote_dtype: object = promote_all_but_bias
    # When set, the product x @ W (before the bias) carries this checkpoint name, so that a
    # remat policy saving it keeps the matmul's own output buffer: naming the biased,
    # cast result instead makes the next fusion write a second copy of it.
    product_name: str | None = None

    @nn.compact
    def __call__(self, inputs, fused_gelu: bool = False, product_only: bool = False,
                 gelu_bias=None):
        """The FFN's kernels (models/kernels/gelu.py), each the same expression as the plain
        call with a one-kernel backward pass; they need a bias and a compute dtype.
        fused_gelu: gelu_erf of the output, through gelu_kernel.bias_gelu. product_only:
        (the named product x W, the float32 bias) instead of the output. gelu_bias: the
        inputs are another Dense's product and this product is GELU(inputs + gelu_bias) W,
        through gelu_kernel.gelu_matmul."""
        # nn.Dense.__call__ (flax 0.12), op for op (a test holds it to nn.Dense bit for
        # bit), with the product named.
        kernel = self.param("kernel", self.kernel_init, (jnp.shape(inputs)[-1], self.features),
                            self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        inputs, kernel, bias = self.promote_dtype(inputs, kernel, bias, dtype=self.dtype)
        if self.dot_general_cls is not None:
            dot_general = self.dot_general_cls()
        else:
            dot_general = self.dot_general or jax.lax.dot_general
        if gelu_bias is not None:
            y = gelu_kernel.gelu_matmul(inputs, gelu_bias, kernel, precision=self.precision)
        else:
            y = dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())),
                            precision=self.precision)
        if self.product_name is not None:
            y = checkpoint_name(y, self.product_name)
        if product_only or fused_gelu:
            if bias is None or self.dtype is None:
                raise ValueError("Dense's FFN kernels need use_bias and a dtype")
            if product_only:
                return y, bias
            return gelu_kernel.bias_gelu(y.astype(self.dtype), bias)
        if bias is not None:
            y += jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
        return y if self.dtype is None else y.astype(self.dtype)


class DenseGeneral(nn.DenseGeneral):
    """nn.DenseGeneral with the bias added in the parameters' dtype (see Dense)."""

    promote_dtype: object = promote_all_but_bias

    def __call__(self, inputs):
        y = super().__call__(inputs)
        return y if self.dtype is None else y.astype(self.dtype)


def add_bias(x, bias):
    """x + bias, the sum in the wider of their dtypes, cast back to x's (see Dense)."""
    wide = jnp.promote_types(x.dtype, bias.dtype)
    return (x.astype(wide) + bias.astype(wide)).astype(x.dtype)


def dense(config: BertConfig, features: int, axes: tuple[str, str], name: str,
          use_bias: bool = True, role: str = "in", product_name: str | None = None,
          fp8: bool = False) -> Dense:
    """A Dense layer whose kernel is named `axes` (in, out) and bias `axes[1]` (none when
    `use_bias` is False); `role` picks the kernel's init std (init_std); `product_name`
    names x @ W for remat policies (Dense); `fp8`: its product in FP8 when the config's
    model.fp8 is on (models/fp8.py: the encoder layers' products, not the heads')."""
    return Dense(
        features,
        dot_general_cls=fp8_lib.op_class(config) if fp8 else None,
        use_bias=use_bias,
        dtype=config.compute_dtype,
        param_dtype=config.storage_dtype,
        kernel_init=weight_init(config, axes, role),
        bias_init=zeros_init(axes[1:]),
        product_name=product_name,
        name=name,
    )


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm, op for op (flax's own statistics function, then the same
    normalisation in the same order; a test holds it to nn.LayerNorm bit for bit), whose
    float32 mean, variance and reciprocal standard deviation carry the checkpoint name
    `stats_name` when it is set. A remat policy that saves them (three floats per token)
    spares the backward pass the re-reduction of the input, a full read of [tokens,
    hidden] per LayerNorm, and the kernel that recomputes the reciprocal.

    residual_of=(p, bias, seeds, rate): the input is x + dropout((p + bias) in the dtype) (x
    the residual, p a sublayer's product before its float32 bias, seeds those of
    dropout.draw_seeds or None), normalised by models/kernels/residual_norm.py's kernels
    with these same parameters (the caller checks norm_kernel.fits first), in p's dtype;
    copies=2: the output twice, for two consumers (norm_kernel.residual_norm)."""

    stats_name: str | None = None

    @nn.compact
    def __call__(self, x, *, mask=None, residual_of=None, copies=1):
        if residual_of is not None:
            width = x.shape[-1]
            scale = self.param("scale", self.scale_init, (width,), self.param_dtype)
            shift = self.param("bias", self.bias_init, (width,), self.param_dtype)
            p, bias, seeds, rate = residual_of
            return norm_kernel.residual_norm(p, bias, x, scale, shift, seeds, rate=rate,
                                             eps=self.epsilon, copies=copies)
        if self.axis_name is not None or not self.use_fast_variance:
            return super().__call__(x, mask=mask)  # not what the models build: flax's own
        name = (lambda v: checkpoint_name(v, self.stats_name)) if self.stats_name else (
            lambda v: v)
        mean, var = _flax_norm._compute_stats(
            x, self.reduction_axes, self.dtype, mask=mask,
            force_float32_reductions=self.force_float32_reductions)
        reduction_axes = _flax_norm._canonicalize_axes(x.ndim, self.reduction_axes)
        feature_axes = _flax_norm._canonicalize_axes(x.ndim, self.feature_axes)
        feature_shape = [1] * x.ndim
        features = []
        for ax in feature_axes:
            feature_shape[ax] = x.shape[ax]
            features.append(x.shape[ax])
        mean = name(jnp.expand_dims(mean, reduction_axes))
        var = name(jnp.expand_dims(var, reduction_axes))
        y = x - mean
        inv = name(jax.lax.rsqrt(var + self.epsilon))
        args = [x]
        if self.use_scale:
            scale = self.param("scale", self.scale_init, features,
                               self.param_dtype).reshape(feature_shape)
            if not self.force_float32_reductions:
                scale = jnp.asarray(scale, self.param_dtype)
            inv = inv * scale
            args.append(scale)
        y = y * inv
        if self.use_bias:
            bias = self.param("bias", self.bias_init, features,
                              self.param_dtype).reshape(feature_shape)
            if not self.force_float32_reductions:
                bias = jnp.asarray(bias, self.param_dtype)
            y = y + bias
            args.append(bias)
        return jnp.asarray(y, canonicalize_dtype(*args, dtype=self.dtype))


def layer_norm(config: BertConfig, name: str, stats_name: str | None = None) -> LayerNorm:
    # flax computes the mean / variance in float32 even for a bfloat16 input.
    return LayerNorm(
        epsilon=config.layer_norm_eps,
        use_bias=config.norm_bias,
        dtype=config.compute_dtype,
        param_dtype=config.storage_dtype,
        scale_init=ones_init(("embed",)),
        bias_init=zeros_init(("embed",)),
        stats_name=stats_name,
        name=name,
    )


def activation(name: str):
    if name == "gelu":
        return gelu_erf
    if name in ("gelu_new", "gelu_tanh"):
        return lambda x: jax.nn.gelu(x, approximate=True)
    if name == "relu":
        return jax.nn.relu
    if name == "tanh":
        return jnp.tanh
    if name == "silu":
        return jax.nn.silu
    raise ValueError(f"unknown activation {name!r}")
