"""SQuAD v1.1 / v2.0 JSON (train-v1.1.json, dev-v2.0.json ...) or tfds `squad/v1.1|v2.0`
-> list[SquadExample], and the raw `data` list the official scorer reads."""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from bert_jax import paths
from bert_jax.tasks.readers import DataError, some, tfds_builder

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
    return some(out, source, "no questions",
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
