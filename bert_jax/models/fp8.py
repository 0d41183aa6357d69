"""FP8 matrix products (`model.fp8`): the encoder layers' dense products through flax's FP8
dot_general, `flax.linen.fp8_ops.Fp8DirectDotGeneralOp`.

Each product y = x W is computed as (q(x / s_x) q(W / s_W)) s_x s_W: both operands scaled
into float8_e4m3fn (3 mantissa bits, largest 448), and in the backward pass the output's
gradient scaled into float8_e5m2 (2 mantissa bits, largest 57,344: the range gradients
need); the products accumulate in float32 and come out in the compute dtype. Each scale is
"delayed": the largest magnitude the operand had over the last AMAX_HISTORY steps, divided
by the format's largest value, so that a step quantizes with what earlier steps measured
and needs no extra pass over the operand before its product (the amax of this step goes
into the history as it is quantized). XLA rewrites this pattern into cuBLASLt FP8 GEMMs on
Hopper-class GPUs (compute capability 8.9+), at twice the bfloat16 rate; elsewhere it
computes the same numbers through float32 products of the rounded operands (emulation:
what the CPU tests check, never faster).

Which products: per layer, Q, K, V and the attention output projection, and the FFN's two
(gated FFNs: three). Not the attention scores and context (inside the attention kernels),
the embeddings, the pooler or the heads (the MLM decoder against the embedding table): as
NVIDIA's FP8 BERT (MLPerf), whose FP8 layers are the encoder's linear layers.

The scaling state of each product (input, kernel and output-gradient scale, [1], and amax
history, [AMAX_HISTORY], float32) is a flax variable collection of its own, COLLECTION,
beside "params": not a parameter (the optimizer never sees it) but training state. flax
defines its update as its gradient: the train step differentiates the loss with respect to
it and takes that "gradient" as the new state (bert_jax.train.step), which the checkpoints
keep with the params (bert_jax.train.checkpoint: exact resume) and nothing else carries:
model directories and exports take the params only, a warm start (params, or params and
optimizer state) begins with empty histories, and evaluation runs the model without FP8
(`without_fp8`).
"""

from __future__ import annotations

from typing import Any, Mapping

from flax.linen import fp8_ops

COLLECTION = fp8_ops.OVERWRITE_WITH_GRADIENT  # "_overwrite_with_gradient"
# Steps of amax history per operand: flax's default (and Transformer Engine's long-standing
# one). A longer history follows a shrinking range more slowly, never overflows sooner.
AMAX_HISTORY = fp8_ops.Fp8DirectDotGeneralOp.amax_history_length


def op_class(config):
    """The dot_general_cls of a dense layer the config's `fp8` puts in FP8 (None: plain
    jax.lax.dot_general)."""
    return fp8_ops.Fp8DirectDotGeneralOp if config.fp8 else None


def split(variables: Mapping[str, Any]) -> tuple[Any, dict]:
    """(params, FP8 scaling state: {} without model.fp8) of a model's variables."""
    return variables["params"], dict(variables.get(COLLECTION, {}))


def variables(params, state) -> dict:
    """The model's variables from params and the FP8 scaling state ({} or None: none)."""
    return {"params": params, COLLECTION: state} if state else {"params": params}


def without_fp8(model):
    """`model` (a module of ours, with a BertConfig `config` field) computing without FP8:
    what evaluation and prediction run, so that they need no scaling state."""
    config = getattr(model, "config", None)
    if config is None or not config.fp8:
        return model
    return model.clone(config=config.replace(fp8=False))
