"""Multiple choice: SWAG's CSVs as distributed (rowanz/swagaf: train.csv / val.csv /
test.csv), HellaSwag's .jsonl files or tfds `hellaswag`, and the same JSON lines with
your own questions -> list[ChoiceExample]."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
from typing import Optional

from bert_jax import paths
from bert_jax.tasks.readers import DataError, some, tfds_builder

@dataclasses.dataclass(frozen=True)
class ChoiceExample:
    """One multiple-choice question. Choice i is the pair (context, start + " " +
    endings[i]): start is the opening every ending continues (SWAG's sent2, HellaSwag's
    ctx_b; may be ""). label: index of the right ending, None when unlabelled (test)."""

    guid: str
    context: str
    start: str
    endings: tuple[str, ...]
    label: Optional[int]


def _check_label(label, n_endings: int, where: str) -> Optional[int]:
    if label is None or label == "":
        return None
    try:
        value = int(label)
    except (TypeError, ValueError):
        raise DataError(f"{where}: label {label!r} is not an ending index") from None
    if not 0 <= value < n_endings:
        raise DataError(f"{where}: label {value} is not an index of its {n_endings} endings")
    return value


def read_swag_csv(path: str, labeled: bool = True) -> list[ChoiceExample]:
    """SWAG as distributed (train.csv, val.csv, test.csv): a header naming sent1 (the
    context), sent2 (the start of the next sentence), ending0, ending1, ... and label.
    labeled=True requires a label on every row; labeled=False (a test file) reads labels
    only where a label column exists (SWAG's own test.csv has none). guid: the leading
    unnamed index column (pandas') when present, else the row's number from 0."""
    if not paths.is_file(path):
        raise FileNotFoundError(f"SWAG file not found: {path}")
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    with paths.open_text(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file, expected a header line")
        endings = sorted((c for c in header if c.startswith("ending") and c[6:].isdigit()),
                         key=lambda c: int(c[6:]))
        need = ["sent1", "sent2"] + (["label"] if labeled else [])
        missing = [c for c in need if c not in header]
        if missing or len(endings) < 2 or endings != [f"ending{i}" for i in range(len(endings))]:
            raise DataError(f"{path}: line 1: the header {header} lacks "
                            f"{missing or 'ending0, ending1, ...'} (expected SWAG's columns "
                            f"sent1, sent2, ending0..ending3" + (", label)" if labeled else ")"))
        col = {c: header.index(c) for c in ["sent1", "sent2"] + endings}
        label_col = header.index("label") if "label" in header else None
        id_col = header.index("") if "" in header else None
        out = []
        for row in reader:
            if not any(row):
                continue
            where = f"{path}: line {reader.line_num}"
            if len(row) != len(header):
                raise DataError(f"{where}: {len(row)} columns, expected {len(header)} as in "
                                f"the header")
            ends = tuple(row[col[c]] for c in endings)
            label = (_check_label(row[label_col], len(ends), where) if label_col is not None
                     else None)
            if labeled and label is None:
                raise DataError(f"{where}: empty label")
            guid = row[id_col] if id_col is not None else str(len(out))
            out.append(ChoiceExample(guid, row[col["sent1"]], row[col["sent2"]], ends, label))
    return some(out, path, "no questions (only a header line)",
                 "one question per line under the header (SWAG format)")


def read_choice_jsonl(path: str) -> list[ChoiceExample]:
    """One JSON object per line: HellaSwag's files ({"ctx_a", "ctx_b", "endings", "label",
    "ind"}: context ctx_a, start ctx_b) or your own ({"context", "endings", "label"}, with
    optional "start" and "id"). A missing label makes that question unlabelled."""
    if not paths.is_file(path):
        raise FileNotFoundError(f"multiple-choice file not found: {path}")
    out = []
    with paths.open_text(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}: line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            if "ctx_a" in obj:
                context, start = obj["ctx_a"], obj.get("ctx_b", "")
            elif "context" in obj:
                context, start = obj["context"], obj.get("start", "")
            else:
                raise DataError(f"{where}: no 'context' (or HellaSwag's 'ctx_a') key; "
                                f"keys: {sorted(obj)}")
            ends = obj.get("endings")
            if (not isinstance(ends, list) or len(ends) < 2
                    or not all(isinstance(e, str) for e in ends)):
                raise DataError(f"{where}: 'endings' must be a list of at least 2 strings, "
                                f"got {ends!r}")
            if not isinstance(context, str) or not isinstance(start, str):
                raise DataError(f"{where}: the context and start must be strings")
            guid = str(obj.get("id", obj.get("ind", len(out))))
            out.append(ChoiceExample(guid, context, start, tuple(ends),
                                     _check_label(obj.get("label"), len(ends), where)))
    return some(out, path, "no questions (empty or blank file)",
                 "one JSON object per line with 'context' (or 'ctx_a'), 'endings' and "
                 "'label'")


def read_hellaswag_tfds(split: str, tfds_data_dir=None) -> list[ChoiceExample]:
    """tfds `hellaswag` (train / validation / test; the test labels are hidden: -1). tfds
    keeps only the joined context (ctx), so the start is empty."""
    import tensorflow_datasets as tfds

    tfds_split = {"train": "train", "dev": "validation", "test": "test"}[split]
    ds = tfds_builder(
        "hellaswag", tfds_data_dir,
        "download hellaswag_train.jsonl and hellaswag_val.jsonl "
        "(https://github.com/rowanz/hellaswag/tree/master/data) and pass "
        "--config.task.train_file and --config.task.dev_file, or --config.task.tfds_data_dir="
        "DIR holding a prepared tfds hellaswag").as_dataset(split=tfds_split)
    out = []
    for i, ex in enumerate(tfds.as_numpy(ds)):
        ends = tuple(e.decode("utf-8") for e in ex["endings"])
        label = int(ex["label"])
        out.append(ChoiceExample(str(i), ex["context"].decode("utf-8"), "", ends,
                                 None if label < 0 else _check_label(
                                     label, len(ends), f"tfds hellaswag:{tfds_split}: "
                                     f"example {i}")))
    return out
