"""Pre-training objective: masked LM (+ next sentence prediction), and its metrics."""

from __future__ import annotations

from typing import Mapping, Optional

import jax.numpy as jnp
import optax


def pretraining_loss(mlm_logits, nsp_logits: Optional[jnp.ndarray],
                     batch: Mapping[str, jnp.ndarray]):
    """Loss = weighted-mean MLM cross-entropy + mean NSP cross-entropy (paper, section 3.1).

    mlm_logits: [batch, P, vocab] at `masked_lm_positions`; nsp_logits: [batch, 2] or None.
    batch: masked_lm_ids <int>[batch, P], masked_lm_weights <float>[batch, P] (0 = padding
    slot), next_sentence_labels <int>[batch] or [batch, 1] (0 = IsNext, as the original);
    optional example_weights <float>[batch] (0 = eval filler example).
    Returns (loss, metrics): scalar float32 loss and a dict of float32 scalars with the sums
    behind each mean (`*_sum`, `*_count`) so that metrics average exactly across steps.
    """
    ids = batch["masked_lm_ids"].astype(jnp.int32)
    weights = batch["masked_lm_weights"].astype(jnp.float32)
    example_w = batch.get("example_weights")
    if example_w is not None:
        example_w = example_w.astype(jnp.float32)
        weights = weights * example_w[:, None]
    logits = mlm_logits.astype(jnp.float32)
    mlm_xent = optax.softmax_cross_entropy_with_integer_labels(logits, ids)
    mlm_count = jnp.sum(weights)
    mlm_sum = jnp.sum(mlm_xent * weights)
    mlm_loss = mlm_sum / jnp.maximum(mlm_count, 1e-5)
    mlm_correct = jnp.sum((jnp.argmax(logits, -1) == ids) * weights)
    metrics = {"mlm_loss": mlm_loss, "mlm_acc": mlm_correct / jnp.maximum(mlm_count, 1e-5),
               "mlm_count": mlm_count, "mlm_loss_sum": mlm_sum, "mlm_correct": mlm_correct}
    loss = mlm_loss
    if nsp_logits is not None:
        labels = batch["next_sentence_labels"].reshape(-1).astype(jnp.int32)
        w = jnp.ones_like(labels, jnp.float32) if example_w is None else example_w
        nsp_logits = nsp_logits.astype(jnp.float32)
        nsp_xent = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels)
        nsp_count = jnp.sum(w)
        nsp_sum = jnp.sum(nsp_xent * w)
        nsp_loss = nsp_sum / jnp.maximum(nsp_count, 1e-5)
        nsp_correct = jnp.sum((jnp.argmax(nsp_logits, -1) == labels) * w)
        metrics.update(nsp_loss=nsp_loss, nsp_acc=nsp_correct / jnp.maximum(nsp_count, 1e-5),
                       nsp_count=nsp_count, nsp_loss_sum=nsp_sum, nsp_correct=nsp_correct)
        loss = loss + nsp_loss
    metrics["loss"] = loss
    return loss, metrics
