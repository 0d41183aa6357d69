"""cuDNN's fused flash attention (GPU, bfloat16 / float16), with cuDNN's own attention dropout.

    o = attention(q, k, v, kv_mask)                                  # padded rows
    o = attention(q, k, v, sequence_ids, dropout_rate=0.1, seed=s)   # packed rows, dropout

The one module that calls jax's private cuDNN API, `jax._src.cudnn.fused_attention_stablehlo`
(the public `jax.nn.dot_product_attention` takes no dropout). `check_api` compares the private
function's parameters with the ones this module passes and raises CudnnApiError, naming the
jax version, when they differ; tests/models/kernels/test_cudnn.py pins them to the jax
versions it was read against (0.10.2; 0.11's source has the same signature).

Masks. Rows of padding: cuDNN's padding mask, with every query row computed (query length:
the full row) and the real-token count as the key length; the real tokens must come
first (BERT's trailing padding). A row with no real token gets key length 1, so its output
stays finite (such rows carry zero weight). Packed rows (sequence ids 1, 2, ... and 0 for
padding, each sequence contiguous): "bias" (the default) adds a [batch, 1, length, length]
bias of 0 where the ids are equal and a large negative number elsewhere (no bias gradient
is computed), so padding attends padding as in the XLA path; "segments" gives cuDNN the
sequences as offsets and lengths (its packed layout, Hopper or later), padding as one more
sequence, with `max_segments` (static) the most a row may hold: a row with more makes its
queries NaN (the train step's non-finite gate then stops or skips the step) instead of
attending across sequences.

Dropout (`dropout_rate` > 0) is cuDNN's: Philox bits from a static `seed` (compiled into the
call) and an offset that each compiled call keeps on the host, per device, and advances after
every run. So:
  - the forward and backward calls of one layer see the same mask because each runs once a
    step: every layer needs a call of its own, with a seed of its own, or two layers would
    share masks and, in a loop, one layer's forward would pair another's backward.
    attention.py gives each layer its seed (a hash of the module path and the layer), and
    under nn.scan makes the call a lax.switch over the layers' seeds, each branch taken by
    one layer, so once a step. Unrolled, XLA folds the switch away (the encoder passes the
    layer indices as a constant); in a rolled loop it stays, a conditional per layer and
    call, whose index XLA reads on the host;
  - the mask depends on the seed and on how often the compiled step has run in this
    process, not on the step's dropout key: a resumed run draws other masks than an
    uninterrupted one, and runs with different seeds draw the same ones;
  - every device of a data-parallel mesh runs the same call with the same seed and counter:
    each shard's examples get the masks the other shards' examples get at the same place.
The XLA and Pallas paths draw hash masks from the step's key instead (models/dropout.py),
with none of these limits. What a GPU must show about cuDNN's masks (rate, independence
across heads and rows, same seed and step, same mask; next step, another) is checked by
benchmarks/attention_masks.py.

cuDNN's version: jax asks the library for it while tracing; a CPU host compiling for a GPU
description has no library, and gets `NOMINAL_CUDNN` instead (jax uses the number only to
refuse features older cuDNN lacks, none of which this module uses).
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp

from bert_jax.errors import UserError

# The parameters of fused_attention_stablehlo._dot_product_attention (a custom_vjp) in the
# order this module passes them, and those that are static (nondiff_argnums).
API_PARAMETERS = ("query", "key", "value", "bias", "q_seqlen", "kv_seqlen", "q_offsets",
                  "kv_offsets", "page_table_k", "page_table_v", "scale", "seed",
                  "dropout_rate", "variadic_args", "mask_type", "layout",
                  "sliding_window_length", "cudnn_version", "return_residual")
API_STATIC = tuple(range(10, 19))
NOMINAL_CUDNN = 90800  # jax-cuda12-plugin 0.10's floor: cuDNN 9.8
PACKED_LAYOUTS = ("bias", "segments")


class CudnnApiError(UserError, RuntimeError):
    """The installed jax's private cuDNN attention API is not the one this module wraps."""


@functools.lru_cache(maxsize=None)
def private_api():
    """jax's private cuDNN attention module, after check_api (cached: clear with
    private_api.cache_clear())."""
    check_api()
    from jax._src.cudnn import fused_attention_stablehlo
    return fused_attention_stablehlo


def check_api() -> None:
    """Raises CudnnApiError unless jax's private function takes API_PARAMETERS, static at
    API_STATIC, and the enums and helpers used here exist."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fas
        params = tuple(inspect.signature(fas._dot_product_attention).parameters)
        static = tuple(fas._dot_product_attention.nondiff_argnums)
        ok = (params == API_PARAMETERS and static == API_STATIC
              and {"NO_MASK", "PADDING"} <= set(fas.MaskType.__members__)
              and "BTNH" in fas.AttentionLayout.__members__
              and callable(fas.get_large_negative_number) and callable(fas.check_layout))
        found = f"parameters {params}, static {static}"
    except Exception as e:  # noqa: BLE001 - any change of the private module is this error
        ok, found = False, f"{type(e).__name__}: {e}"
    if not ok:
        raise CudnnApiError(
            f"model.attention=cudnn: jax {jax.__version__}'s private cuDNN attention API "
            f"(jax._src.cudnn.fused_attention_stablehlo._dot_product_attention) is not the "
            f"one bert_jax wraps ({found}); use model.attention=pallas or xla, or jax 0.10.2")


def cudnn_version() -> int:
    """The cuDNN library's version, or NOMINAL_CUDNN where jax finds no library."""
    try:
        return int(private_api().check_cudnn_version())
    except CudnnApiError:
        raise
    except Exception:  # noqa: BLE001 - no library: a CPU host compiling for a GPU target
        return NOMINAL_CUDNN


def attention(q, k, v, mask, *, dropout_rate: float = 0.0, seed: int = 0,
              packed_layout: str = "bias", max_segments: int = 4):
    """q, k, v: <half>[batch, length, heads, kv] (q unscaled: the kernel scales by
    1/sqrt(kv)); mask: <bool>[batch, length], True for the real tokens, which come first, or
    for packed rows <int32>[batch, length] sequence ids (module doc). dropout_rate in [0, 1):
    cuDNN's dropout on the probabilities, from `seed` (a Python int in [0, 2**31)).
    packed_layout, max_segments: how packed rows reach cuDNN (module doc). Returns
    <half>[batch, length, heads, kv]."""
    fas = private_api()
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"dropout_rate must be in [0, 1), got {dropout_rate}")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
        raise ValueError(f"seed must be a Python int in [0, 2**31), got {seed!r}")
    if packed_layout not in PACKED_LAYOUTS:
        raise ValueError(f"packed_layout {packed_layout!r}; expected one of {PACKED_LAYOUTS}")
    batch, length = q.shape[:2]
    none = jnp.zeros((0,), q.dtype)  # jax's stand-in for an absent operand
    bias = q_len = kv_len = q_off = kv_off = none
    mask_type = fas.MaskType.NO_MASK
    if not jnp.issubdtype(mask.dtype, jnp.integer):  # padded rows
        mask_type = fas.MaskType.PADDING
        q_len = jnp.full((batch,), length, jnp.int32)
        kv_len = jnp.maximum(jnp.sum(mask.astype(jnp.int32), axis=-1), 1)
    elif packed_layout == "bias":
        same = mask[:, None, :, None] == mask[:, None, None, :]
        bias = jnp.where(same, jnp.zeros((), q.dtype), fas.get_large_negative_number(q.dtype))
    else:
        lengths, offsets, overflow = segments(mask, max_segments)
        q_len = kv_len = lengths
        q_off = kv_off = offsets
        # A row with more sequences than the layout holds: its queries become NaN (one
        # multiply, fused into q's producer) rather than attend across sequences.
        q = q * jnp.where(overflow, jnp.nan, 1.0).astype(q.dtype)[:, None, None, None]
    has_bias = bias.size > 0
    layout = fas.AttentionLayout.BTNH
    fas.check_layout(q, k, v, bias if has_bias else None, None, None, None, None, None, None,
                     layout)
    return fas._dot_product_attention(
        q, k, v, bias, q_len, kv_len, q_off, kv_off, none, none,
        float(q.shape[-1]) ** -0.5, seed, float(dropout_rate),
        (has_bias, False),  # a bias without its gradient: it is a mask
        mask_type, layout.value, None, cudnn_version(), False)


def segments(sequence_ids, max_segments: int):
    """cuDNN's packed layout of <int>[batch, length] sequence ids (each sequence
    contiguous; the trailing padding, id 0, one more sequence): (lengths <int32>[batch, M],
    offsets <int32>[batch, M + 1], overflow <bool>[batch]) with M = max_segments + 1, -1
    after a row's last sequence, and overflow where a row holds more than M runs."""
    if not isinstance(max_segments, int) or max_segments < 1:
        raise ValueError(f"max_segments must be an integer >= 1, got {max_segments!r}")
    m = max_segments + 1
    ids = sequence_ids.astype(jnp.int32)
    starts = jnp.concatenate([jnp.ones_like(ids[:, :1], bool), ids[:, 1:] != ids[:, :-1]],
                             axis=1)
    run = jnp.cumsum(starts.astype(jnp.int32), axis=1) - 1  # each token's run, [batch, length]
    count = run[:, -1] + 1
    lengths = jnp.sum(jax.nn.one_hot(run, m, dtype=jnp.int32), axis=1)  # [batch, m]
    offsets = jnp.cumsum(lengths, axis=1) - lengths
    used = jnp.arange(m)[None, :] < count[:, None]
    lengths = jnp.where(used, lengths, -1)
    offsets = jnp.where(used, offsets, -1)
    offsets = jnp.concatenate([offsets, jnp.full_like(offsets[:, :1], -1)], axis=1)
    return lengths, offsets, count > m
