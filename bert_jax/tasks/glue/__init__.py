"""GLUE (and any sentence / pair TSV task): labels, eval sets, metrics, submission files.

    task = GlueTask("mrpc", data_dir="glue_data/MRPC", max_seq_length=128)
    task = GlueTask("tsv", data_dir="my_pairs", labels=("0", "1"))   # your own pair task

Data come from the task's directory of TSVs as distributed (train.tsv, dev.tsv, test.tsv;
MNLI: dev_matched / dev_mismatched / test_matched / test_mismatched) or, with no data_dir,
from tensorflow-datasets `glue/<task>`. "tsv" is a generic format: a header with sentence1,
(sentence2,) label columns, test.tsv with index + sentences.

Test-set predictions are written in the GLUE submission format, `<Name>.tsv` (`index<TAB>
prediction`, labels as strings; STS-B's score clipped to [0, 5]; MNLI also predicts AX.tsv).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np

from bert_jax import paths
from bert_jax.tasks.inputs import cache_key, cached_features, check_features
from bert_jax.models.bert import BertForSequenceClassification
from bert_jax.models.config import ConfigError
from bert_jax.tasks import classification, metrics
from bert_jax.tasks.base import EvalSet, FinetuneTask
from bert_jax.tasks.glue import reader as readers


@dataclasses.dataclass(frozen=True)
class GlueSpec:
    labels: Optional[tuple[str, ...]]          # None = regression
    dev_splits: tuple[str, ...] = ("dev",)
    test_splits: tuple[str, ...] = ("test",)
    submission: tuple[str, ...] = ()           # submission file stem per test split


BINARY = ("0", "1")
NLI = ("entailment", "not_entailment")
GLUE_TASKS = {
    "cola": GlueSpec(BINARY, submission=("CoLA",)),
    "sst2": GlueSpec(BINARY, submission=("SST-2",)),
    "mrpc": GlueSpec(BINARY, submission=("MRPC",)),
    "stsb": GlueSpec(None, submission=("STS-B",)),
    "qqp": GlueSpec(BINARY, submission=("QQP",)),
    "mnli": GlueSpec(("contradiction", "entailment", "neutral"),
                     dev_splits=("dev_matched", "dev_mismatched"),
                     test_splits=("test_matched", "test_mismatched"),
                     submission=("MNLI-m", "MNLI-mm")),
    "qnli": GlueSpec(NLI, submission=("QNLI",)),
    "rte": GlueSpec(NLI, submission=("RTE",)),
    "wnli": GlueSpec(BINARY, submission=("WNLI",)),
    "tsv": GlueSpec(BINARY, submission=("predictions",)),
}


class GlueTask(FinetuneTask):
    """One GLUE task (or "tsv"). eval_test=True adds the unlabeled test split(s) to eval_sets
    (predictions written, not scored)."""

    def __init__(self, name: str, data_dir: str = "", max_seq_length: int = 128,
                 labels: Optional[Sequence[str]] = None, regression: bool = False,
                 single_sentence: bool = False, tfds_data_dir: Optional[str] = None,
                 cache_dir: str = "", eval_test: bool = False, vocab_file: str = "",
                 dev_split: str = ""):
        if name not in GLUE_TASKS:
            raise ConfigError(f"unknown GLUE task {name!r}; expected one of {sorted(GLUE_TASKS)}")
        if name == "tsv" and not data_dir:
            raise ConfigError("task 'tsv' reads your own TSV files: set task.data_dir")
        self.name = name
        self.spec = GLUE_TASKS[name]
        if name == "tsv" and regression:
            self.labels = None
        else:
            self.labels = tuple(labels) if labels else self.spec.labels
        self.data_dir, self.tfds_data_dir = data_dir, tfds_data_dir
        self.max_seq_length = max_seq_length
        self.single_sentence = single_sentence
        self.cache_dir, self.eval_test, self.vocab_file = cache_dir, eval_test, vocab_file
        self.dev_splits = (dev_split,) if dev_split else self.spec.dev_splits
        self.metric_names = (metrics.GLUE_METRICS[name] if name in metrics.GLUE_METRICS
                             else ("pearson", "spearman") if self.labels is None
                             else ("accuracy", "f1") if len(self.labels) == 2 else ("accuracy",))
        self.main_metric = "score"

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    def head(self, bert_config):
        return BertForSequenceClassification(bert_config, self.num_labels)

    # --- data ------------------------------------------------------------------------

    def read(self, split: str):
        examples = readers.read_glue("tsv" if self.name == "tsv" else self.name, split,
                                     self.data_dir or None, self.tfds_data_dir)
        if self.single_sentence:
            examples = [dataclasses.replace(e, text_b=None) for e in examples]
        return examples

    def _features(self, split: str, examples, tokenizer):
        source = os.path.join(self.data_dir, readers.GLUE_FILES[split]) if self.data_dir \
            else f"tfds glue/{self.name}:{split}"
        key = cache_key(source=source, vocab=self.vocab_file, labels=self.labels,
                        max_seq_length=self.max_seq_length, single=self.single_sentence,
                        n=len(examples))
        return check_features(cached_features(
            self.cache_dir, f"glue-{self.name}-{split}", key,
            lambda: classification.convert_examples(
                examples, tokenizer, self.max_seq_length, self.labels, source)),
            tokenizer, source)

    def eval_sets(self, tokenizer) -> list[EvalSet]:
        sets = []
        splits = list(self.dev_splits) + (list(self.spec.test_splits) if self.eval_test else [])
        for split in splits:
            examples = self.read(split)
            labeled = not split.startswith("test")
            sets.append(EvalSet(split, self._features(split, examples, tokenizer), examples,
                                labeled))
        if self.name == "mnli" and self.eval_test:
            ax = self._read_ax()
            if ax is not None:
                sets.append(EvalSet("test_ax", classification.convert_examples(
                    ax, tokenizer, self.max_seq_length, self.labels, "diagnostic"), ax, False))
        return sets

    def _read_ax(self):
        """GLUE's diagnostic set (AX.tsv in a submission), predicted by the MNLI model:
        glue_data/diagnostic/diagnostic.tsv beside the MNLI directory, or tfds glue/ax."""
        if self.data_dir:
            ax_dir = os.path.join(os.path.dirname(paths.resolve(self.data_dir)), "diagnostic")
            if not paths.is_file(os.path.join(ax_dir, "diagnostic.tsv")):
                return None
            return readers.read_glue("ax", "test", ax_dir)
        return readers.read_glue("ax", "test", None, self.tfds_data_dir)

    # --- step side (jnp) -------------------------------------------------------------

    def objective(self, outputs, batch):
        return classification.classification_loss(outputs, batch)

    def keep(self, outputs, batch):
        return {"logits": outputs.astype(jnp.float32), "example_index": batch["example_index"],
                "example_weights": batch["example_weights"]}

    # --- host side ---------------------------------------------------------------------

    def predictions(self, kept) -> np.ndarray:
        order = np.argsort(kept["example_index"], kind="stable")
        return classification.predictions_from_logits(kept["logits"][order])

    def score(self, eval_set: EvalSet, kept) -> dict[str, float]:
        if not eval_set.labeled:
            return {}
        preds = self.predictions(kept)
        if len(preds) != len(eval_set.examples):
            raise ValueError(f"{eval_set.name}: {len(preds)} predictions for "
                             f"{len(eval_set.examples)} examples")
        gold = eval_set.features["label_ids"][np.argsort(eval_set.features["example_index"])]
        out = metrics.compute(self.metric_names, gold, preds)
        out["score"] = float(np.mean(list(out.values())))
        return out

    def write_predictions(self, eval_set: EvalSet, kept, out_dir: str) -> list[str]:
        """Test split -> the GLUE submission file; dev split -> dev_predictions-<split>.tsv
        (same format) for error analysis."""
        preds = self.predictions(kept)
        if eval_set.name == "test_ax":
            stem = "AX"
        elif eval_set.name.startswith("test"):
            stem = self.spec.submission[self.spec.test_splits.index(eval_set.name)]
        else:
            stem = f"dev_predictions-{eval_set.name}"
        path = paths.join(out_dir, f"{stem}.tsv")
        write_submission(path, [e.guid for e in eval_set.examples], preds, self.labels,
                         clip=(0.0, 5.0) if self.name == "stsb" else None)
        return [path]


def write_submission(path: str, guids: Sequence[str], preds: np.ndarray,
                     labels: Optional[Sequence[str]], clip=None) -> None:
    """`index<TAB>prediction` lines as the GLUE server reads them (temp file + rename).
    labels None = regression values (clipped to `clip`, STS-B's [0, 5])."""
    if len(guids) != len(preds):
        raise ValueError(f"{path}: {len(preds)} predictions for {len(guids)} examples")
    with paths.write_atomic(path) as f:
        f.write("index\tprediction\n")
        for guid, p in zip(guids, preds):
            if labels is None:
                value = f"{float(np.clip(p, *clip) if clip else p):.3f}"
            else:
                value = labels[int(p)]
            f.write(f"{guid}\t{value}\n")
