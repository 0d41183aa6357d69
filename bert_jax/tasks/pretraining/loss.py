"""Pre-training objective: masked LM (+ next sentence prediction), and its metrics."""

from __future__ import annotations

from typing import Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.models.kernels.backend import platform


def pretraining_loss(mlm_logits, nsp_logits: Optional[jnp.ndarray],
                     batch: Mapping[str, jnp.ndarray]):
    """Loss = weighted-mean MLM cross-entropy + mean NSP cross-entropy (paper, section 3.1).

    mlm_logits: [batch, P, vocab] at `masked_lm_positions`; nsp_logits: [batch, 2] or None.
    batch: masked_lm_ids <int>[batch, P], masked_lm_weights <float>[batch, P] (0 = padding
    slot), next_sentence_labels <int>[batch] or [batch, 1] (0 = IsNext, as the original);
    optional example_weights <float>[batch] (0 = eval filler example).
    Packed rows: nsp_logits [batch, K, 2] with next_sentence_labels <int>[batch, K] and
    next_sentence_weights <float>[batch, K] (0 = empty slot), so the NSP mean runs over
    sequences, not rows, and the MLM mean over predicted tokens: the losses of the same
    sequences unpacked.
    Returns (loss, metrics): scalar float32 loss and a dict of float32 scalars with the sums
    behind each mean (`*_sum`, `*_count`) so that metrics average exactly across steps.
    """
    weights = batch["masked_lm_weights"].astype(jnp.float32)
    example_w = batch.get("example_weights")
    if example_w is not None:
        example_w = example_w.astype(jnp.float32)
        weights = weights * example_w[:, None]
    metrics = _weighted_xent("mlm", mlm_logits, batch["masked_lm_ids"], weights)
    loss = metrics["mlm_loss"]
    if nsp_logits is not None:
        metrics.update(_weighted_xent("nsp", *_nsp_slots(nsp_logits, batch, example_w)))
        loss = loss + metrics["nsp_loss"]
    metrics["loss"] = loss
    return loss, metrics


def _nsp_slots(nsp_logits, batch, example_w):
    """(logits [n, 2], labels [n], weights [n]) over every NSP slot of the batch: one per
    row, or K per packed row (weighted by next_sentence_weights)."""
    labels = batch["next_sentence_labels"]
    if nsp_logits.ndim == 3:  # packed: [batch, K, 2]
        w = batch["next_sentence_weights"].astype(jnp.float32)
        if example_w is not None:
            w = w * example_w[:, None]
        return nsp_logits.reshape(-1, 2), labels.reshape(-1), w.reshape(-1)
    labels = labels.reshape(-1)
    w = jnp.ones(labels.shape, jnp.float32) if example_w is None else example_w
    return nsp_logits, labels, w


def _weighted_xent(name: str, logits, labels, weights) -> dict:
    """Weighted-mean cross-entropy and accuracy (float32), with the sums behind them:
    {name}_loss, {name}_acc, {name}_count, {name}_loss_sum, {name}_correct."""
    logits = logits.astype(jnp.float32)
    labels = labels.astype(jnp.int32)
    # On accelerators, a gradient without the vocab-sized scatter (softmax_xent_int). On
    # CPU optax's autodiff as always: the values are the same, but XLA:CPU fuses the two
    # graphs into different kernels downstream, and the CPU step stays bit for bit the one
    # every earlier run and test took.
    xent_fn = (optax.softmax_cross_entropy_with_integer_labels if platform() == "cpu"
               else softmax_xent_int)
    xent = xent_fn(logits, labels)
    count = jnp.sum(weights)
    loss_sum = jnp.sum(xent * weights)
    correct = jnp.sum((jnp.argmax(logits, -1) == labels) * weights)
    denom = jnp.maximum(count, 1e-5)  # an all-filler batch: 0, not NaN
    return {f"{name}_loss": loss_sum / denom, f"{name}_acc": correct / denom,
            f"{name}_count": count, f"{name}_loss_sum": loss_sum, f"{name}_correct": correct}


@jax.custom_vjp
def softmax_xent_int(logits, labels):
    """optax.softmax_cross_entropy_with_integer_labels (the same forward and the same
    gradient values), whose gradient softmax(logits) - one_hot(labels) is one elementwise
    expression: autodiff of the label
    gather would scatter into a zeroed float32 [batch, P, vocab] array, a separate pass
    over the largest tensor of the MLM head. logits: <float>[..., vocab]; labels:
    <int>[...] -> <float>[...]."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def _xent_fwd(logits, labels):
    # optax's forward, op for op, keeping the log-normaliser's own vjp (its residuals).
    lse, lse_vjp = jax.vjp(lambda x: jax.nn.logsumexp(x, axis=-1), logits)
    label_logits = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return lse - label_logits, (lse_vjp, labels)


def _xent_bwd(res, g):
    lse_vjp, labels = res
    # Autodiff's own terms, in its order, so the gradient is the same bit for bit: the
    # log-normaliser's (softmax * g) plus the label gather's (-g at the label), here a
    # select instead of a scatter-add into zeros.
    grad = lse_vjp(g)[0]
    hit = labels[..., None] == jax.lax.broadcasted_iota(labels.dtype, grad.shape,
                                                          grad.ndim - 1)
    grad = grad + jnp.where(hit, -g[..., None], jnp.zeros((), grad.dtype))
    return grad, np.zeros(labels.shape, jax.dtypes.float0)


softmax_xent_int.defvjp(_xent_fwd, _xent_bwd)
