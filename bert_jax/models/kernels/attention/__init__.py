"""Attention kernels behind one dispatch, chosen by `model.attention` and the platform.

    impl = resolve(config.attention, platform(), config, training)   # "xla" | "cudnn" | "pallas"

Paths (one module each):
  xla     scores, float32 softmax, dropout on the probabilities, values: the reference,
          bit for bit the numerics bert_jax always had; any platform, any dropout masks.
  cudnn   cuDNN's fused flash attention (cudnn.py, GPU, bfloat16 / float16), with cuDNN's own
          attention-probability dropout: masks from a compile-time seed per layer and a
          per-call counter, not from the step's key (cudnn.py says what follows: resumed
          runs draw other masks, data-parallel shards repeat each other's). `auto` takes
          it only without attention dropout: evaluation and prediction, and training
          with `model.attention_probs_dropout_prob=0`.
  pallas  on GPU (and CPU) our flash-attention kernel (pallas_flash/): probabilities
          never leave the kernel, and the paper's attention-probability dropout is applied
          inside it with the same counter-based hash masks as the XLA path
          (`model.dropout_rng="hash"`), regenerated in the backward pass instead of stored.
          Lowers through Triton on GPU; on CPU it runs in Pallas' interpret mode (tests
          only: slow). On TPU jax's splash attention (splash_tpu.py), without dropout.

`auto` picks, per call: on GPU cuDNN when the call has no attention dropout (and the dtype is
half precision), else the Pallas kernel when its masks can be the model's (hash masks);
everywhere else XLA (on TPU too, until splash is measured against XLA there). An explicit
choice that cannot run the call is an error naming `model.attention`, never a silent
fallback.

Packed rows (several sequences per row, `BertModel(sequence_ids=...)`): the mask is the
row's <int32>[batch, length] sequence ids instead of a <bool> padding mask, and a token
attends exactly the tokens of its own sequence (padding, id 0, attends padding). The XLA
path builds the block-diagonal [batch, q, k] mask; Pallas (GPU, CPU) and splash (TPU) take
the ids as their segment ids; cuDNN an additive mask of the ids (or, in cudnn.py, its packed
layout of offsets); `auto` takes Pallas for packed rows on a GPU.

Sliding-window layers (`window` > 0: query i attends key j only if |i - j| <= window, on top
of the padding / packing rule; positions are row indices, so in packed rows the in-sequence
distance): xla.attention(..., window=w) (its band_mask); the Pallas kernel visits only the
key blocks that meet each query block's band; splash on TPU takes LocalMask((w, w)). cuDNN
through jax takes a causal left window only, so `auto` takes Pallas for windowed layers on
a GPU, and an explicit cudnn refuses them. window=0 is global attention, unchanged.
"""

from __future__ import annotations

import numbers

import jax
from jax.ad_checkpoint import checkpoint_name

from bert_jax.errors import UserError
from bert_jax.models.dropout import draw_seeds
from bert_jax.models.kernels.attention import cudnn, pallas_flash, splash_tpu
from bert_jax.models.kernels.backend import axes_size, platform, sharded_axes
from bert_jax.models.layers import add_bias

IMPLS = ("auto", "xla", "cudnn", "pallas")


class AttentionConfigError(UserError, ValueError):
    """model.attention cannot run this call (platform, dtype or dropout)."""


def describe(config, plat: str, deterministic_training: bool = False,
             packed: bool = False, window: int = 0) -> str:
    """One line for logs and summaries: the attention path of the training steps and of the
    evaluation steps, and the remat policy. window > 0: the model also has sliding-window
    layers of that half width, whose paths are named too. Raises AttentionConfigError as
    resolve does."""
    def paths(w):
        train = resolve(config.attention, plat, config, training=not deterministic_training,
                        packed=packed, window=w)
        evaluate = resolve(config.attention, plat, config, training=False, packed=packed,
                           window=w)
        return f"{train} (train), {evaluate} (eval)"

    local = f"; window {window} layers {paths(window)}" if window else ""
    return (f"attention {paths(0)}{local} [model.attention={config.attention}]; "
            f"remat {config.remat}")


def resolve(impl: str, plat: str, config, training: bool, packed: bool = False,
            window: int = 0) -> str:
    """The path one attention call takes. `training`: dropout is applied in this call;
    `packed`: the mask is sequence ids of packed rows; `window`: the half width of a
    sliding-window layer (0 = global). Raises AttentionConfigError for an explicit choice
    that cannot run it."""
    if impl not in IMPLS:
        raise AttentionConfigError(f"model.attention={impl!r}; expected one of {IMPLS}")
    if not isinstance(window, numbers.Integral) or isinstance(window, bool) or window < 0:
        raise AttentionConfigError(
            f"attention window must be an integer >= 0 (0 = global), got {window!r}")
    dropout = training and config.attention_probs_dropout_prob > 0
    half = config.dtype_for(plat) in ("bfloat16", "float16")
    if impl == "auto":
        if plat == "gpu" and not dropout and half and not packed and not window:
            return "cudnn"
        if plat == "gpu" and (not dropout or config.dropout_rng == "hash"):
            return "pallas"
        return "xla"
    if impl == "cudnn":
        if plat != "gpu":
            raise AttentionConfigError(
                f"model.attention=cudnn needs a GPU; this step compiles for {plat} "
                "(use auto or xla)")
        if not half:
            raise AttentionConfigError(
                f"model.attention=cudnn needs model.dtype bfloat16 or float16 (or auto on "
                f"a GPU), got {config.dtype!r} (use auto, pallas or xla)")
        if window:
            raise AttentionConfigError(
                f"model.attention=cudnn cannot run a sliding-window layer (window {window}): "
                "jax's cuDNN attention takes only a causal left window; use auto or pallas")
    if impl == "pallas":
        if plat not in ("gpu", "cpu", "tpu"):
            raise AttentionConfigError(
                f"model.attention=pallas runs on GPU, TPU (and CPU in interpret mode), not "
                f"{plat} (use auto or xla)")
        if plat == "tpu" and dropout:
            raise AttentionConfigError(
                "model.attention=pallas on TPU is splash attention, which has no "
                "attention-probability dropout; set model.attention_probs_dropout_prob=0 "
                f"(got {config.attention_probs_dropout_prob}) or use auto / xla")
        if dropout and config.dropout_rng != "hash":
            raise AttentionConfigError(
                "model.attention=pallas draws its attention-dropout masks in the kernel "
                "from the hash generator; set model.dropout_rng=hash (got "
                f"{config.dropout_rng!r}) or use xla")
    return impl


def names_context(impl: str) -> bool:
    """Whether the path `impl` names its own output "context" for the remat policies. The
    Pallas kernel on GPU (and CPU) does, on the output its backward pass keeps beside the
    log-sum-exp ("attention_lse"): naming the returned value again would make a policy keep
    a second copy of it."""
    return impl == "pallas" and platform() != "tpu"


def takes_biases(impl: str) -> bool:
    """Whether the path `impl` adds the Q, K, V projection biases itself (fused(...,
    biases=...)): the Pallas kernel on GPU (and CPU) does, on each tile it loads, so the
    biased projections are never written out (and its backward kernels sum the bias
    gradients)."""
    return impl == "pallas" and platform() != "tpu"


def packs_grads(impl: str, length: int, pallas_options=None, window: int = 0) -> bool:
    """Whether fused(impl, ..., packed_grads=True) over `length` tokens writes dQ, dK, dV as
    one [batch, length, 3, heads, kv] array in the backward pass (pallas_flash): the Pallas
    kernel on GPU (and CPU) when the keys fit its one fused backward kernel, globally."""
    return (impl == "pallas" and platform() != "tpu" and not window
            and pallas_flash.packs_grads(length, **(pallas_options or {})))


def fused(impl: str, q, k, v, kv_mask, *, dropout_rate: float = 0.0, dropout_key=None,
          pallas_options=None, window: int = 0, biases=None, packed_grads: bool = False,
          cudnn_seed: int = 0):
    """A fused path ("cudnn" or "pallas") on q, k, v: <dtype>[batch, length, heads, kv]
    (q unscaled) with kv_mask: <bool>[batch, length] (True = real token), or for packed
    rows <int32>[batch, length] sequence ids. dropout_key: the attention dropout's flax key,
    None for no dropout (cudnn draws its own masks from the static `cudnn_seed`, an int in
    [0, 2**31): cudnn.py; the key then only says that this call drops). pallas_options:
    block sizes, warps and stages of the GPU/CPU Pallas kernel (BertConfig.pallas_options;
    splash on TPU ignores them).
    window: 0 = global; > 0 = a sliding-window layer, query i attends key j only if
    |i - j| <= window as well (Pallas and splash; cudnn raises AttentionConfigError).
    biases: None, or (q_bias, k_bias, v_bias), each <float32>[heads, kv], to add to q, k, v
    (rounded back to their dtype): inside the kernel where takes_biases(impl), else here.
    packed_grads: the Pallas kernel's dQ, dK, dV as slices of one array (packs_grads).
    Returns [batch, length, heads, kv].

    A custom kernel is opaque to XLA's sharding propagation (it would gather the whole
    batch onto every device), so under a mesh it runs per shard through `jax.shard_map`:
    examples over the mesh axes of the "batch" rule, heads over those of "heads". The
    Pallas kernel is told its shard's offsets so that its dropout mask is the one the XLA
    path draws for the global [batch, heads, q, k] array, on any mesh."""
    from jax.sharding import PartitionSpec as P

    heads = q.shape[2]
    seeds = None
    if dropout_key is not None and dropout_rate > 0:
        if impl != "cudnn":
            seeds = draw_seeds(dropout_key)
    else:  # evaluation: the model passes its configured rate and no key
        dropout_rate = 0.0

    packed = jax.numpy.issubdtype(kv_mask.dtype, jax.numpy.integer)
    if impl == "cudnn" and window:
        raise AttentionConfigError(
            f"model.attention=cudnn cannot run a sliding-window layer (window {window}); "
            "use auto or pallas")

    if biases is not None and not takes_biases(impl):
        q, k, v = (add_bias(x, b) for x, b in zip((q, k, v), biases))
        biases = None

    def local(q, k, v, biases, kv_mask, seeds, batch_axes, head_axes):
        if impl == "cudnn":
            return cudnn.attention(q, k, v, kv_mask, dropout_rate=dropout_rate,
                                   seed=cudnn_seed)
        if platform() == "tpu":
            return splash_tpu.attention(q, k, v, kv_mask, window=window)
        batch_offset = head_offset = 0
        if batch_axes:
            batch_offset = jax.lax.axis_index(batch_axes) * q.shape[0]
        if head_axes:
            head_offset = jax.lax.axis_index(head_axes) * q.shape[2]
        # named: a policy keeping it spares each layer's recomputation the conversion
        kv_seg = checkpoint_name(kv_mask.astype(jax.numpy.int32), "attention_mask")
        # Padding rows: every query may attend the real keys (the XLA path's key mask);
        # packed rows: a query attends its own sequence's keys (equal ids).
        q_seg = kv_seg if packed else jax.numpy.ones_like(kv_seg)
        return pallas_flash.flash_attention(
            q, k, v, q_seg, kv_seg, biases=biases, dropout_rate=dropout_rate,
            seeds=seeds, batch_offset=batch_offset, head_offset=head_offset,
            total_heads=heads, window=window, packed_grads=packed_grads,
            **(pallas_options or {}))

    sharded = sharded_axes(("batch", "length", "heads", "kv"))
    if sharded is None:
        return local(q, k, v, biases, kv_mask, seeds, (), ())
    mesh, (batch_axes, _, head_axes, _) = sharded
    if heads % axes_size(mesh, head_axes):
        head_axes = ()
    if q.shape[0] % axes_size(mesh, batch_axes):
        batch_axes = ()
    qkv_spec = P(batch_axes or None, None, head_axes or None, None)
    mask_spec = P(batch_axes or None, None)
    bias_spec = None if biases is None else (P(head_axes or None, None),) * 3
    fn = jax.shard_map(
        lambda q, k, v, b, m, s: local(q, k, v, b, m, s, batch_axes, head_axes),
        mesh=mesh, in_specs=(qkv_spec, qkv_spec, qkv_spec, bias_spec, mask_spec, P()),
        out_specs=qkv_spec, check_vma=False)
    return fn(q, k, v, biases, kv_mask, seeds)

