"""Named-entity recognition (CoNLL-2003 format): first-sub-token labelling and entity F1.

Each word's label sits on its first WordPiece; the other pieces, [CLS], [SEP] and padding
get label weight 0 (ignored by the loss and by decoding), as the paper does. A sentence
longer than max_seq_length - 2 pieces is truncated: its cut words are predicted "O" (and
still count in the gold entities, so the score is never flattered); a warning says how many.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from bert_jax import paths
from bert_jax.tasks.inputs import cache_key, cached_features, check_features
from bert_jax.models.bert import BertForTokenClassification
from bert_jax.tasks.base import EvalSet, FinetuneTask
from bert_jax.tasks.ner import metrics as ner_metrics
from bert_jax.tasks.ner import reader as readers
from bert_jax.tasks.ner.reader import NerExample
from bert_jax.tasks.readers import DataError

# CoNLL-2003 tags; IOB1 (as distributed) and IOB2 (tfds) both use these names.
CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC",
                    "I-MISC")


def convert_examples(examples: Sequence[NerExample], tokenizer, max_seq_length: int,
                     labels: Sequence[str], source: str = "examples") -> dict[str, np.ndarray]:
    """input_ids / input_mask / segment_ids / label_ids / label_weights <int32>[N, L];
    word_index [N, L] = the word a first piece starts (-1 elsewhere); example_index [N]."""
    label_map = {l: i for i, l in enumerate(labels)}
    n = len(examples)
    out = {k: np.zeros([n, max_seq_length], np.int32)
           for k in ("input_ids", "input_mask", "segment_ids", "label_ids", "label_weights")}
    out["word_index"] = np.full([n, max_seq_length], -1, np.int32)
    out["example_index"] = np.arange(n, dtype=np.int32)
    truncated = 0
    for i, ex in enumerate(examples):
        ids, pos = [tokenizer.cls_id], 1
        for w, (word, tag) in enumerate(zip(ex.words, ex.tags)):
            if tag not in label_map:
                raise DataError(f"{source}: sentence {ex.guid}, word {w} ({word!r}): tag "
                                f"{tag!r} is not one of {list(labels)}")
            pieces = tokenizer.encode(word)
            if not pieces:
                continue  # e.g. a control character: no piece to carry the label
            if pos + len(pieces) > max_seq_length - 1:
                truncated += 1
                break
            out["label_ids"][i, pos] = label_map[tag]
            out["label_weights"][i, pos] = 1
            out["word_index"][i, pos] = w
            ids += pieces
            pos += len(pieces)
        ids.append(tokenizer.sep_id)
        out["input_ids"][i, :len(ids)] = ids
        out["input_mask"][i, :len(ids)] = 1
    if truncated:
        logging.warning("NER: %d sentence(s) longer than max_seq_length=%d were truncated",
                        truncated, max_seq_length)
    return out


def token_loss(logits, batch: Mapping[str, jnp.ndarray]):
    """Cross-entropy at first sub-tokens: logits [batch, L, C]; label_ids, label_weights
    [batch, L]; example_weights [batch]. Mean over labelled words of the batch."""
    w = batch["label_weights"].astype(jnp.float32) * batch["example_weights"].astype(
        jnp.float32)[:, None]
    labels = batch["label_ids"].astype(jnp.int32)
    logits = logits.astype(jnp.float32)
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    count = jnp.sum(w)
    loss_sum = jnp.sum(xent * w)
    correct = jnp.sum((jnp.argmax(logits, -1) == labels) * w)
    loss = loss_sum / jnp.maximum(count, 1e-5)
    return loss, {"loss": loss, "loss_sum": loss_sum, "count": count, "correct": correct,
                  "accuracy": correct / jnp.maximum(count, 1e-5)}


def decode(examples: Sequence[NerExample], features, pred_ids: np.ndarray,
           labels: Sequence[str]) -> list[list[str]]:
    """Per example, one predicted tag per word (words without a piece -> "O")."""
    out = [["O"] * len(e.words) for e in examples]
    rows, cols = np.nonzero(features["word_index"] >= 0)
    for r, c in zip(rows, cols):
        out[features["example_index"][r]][features["word_index"][r, c]] = labels[pred_ids[r, c]]
    return out


class NerTask(FinetuneTask):
    def __init__(self, train_file: str = "", dev_file: str = "", test_file: str = "",
                 labels: Optional[Sequence[str]] = None, max_seq_length: int = 128,
                 strict: bool = False, tfds_data_dir=None, cache_dir: str = "",
                 vocab_file: str = ""):
        self.files = {"train": train_file, "dev": dev_file, "test": test_file}
        self.labels = tuple(labels) if labels else CONLL2003_LABELS
        self.max_seq_length, self.strict = max_seq_length, strict
        self.tfds_data_dir, self.cache_dir, self.vocab_file = tfds_data_dir, cache_dir, vocab_file
        self.main_metric = "f1"

    def head(self, bert_config):
        return BertForTokenClassification(bert_config, len(self.labels))

    def read(self, split):
        path = self.files[split]
        return readers.read_conll(path) if path else readers.read_conll_tfds(
            split, self.tfds_data_dir)

    def _features(self, split, examples, tokenizer):
        source = self.files[split] or f"tfds conll2003:{split}"
        key = cache_key(source=source, vocab=self.vocab_file, labels=self.labels,
                        max_seq_length=self.max_seq_length, n=len(examples))
        return check_features(cached_features(
            self.cache_dir, f"ner-{split}", key, lambda: convert_examples(
                examples, tokenizer, self.max_seq_length, self.labels, source)),
            tokenizer, source)

    def eval_sets(self, tokenizer) -> list[EvalSet]:
        sets = []
        for split in ("dev", "test"):
            if split == "test" and not self.files["test"] and self.files["dev"]:
                continue  # local files: the test set only when given
            examples = self.read(split)
            sets.append(EvalSet(split, self._features(split, examples, tokenizer), examples))
        return sets

    def weight(self, batch):
        """Labelled words (first pieces), filler rows left out: what token_loss averages."""
        return jnp.sum(batch["label_weights"].astype(jnp.float32)
                       * batch["example_weights"].astype(jnp.float32)[:, None])

    def objective(self, outputs, batch):
        return token_loss(outputs, batch)

    def keep(self, outputs, batch):
        return {"pred_ids": jnp.argmax(outputs, -1).astype(jnp.int32),
                "example_index": batch["example_index"],
                "example_weights": batch["example_weights"]}

    def predict(self, eval_set: EvalSet, kept) -> list[list[str]]:
        order = np.argsort(kept["example_index"], kind="stable")
        return decode(eval_set.examples, eval_set.features, kept["pred_ids"][order],
                      self.labels)

    def score(self, eval_set: EvalSet, kept) -> dict[str, float]:
        pred = self.predict(eval_set, kept)
        gold = [list(e.tags) for e in eval_set.examples]
        out = ner_metrics.entity_f1(gold, pred, strict=self.strict)
        out["token_accuracy"] = ner_metrics.token_accuracy(gold, pred)
        return out

    def write_predictions(self, eval_set: EvalSet, kept, out_dir: str) -> list[str]:
        """CoNLL columns `word gold predicted` (conlleval's input), blank line between
        sentences."""
        pred = self.predict(eval_set, kept)
        path = paths.join(out_dir, f"ner_predictions-{eval_set.name}.txt")
        with paths.write_atomic(path) as f:
            for ex, tags in zip(eval_set.examples, pred):
                for word, gold, p in zip(ex.words, ex.tags, tags):
                    f.write(f"{word} {gold} {p}\n")
                f.write("\n")
        return [path]
