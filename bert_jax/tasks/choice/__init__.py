"""Multiple choice: SWAG (the paper, section 4.4), HellaSwag, and your own questions.

    task = ChoiceTask("swag", train_file="swagaf/data/train.csv", dev_file=".../val.csv")
    task = ChoiceTask("hellaswag")                      # tfds hellaswag, or its .jsonl files
    task = ChoiceTask("jsonl", train_file="train.jsonl", dev_file="dev.jsonl")   # your own

As the paper: each of an example's C choices is its own input sequence, `[CLS] context [SEP]
start ending_i [SEP]` (segment 0 for the context and its [SEP], 1 for the rest), cut
longest-first as the classifier pairs; the encoder reads the C sequences, a single vector
(plus bias) scores each pooled [CLS], and a softmax over the C scores is trained with
cross-entropy on the right ending (BertForMultipleChoice). Metric: accuracy.

Predictions: `choice_predictions-<set>.tsv` (`index<TAB>prediction<TAB>prob_0 ...`): the
chosen ending and every ending's softmax probability.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from bert_jax import paths
from bert_jax.tasks.inputs import cache_key, cached_features, check_features
from bert_jax.models.bert import BertForMultipleChoice
from bert_jax.models.config import ConfigError
from bert_jax.tasks import metrics
from bert_jax.tasks.base import EvalSet, FinetuneTask
from bert_jax.tasks.choice import reader as readers
from bert_jax.tasks.choice.reader import ChoiceExample
from bert_jax.tasks.classification import encode_all, assemble_pair, classification_loss
from bert_jax.tasks.readers import DataError

CHOICE_FORMATS = ("swag", "hellaswag", "jsonl")


def second_segment(ex: ChoiceExample, ending: str) -> str:
    """Sentence B of one choice: the shared start, then the ending (HF's run_swag joins
    SWAG's sent2 and ending the same way)."""
    return f"{ex.start} {ending}" if ex.start else ending


def convert_examples(examples: Sequence[ChoiceExample], tokenizer, max_seq_length: int,
                     source: str = "examples") -> dict[str, np.ndarray]:
    """input_ids / input_mask / segment_ids `<int32>[N, choices, max_seq_length]`, label_ids
    `<int32>[N]` (0 when unlabelled: never scored), example_index `<int32>[N]`. Every example
    must have the same number of endings (a batch is a dense [batch, choices, length])."""
    n = len(examples)
    if n == 0:
        raise DataError(f"{source}: no examples")
    choices = len(examples[0].endings)
    for ex in examples:
        if len(ex.endings) != choices:
            raise DataError(f"{source}: example {ex.guid} has {len(ex.endings)} endings, "
                            f"example {examples[0].guid} has {choices}; every question needs "
                            f"the same number")
    shape = [n, choices, max_seq_length]
    out = {k: np.zeros(shape, np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
    out["label_ids"] = np.array([e.label or 0 for e in examples], np.int32)
    out["example_index"] = np.arange(n, dtype=np.int32)
    contexts = encode_all(tokenizer, [e.context for e in examples])
    seconds = encode_all(tokenizer, [second_segment(e, end) for e in examples
                                      for end in e.endings])
    for i in range(n):
        for j in range(choices):
            ids, seg = assemble_pair(list(contexts[i]), seconds[i * choices + j],
                                     tokenizer.cls_id, tokenizer.sep_id, max_seq_length)
            out["input_ids"][i, j, :len(ids)] = ids
            out["input_mask"][i, j, :len(ids)] = 1
            out["segment_ids"][i, j, :len(ids)] = seg
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


class ChoiceTask(FinetuneTask):
    """name: "swag" (the CSVs; train_file to train, dev_file), "hellaswag" (its .jsonl
    files, or tfds hellaswag when no file is given) or "jsonl" (your own questions in
    HellaSwag's JSON-lines layout, see read_choice_jsonl). A test_file (SWAG's test.csv,
    unlabelled) is predicted, and scored only if every question has a label."""

    def __init__(self, name: str = "swag", train_file: str = "", dev_file: str = "",
                 test_file: str = "", max_seq_length: int = 128, tfds_data_dir=None,
                 cache_dir: str = "", vocab_file: str = ""):
        if name not in CHOICE_FORMATS:
            raise ConfigError(f"unknown multiple-choice task {name!r}; expected one of "
                             f"{list(CHOICE_FORMATS)}")
        self.files = {"train": train_file, "dev": dev_file, "test": test_file}
        self.name, self.max_seq_length = name, max_seq_length
        self.tfds_data_dir, self.cache_dir, self.vocab_file = tfds_data_dir, cache_dir, vocab_file
        self.main_metric = "accuracy"

    def head(self, bert_config):
        return BertForMultipleChoice(bert_config)

    # --- data ------------------------------------------------------------------------

    def source(self, split: str) -> str:
        """The file of `split` (checked to exist), or "tfds hellaswag:<split>" for HellaSwag
        without files; a split with neither is a ValueError naming the key to set."""
        path = self.files[split]
        if not path:
            if self.name != "hellaswag" or any(self.files.values()):
                raise ConfigError(f"multiple-choice task {self.name!r} reads files: set "
                                 f"task.{split}_file"
                                 + (" (tfds has no SWAG)" if self.name == "swag" else ""))
            return f"tfds hellaswag:{split}"
        if not paths.is_file(path):
            raise FileNotFoundError(f"task.{split}_file={path}: no such file")
        return path

    def read(self, split: str) -> list[ChoiceExample]:
        source = self.source(split)
        if not self.files[split]:
            return readers.read_hellaswag_tfds(split, self.tfds_data_dir)
        if self.name == "swag":
            return readers.read_swag_csv(source, labeled=split != "test")
        return readers.read_choice_jsonl(source)

    def _features(self, split: str, examples, tokenizer):
        source = self.source(split)
        key = cache_key(source=source, vocab=self.vocab_file, task=self.name,
                        max_seq_length=self.max_seq_length, n=len(examples))
        return check_features(cached_features(
            self.cache_dir, f"choice-{self.name}-{split}", key,
            lambda: convert_examples(examples, tokenizer, self.max_seq_length, source)),
            tokenizer, source)

    def train_features(self, tokenizer):
        # Every file the run reads, before the (long) tokenisation of the training set.
        for split in ("train", "dev") + (("test",) if self.files["test"] else ()):
            self.source(split)
        examples = self.read("train")
        unlabeled = [e.guid for e in examples if e.label is None]
        if unlabeled:
            raise DataError(f"{self.source('train')}: {len(unlabeled)} training questions "
                            f"have no label (first: {unlabeled[0]})")
        return self._features("train", examples, tokenizer)

    def eval_sets(self, tokenizer) -> list[EvalSet]:
        sets = []
        for split in ("dev", "test"):
            if split == "test" and not self.files["test"]:
                continue  # hidden test labels (SWAG, HellaSwag): predicted only when asked
            examples = self.read(split)
            labeled = all(e.label is not None for e in examples)
            if split == "dev" and not labeled:
                raise DataError(f"{self.source('dev')}: the dev set picks the best run and "
                                f"needs a label on every question")
            sets.append(EvalSet(split, self._features(split, examples, tokenizer), examples,
                                labeled))
        return sets

    # --- step side (jnp) -------------------------------------------------------------

    def objective(self, outputs, batch):
        """outputs: scores `[batch, choices]`: softmax cross-entropy over the choices."""
        return classification_loss(outputs, batch)

    def keep(self, outputs, batch):
        return {"logits": outputs.astype(jnp.float32), "example_index": batch["example_index"],
                "example_weights": batch["example_weights"]}

    # --- host side ---------------------------------------------------------------------

    def _ordered_logits(self, kept) -> np.ndarray:
        order = np.argsort(kept["example_index"], kind="stable")
        return np.asarray(kept["logits"])[order]

    def score(self, eval_set: EvalSet, kept) -> dict[str, float]:
        if not eval_set.labeled:
            return {}
        logits = self._ordered_logits(kept)
        if len(logits) != len(eval_set.examples):
            raise ValueError(f"{eval_set.name}: {len(logits)} predictions for "
                             f"{len(eval_set.examples)} examples")
        gold = np.array([e.label for e in eval_set.examples])
        return metrics.compute(("accuracy",), gold, np.argmax(logits, -1))

    def write_predictions(self, eval_set: EvalSet, kept, out_dir: str) -> list[str]:
        logits = self._ordered_logits(kept)
        probs = softmax(logits.astype(np.float64))
        preds = np.argmax(logits, -1)  # as evaluate scores them (probabilities may tie)
        path = paths.join(out_dir, f"choice_predictions-{eval_set.name}.tsv")
        with paths.write_atomic(path) as f:
            f.write("\t".join(["index", "prediction"]
                              + [f"prob_{j}" for j in range(probs.shape[1])]) + "\n")
            for ex, pred, p in zip(eval_set.examples, preds, probs):
                f.write("\t".join([ex.guid, str(int(pred))]
                                  + [f"{x:.6f}" for x in p]) + "\n")
        return [path]
