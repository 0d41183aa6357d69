"""GLUE as distributed (CoLA.../train.tsv, dev.tsv, test.tsv, MNLI's dev_matched.tsv ...)
or tfds `glue/<task>` -> list[PairExample]. Label strings stay strings; the task maps
them to ids."""

from __future__ import annotations

import csv
import dataclasses
import os
import sys
from typing import Optional

from bert_jax import paths
from bert_jax.tasks.classification import PairExample
from bert_jax.tasks.readers import DataError, some, tfds_builder

@dataclasses.dataclass(frozen=True)
class GlueFormat:
    """Where a GLUE task's fields live. Columns are header names, or ints for CoLA's
    header-less train/dev files. test_* describe the unlabeled test.tsv."""

    dir_name: str
    text_a: str | int
    text_b: Optional[str | int]
    label: str | int
    header: bool = True
    test_text_a: str | int = ""
    test_text_b: Optional[str | int] = None
    tfds_text: tuple[str, Optional[str]] = ("sentence1", "sentence2")


GLUE_FORMATS = {
    "cola": GlueFormat("CoLA", 3, None, 1, header=False, test_text_a="sentence",
                       tfds_text=("sentence", None)),
    "sst2": GlueFormat("SST-2", "sentence", None, "label", test_text_a="sentence",
                       tfds_text=("sentence", None)),
    "mrpc": GlueFormat("MRPC", "#1 String", "#2 String", "Quality", test_text_a="#1 String",
                       test_text_b="#2 String"),
    "stsb": GlueFormat("STS-B", "sentence1", "sentence2", "score", test_text_a="sentence1",
                       test_text_b="sentence2"),
    "qqp": GlueFormat("QQP", "question1", "question2", "is_duplicate", test_text_a="question1",
                      test_text_b="question2", tfds_text=("question1", "question2")),
    "mnli": GlueFormat("MNLI", "sentence1", "sentence2", "gold_label", test_text_a="sentence1",
                       test_text_b="sentence2", tfds_text=("premise", "hypothesis")),
    "qnli": GlueFormat("QNLI", "question", "sentence", "label", test_text_a="question",
                       test_text_b="sentence", tfds_text=("question", "sentence")),
    "rte": GlueFormat("RTE", "sentence1", "sentence2", "label", test_text_a="sentence1",
                      test_text_b="sentence2"),
    "wnli": GlueFormat("WNLI", "sentence1", "sentence2", "label", test_text_a="sentence1",
                       test_text_b="sentence2"),
    "ax": GlueFormat("diagnostic", "sentence1", "sentence2", "label", test_text_a="sentence1",
                     test_text_b="sentence2", tfds_text=("premise", "hypothesis")),
    # Your own sentence(-pair) task: a header with sentence1, sentence2 (optional), label.
    "tsv": GlueFormat("tsv", "sentence1", "sentence2", "label", test_text_a="sentence1",
                      test_text_b="sentence2"),
}

# split name -> file name in the distributed GLUE directories (MNLI has two dev/test sets).
GLUE_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv",
              "dev_matched": "dev_matched.tsv", "dev_mismatched": "dev_mismatched.tsv",
              "test_matched": "test_matched.tsv", "test_mismatched": "test_mismatched.tsv"}
# our split name -> tfds split name
TFDS_GLUE_SPLITS = {"train": "train", "dev": "validation", "test": "test",
                    "dev_matched": "validation_matched",
                    "dev_mismatched": "validation_mismatched",
                    "test_matched": "test_matched", "test_mismatched": "test_mismatched"}


def _read_tsv(path: str) -> list[list[str]]:
    if not paths.is_file(path):
        raise FileNotFoundError(f"GLUE file not found: {path}")
    # GLUE TSVs are unquoted (quote characters occur inside sentences): QUOTE_NONE.
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with paths.open_text(path, newline="") as f:
        return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def read_glue_tsv(path: str, task: str, labeled: bool = True) -> list[PairExample]:
    """Examples of a GLUE TSV as distributed. labeled=False for test.tsv (no label column;
    guid from its `index`/`id` column, the id the submission file needs)."""
    fmt = GLUE_FORMATS[task]
    rows = _read_tsv(path)
    has_header = fmt.header or not labeled  # CoLA's test.tsv does have a header
    header = rows[0] if has_header and rows else None
    body = rows[1:] if has_header else rows
    if has_header and not rows:
        raise DataError(f"{path}: empty file, expected a header line")

    def col(name, optional=False):
        if name is None:
            return None
        if isinstance(name, int):
            return name
        if optional and name not in header:
            return None
        if name not in header:
            raise DataError(f"{path}: line 1: no column {name!r} in the header {header} "
                            f"(expected the GLUE {fmt.dir_name} format)")
        return header.index(name)

    b_optional = task == "tsv"  # a single-sentence task of your own has no sentence2
    if labeled:
        ia, ib, il = col(fmt.text_a), col(fmt.text_b, b_optional), col(fmt.label)
        id_col = None
    else:
        ia, ib, il = col(fmt.test_text_a), col(fmt.test_text_b, b_optional), None
        id_col = next((header.index(c) for c in ("index", "id") if c in header), None)
    need = max(i for i in (ia, ib, il, id_col) if i is not None)
    out = []
    for n, row in enumerate(body):
        line = n + (2 if has_header else 1)
        if not any(row):
            continue
        if len(row) <= need:
            raise DataError(f"{path}: line {line}: {len(row)} columns, expected at least "
                            f"{need + 1} (GLUE {fmt.dir_name} format)")
        guid = row[id_col] if id_col is not None else str(n)
        label = row[il] if il is not None else None
        if label is not None and not label:
            raise DataError(f"{path}: line {line}: empty label")
        out.append(PairExample(guid, row[ia], row[ib] if ib is not None else None, label))
    return some(out, path, "no examples (" + ("only a header line" if header is not None
                                               else "empty or blank file") + ")",
                 f"one example per line in the GLUE {fmt.dir_name} format")


def read_glue(task: str, split: str, data_dir: Optional[str] = None,
              tfds_data_dir: Optional[str] = None) -> list[PairExample]:
    """From `data_dir` (the task's directory of TSVs) when given, else tfds `glue/<task>`."""
    if split not in GLUE_FILES:
        raise ValueError(f"unknown GLUE split {split!r}; expected one of {sorted(GLUE_FILES)}")
    labeled = not split.startswith("test")
    if data_dir:
        name = "diagnostic.tsv" if task == "ax" else GLUE_FILES[split]
        return read_glue_tsv(os.path.join(data_dir, name), task, labeled=labeled)
    return _read_glue_tfds(task, split, tfds_data_dir, labeled)


_TFDS_LABEL_BY_NAME = ("mnli", "qnli", "rte", "ax")


def _glue_remedy(task: str) -> str:
    folder = GLUE_FORMATS[task].dir_name
    return (f"download the GLUE data (https://gluebenchmark.com/tasks) and pass "
            f"--config.task.data_dir=glue_data/{folder} (its .tsv files), or "
            f"--config.task.tfds_data_dir=DIR holding a prepared tfds glue/{task}")


def _read_glue_tfds(task, split, tfds_data_dir, labeled) -> list[PairExample]:
    import tensorflow_datasets as tfds

    fmt = GLUE_FORMATS[task]
    tfds_name = {"sst2": "sst2", "stsb": "stsb"}.get(task, task)
    builder = tfds_builder(f"glue/{tfds_name}", tfds_data_dir, _glue_remedy(task))
    label_feature = builder.info.features["label"]
    ds = builder.as_dataset(split=TFDS_GLUE_SPLITS[split])
    a, b = fmt.tfds_text
    out = []
    for ex in tfds.as_numpy(ds):
        label = None
        if labeled:
            value = ex["label"]
            if task == "stsb":
                label = f"{float(value):g}"
            elif task in _TFDS_LABEL_BY_NAME:
                # tfds orders MNLI's labels differently from the TSVs: go through the names.
                label = label_feature.int2str(int(value))
            else:
                # Binary tasks: tfds ids are the TSVs' 0/1 (its names are only descriptive).
                label = str(int(value))
        out.append(PairExample(str(int(ex["idx"])), ex[a].decode("utf-8"),
                               ex[b].decode("utf-8") if b else None, label))
    return out
