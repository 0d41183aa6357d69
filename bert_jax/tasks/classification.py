"""Sentence / sentence-pair classification and regression: features and loss.

Shared by GLUE and any user pair task (tests/tasks/data/pairs is one). Features follow the
original run_classifier.py: `[CLS] A [SEP] (B [SEP])`, segment 0 for A (and its [SEP]),
1 for B; the longer side is truncated first, one token at a time.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import dataclasses

import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.tasks.readers import DataError


@dataclasses.dataclass(frozen=True)
class PairExample:
    """One sentence (text_b None) or sentence-pair example. label: class name, a float string
    (regression), or None (unlabeled test set). guid: the id used in submission files."""

    guid: str
    text_a: str
    text_b: Optional[str]
    label: Optional[str]


def truncate_pair(a: list, b: Optional[list], max_tokens: int) -> None:
    """In place: pop from the end of the longer list until len(a) + len(b) <= max_tokens
    (the original heuristic: a short side keeps more of its meaning than an even cut). On a
    tie B loses the token, as in the original _truncate_seq_pair."""
    while len(a) + (len(b) if b is not None else 0) > max_tokens:
        if b is not None and len(b) >= len(a):
            b.pop()
        else:
            a.pop()


def assemble_pair(a: list[int], b: Optional[list[int]], cls_id: int, sep_id: int,
                  max_seq_length: int) -> tuple[list[int], list[int]]:
    """(input_ids, segment_ids), unpadded, at most max_seq_length long, from the WordPiece
    ids of A (and B). a and b are truncated in place."""
    truncate_pair(a, b, max_seq_length - (3 if b is not None else 2))
    ids = [cls_id] + a + [sep_id]
    segments = [0] * len(ids)
    if b is not None:
        ids += b + [sep_id]
        segments += [1] * (len(b) + 1)
    return ids, segments


def encode_all(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text (a batch call where the tokenizer has one)."""
    if hasattr(tokenizer, "encode_batch"):
        return [list(x) for x in tokenizer.encode_batch(texts)]
    return [tokenizer.encode(t) for t in texts]


def convert_examples(examples: Sequence[PairExample], tokenizer, max_seq_length: int,
                     labels: Optional[Sequence[str]], source: str = "examples"
                     ) -> dict[str, np.ndarray]:
    """Features `<int32>[N, max_seq_length]` input_ids / input_mask / segment_ids, plus
    label_ids (`<int32>[N]`, or `<float32>[N]` when labels is None = regression) and
    example_index `<int32>[N]`. Unlabeled examples get label 0 (never scored)."""
    n = len(examples)
    out = {k: np.zeros([n, max_seq_length], np.int32)
           for k in ("input_ids", "input_mask", "segment_ids")}
    out["label_ids"] = np.zeros([n], np.float32 if labels is None else np.int32)
    out["example_index"] = np.arange(n, dtype=np.int32)
    label_map = {l: i for i, l in enumerate(labels)} if labels is not None else None
    ids_a = encode_all(tokenizer, [e.text_a for e in examples])
    with_b = [i for i, e in enumerate(examples) if e.text_b is not None]
    ids_b = dict(zip(with_b, encode_all(tokenizer, [examples[i].text_b for i in with_b])))
    for i, ex in enumerate(examples):
        ids, seg = assemble_pair(ids_a[i], ids_b.get(i), tokenizer.cls_id, tokenizer.sep_id,
                                 max_seq_length)
        out["input_ids"][i, :len(ids)] = ids
        out["input_mask"][i, :len(ids)] = 1
        out["segment_ids"][i, :len(ids)] = seg
        if ex.label is None:
            continue
        if label_map is None:
            try:
                out["label_ids"][i] = float(ex.label)
            except ValueError:
                raise DataError(f"{source}: example {ex.guid}: label {ex.label!r} is not a "
                                "number (regression task)") from None
        else:
            if ex.label not in label_map:
                raise DataError(f"{source}: example {ex.guid}: label {ex.label!r} is not one "
                                f"of {list(labels)}")
            out["label_ids"][i] = label_map[ex.label]
    return out


def classification_loss(logits, batch: Mapping[str, jnp.ndarray]):
    """Weighted mean cross-entropy (logits [batch, C], C > 1) or squared error (C == 1,
    regression as STS-B). batch: label_ids [batch], example_weights [batch] (0 = filler).
    Returns (loss, metrics) with the sums behind each mean, so they add up across steps
    (no correct / accuracy for a regression)."""
    logits = logits.astype(jnp.float32)
    w = batch["example_weights"].astype(jnp.float32)
    count = jnp.sum(w)
    if logits.shape[-1] == 1:
        err = logits[:, 0] - batch["label_ids"].astype(jnp.float32)
        per_example = err * err
        correct = None
    else:
        labels = batch["label_ids"].astype(jnp.int32)
        per_example = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        correct = jnp.sum((jnp.argmax(logits, -1) == labels) * w)
    loss_sum = jnp.sum(per_example * w)
    loss = loss_sum / jnp.maximum(count, 1e-5)
    metrics = {"loss": loss, "loss_sum": loss_sum, "count": count}
    if correct is not None:  # classes (a regression has no accuracy)
        metrics.update(correct=correct, accuracy=correct / jnp.maximum(count, 1e-5))
    return loss, metrics


def predictions_from_logits(logits: np.ndarray) -> np.ndarray:
    """[N, C] -> class ids [N]; [N, 1] -> the regression values [N]."""
    logits = np.asarray(logits)
    return logits[:, 0] if logits.shape[-1] == 1 else np.argmax(logits, -1)
