"""Readers of fine-tuning data in its original formats, and from tensorflow-datasets.

    GLUE       the TSVs as distributed (CoLA.../train.tsv, dev.tsv, test.tsv, MNLI's
               dev_matched.tsv ...) or tfds `glue/<task>`      -> list[PairExample]
    SQuAD      train-v1.1.json / dev-v2.0.json ... or tfds `squad/v1.1|v2.0`
                                                                -> list[SquadExample]
    CoNLL      column files (word ... tag per line, blank line between sentences,
               -DOCSTART- lines skipped) or tfds `conll2003`    -> list[NerExample]
    SWAG       train.csv / val.csv / test.csv as distributed (rowanz/swagaf)
    HellaSwag  hellaswag_{train,val,test}.jsonl or tfds `hellaswag`; the same JSON lines
               with your own questions                          -> list[ChoiceExample]

Every reader raises early, naming the file and line (or tfds split) and what was expected.
Label strings are kept as strings here; tasks map them to ids.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import sys
from typing import Optional, Sequence

from bert_jax import paths
from bert_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class PairExample:
    """One sentence (text_b None) or sentence-pair example. label: class name, a float string
    (regression), or None (unlabeled test set). guid: the id used in submission files."""

    guid: str
    text_a: str
    text_b: Optional[str]
    label: Optional[str]


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """answers: every gold answer [(text, char start in context)]; empty + is_impossible for
    v2 unanswerable questions; empty and not impossible for an unlabeled (test) question."""

    qid: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool = False
    title: str = ""


@dataclasses.dataclass(frozen=True)
class NerExample:
    guid: str
    words: tuple[str, ...]
    tags: tuple[str, ...]


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


class DataError(UserError, ValueError):
    """Input data that does not have the expected format; the message names the place."""


def _some(examples: list, path: str, none: str, expected: str) -> list:
    """`examples`, or a DataError naming `path` when there are none: an empty file or one
    with only a header reads as "no examples", never as an empty (then silent) set."""
    if not examples:
        raise DataError(f"{path}: {none}; expected {expected}")
    return examples


# --- GLUE ------------------------------------------------------------------------------

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
    return _some(out, path, "no examples (" + ("only a header line" if header is not None
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


def tfds_builder(name: str, data_dir: Optional[str], remedy: str):
    """tfds.builder(name), its data downloaded and prepared first when it is not there yet
    (as tfds.load does); a failed download is a DataError naming `remedy` (where to get
    the files and which flag to set), not tfds' own advice."""
    import tensorflow_datasets as tfds

    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        try:
            builder.download_and_prepare()
        except Exception as e:  # noqa: BLE001  no network, no access, a missing extra, ...
            why = " ".join(str(e).split())[:200]
            raise DataError(f"tfds {name} is not in {builder.data_dir} and downloading it "
                            f"failed ({type(e).__name__}: {why}); {remedy}") from e
    return builder


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


# --- SQuAD -----------------------------------------------------------------------------

def squad_examples_from_json(data: Sequence[dict], source: str) -> list[SquadExample]:
    out = []
    for a, article in enumerate(data):
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise DataError(f"{source}: data[{a}]: expected an object with a 'paragraphs' "
                            f"list (SQuAD format)")
        for p, paragraph in enumerate(article["paragraphs"]):
            where = f"{source}: data[{a}].paragraphs[{p}]"
            if ("context" not in paragraph or "qas" not in paragraph
                    or not isinstance(paragraph["qas"], list)):
                raise DataError(f"{where}: expected keys 'context' and 'qas' (a list)")
            context = paragraph["context"]
            for q, qa in enumerate(paragraph["qas"]):
                if "id" not in qa or "question" not in qa:
                    raise DataError(f"{where}.qas[{q}]: a question lacks 'id' or 'question'")
                answers = []
                for n, ans in enumerate(qa.get("answers", [])):
                    try:
                        text, start = ans["text"], int(ans["answer_start"])
                    except (KeyError, TypeError, ValueError):
                        raise DataError(
                            f"{where}: question {qa['id']}: answers[{n}] = {ans!r}: expected "
                            f"'text' and an integer 'answer_start'") from None
                    if context[start:start + len(text)] != text:
                        raise DataError(
                            f"{where}: question {qa['id']}: answer {text!r} is not at "
                            f"context[{start}:{start + len(text)}] "
                            f"({context[start:start + len(text)]!r})")
                    answers.append((text, start))
                out.append(SquadExample(qa["id"], qa["question"], context, tuple(answers),
                                        bool(qa.get("is_impossible", False)),
                                        article.get("title", "")))
    return _some(out, source, "no questions",
                 "data[].paragraphs[].qas[] with 'id', 'question' and 'answers' (SQuAD format)")


def read_squad_json(path: str) -> tuple[list[SquadExample], list[dict]]:
    """(examples, the raw `data` list: what the official scorer reads)."""
    if not paths.is_file(path):
        raise FileNotFoundError(f"SQuAD file not found: {path}")
    with paths.open_text(path) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise DataError(f"{path}: expected a JSON object with a 'data' list (SQuAD format)")
    return squad_examples_from_json(doc["data"], path), doc["data"]


def read_squad_tfds(version: str, split: str, tfds_data_dir=None) -> tuple[list, list]:
    import tensorflow_datasets as tfds

    builder = tfds_builder(
        f"squad/v{version}", tfds_data_dir,
        f"download train-v{version}.json and dev-v{version}.json "
        f"(https://rajpurkar.github.io/SQuAD-explorer/) and pass --config.task.train_file and "
        f"--config.task.predict_file, or --config.task.tfds_data_dir=DIR holding a prepared "
        f"tfds squad/v{version}")
    ds = builder.as_dataset(split={"train": "train", "dev": "validation"}[split])
    data = []
    for ex in tfds.as_numpy(ds):
        texts = [t.decode("utf-8") for t in ex["answers"]["text"]]
        starts = [int(s) for s in ex["answers"]["answer_start"]]
        qa = {"id": ex["id"].decode("utf-8"), "question": ex["question"].decode("utf-8"),
              "answers": [{"text": t, "answer_start": s} for t, s in zip(texts, starts)],
              "is_impossible": bool(ex.get("is_impossible", not texts))}
        data.append({"title": ex["title"].decode("utf-8"), "paragraphs": [
            {"context": ex["context"].decode("utf-8"), "qas": [qa]}]})
    return squad_examples_from_json(data, f"tfds squad/v{version}:{split}"), data


def squad_dataset_of(examples: Sequence[SquadExample]) -> list[dict]:
    """The minimal SQuAD `data` structure of examples (for the official-semantics scorer)."""
    return [{"title": "", "paragraphs": [{"context": "", "qas": [
        {"id": e.qid, "answers": [{"text": t, "answer_start": s} for t, s in e.answers]}
        for e in examples]}]}]


# --- CoNLL -----------------------------------------------------------------------------

def read_conll(path: str, tag_column: int = -1) -> list[NerExample]:
    """CoNLL-2003 style column file: `word [POS chunk] TAG` per line (space or tab
    separated), blank lines between sentences, `-DOCSTART-` lines ignored."""
    if not paths.is_file(path):
        raise FileNotFoundError(f"CoNLL file not found: {path}")
    out, words, tags = [], [], []

    def flush():
        if words:
            out.append(NerExample(f"{len(out)}", tuple(words), tuple(tags)))
            words.clear()
            tags.clear()

    with paths.open_text(path) as f:
        for n, line in enumerate(f, 1):
            cols = line.split()
            if not cols:
                flush()
                continue
            if cols[0] == "-DOCSTART-":
                flush()
                continue
            if len(cols) < 2:
                raise DataError(f"{path}: line {n}: expected 'word ... tag' columns, got "
                                f"{line.rstrip()!r}")
            words.append(cols[0])
            tags.append(cols[tag_column])
    flush()
    return _some(out, path, "no sentences (empty, or only -DOCSTART- lines)",
                 "'word ... tag' lines, a blank line between sentences (CoNLL-2003 format)")


def read_conll_tfds(split: str, tfds_data_dir=None) -> list[NerExample]:
    import tensorflow_datasets as tfds

    builder = tfds_builder(
        "conll2003", tfds_data_dir,
        "pass the CoNLL-2003 files as --config.task.train_file=eng.train "
        "--config.task.dev_file=eng.testa (--config.task.test_file=eng.testb), or "
        "--config.task.tfds_data_dir=DIR holding a prepared tfds conll2003")
    names = builder.info.features["ner"].feature.names
    ds = builder.as_dataset(split={"train": "train", "dev": "dev", "test": "test"}[split])
    out = []
    for i, ex in enumerate(tfds.as_numpy(ds)):
        if len(ex["tokens"]) != len(ex["ner"]):
            raise DataError(f"tfds conll2003:{split}: example {i} has {len(ex['tokens'])} "
                            f"tokens but {len(ex['ner'])} tags")
        out.append(NerExample(str(i), tuple(w.decode("utf-8") for w in ex["tokens"]),
                              tuple(names[int(t)] for t in ex["ner"])))
    return out


# --- multiple choice (SWAG, HellaSwag, your own) -----------------------------------------

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
    return _some(out, path, "no questions (only a header line)",
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
    return _some(out, path, "no questions (empty or blank file)",
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
