"""Degenerate fine-tuning files, through the entry points that read them (a task's
train_features for the training split, eval_sets for the dev split, and finetune.run):
empty or header-only files, records or questions missing a field, and text that the
vocabulary turns mostly into [UNK]. Each is one DataError / VocabError line naming the file
(and the line or question) and what was expected, before any compile; a vocabulary that
misses part of the text is a warning with the fraction."""

from __future__ import annotations

import json
import logging

import pytest

from bert_jax.tasks.readers import DataError
from bert_jax.tokenization import VocabError, load_tokenizer
from bert_jax.errors import UserError
from tests.tasks.conftest import VOCAB

MRPC = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
SWAG = (",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,"
        "ending3,label\n")


def _squad(qa: dict, **article) -> str:
    return json.dumps({"data": [{"paragraphs": [{"context": "The cat sat on the mat.",
                                                 "qas": [qa]}], **article}]})


# case: (task, file content, the message after "<file>: ")
CASES = {
    "glue_empty": ("mrpc", "", "empty file, expected a header line"),
    "glue_header_only": ("mrpc", MRPC, "no examples (only a header line); expected one "
                                       "example per line in the GLUE MRPC format"),
    "glue_header_and_blank_lines": ("mrpc", MRPC + "\n\n", "no examples (only a header "
                                                           "line)"),
    "glue_row_missing_a_column": ("mrpc", MRPC + "1\t1\t2\tonly one sentence\n",
                                  "line 2: 4 columns, expected at least 5 (GLUE MRPC format)"),
    "cola_empty": ("cola", "", "no examples (empty or blank file); expected one example per "
                               "line in the GLUE CoLA format"),
    "squad_no_questions": ("squad", json.dumps({"data": []}),
                           "no questions; expected data[].paragraphs[].qas[] with 'id', "
                           "'question' and 'answers' (SQuAD format)"),
    "squad_article_without_paragraphs": ("squad", json.dumps({"data": [{"title": "x"}]}),
                                         "data[0]: expected an object with a 'paragraphs' "
                                         "list (SQuAD format)"),
    "squad_answer_without_text": ("squad", _squad({"id": "q1", "question": "Who sat?",
                                                   "answers": [{"answer_start": 4}]}),
                                  "data[0].paragraphs[0]: question q1: answers[0] = "
                                  "{'answer_start': 4}: expected 'text' and an integer "
                                  "'answer_start'"),
    "conll_empty": ("ner", "", "no sentences (empty, or only -DOCSTART- lines); expected "
                               "'word ... tag' lines"),
    "conll_only_docstart": ("ner", "-DOCSTART- -X- -X- O\n\n", "no sentences"),
    "conll_word_without_tag": ("ner", "EU B-ORG\nrejects\n",
                               "line 2: expected 'word ... tag' columns, got 'rejects'"),
    "swag_header_only": ("swag", SWAG, "no questions (only a header line); expected one "
                                       "question per line under the header (SWAG format)"),
    "swag_row_missing_a_column": ("swag", SWAG + "0,v,1,x,a,b,gold,e0,e1\n",
                                  "line 2: 9 columns, expected 12 as in the header"),
    "jsonl_empty": ("jsonl", "\n", "no questions (empty or blank file); expected one JSON "
                                   "object per line"),
    "jsonl_question_without_endings": ("jsonl", json.dumps({"context": "c", "label": 0}),
                                       "line 1: 'endings' must be a list of at least 2 "
                                       "strings, got None"),
}


def _task(kind: str, tmp_path, train: str, dev: str):
    """The task of `kind` reading `train` and `dev` (contents) from files in tmp_path;
    returns (task, {split: path})."""
    from bert_jax.tasks.choice import ChoiceTask
    from bert_jax.tasks.glue import GlueTask
    from bert_jax.tasks.ner import NerTask
    from bert_jax.tasks.squad import SquadTask

    ext = {"mrpc": "tsv", "cola": "tsv", "squad": "json", "ner": "txt", "swag": "csv",
           "jsonl": "jsonl"}[kind]
    files = {}
    for split, text in (("train", train), ("dev", dev)):
        files[split] = tmp_path / f"{split}.{ext}"
        files[split].write_text(text, encoding="utf-8")
    t, d = str(files["train"]), str(files["dev"])
    if kind in ("mrpc", "cola"):
        return GlueTask(kind, data_dir=str(tmp_path)), files
    if kind == "squad":
        return SquadTask("1.1", t, d, max_seq_length=64, doc_stride=32,
                         max_query_length=16), files
    if kind == "ner":
        return NerTask(t, d), files
    return ChoiceTask(kind, train_file=t, dev_file=d), files


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(vocab_file=str(VOCAB))


GOOD = {"mrpc": MRPC + "1\t1\t2\tA cat sat.\tA cat was sitting.\n",
        "cola": "src\t1\t\tThe cat sat.\n",
        "squad": _squad({"id": "q1", "question": "Who sat?",
                         "answers": [{"text": "The cat", "answer_start": 0}]}),
        "ner": "EU B-ORG\nrejects O\n",
        "swag": SWAG + "0,v,1,x,A man sits.,He,eats.,runs.,sleeps.,sings.,2\n",
        "jsonl": json.dumps({"context": "A man sits.", "endings": ["eats.", "runs."],
                             "label": 1}) + "\n"}


@pytest.mark.parametrize("split", ["train", "dev"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_degenerate_file_is_one_line_naming_file_and_expectation(case, split, tmp_path,
                                                                 tokenizer):
    kind, text, expected = CASES[case]
    task, files = _task(kind, tmp_path, train=text if split == "train" else GOOD[kind],
                        dev=text if split == "dev" else GOOD[kind])
    with pytest.raises(DataError) as e:
        if split == "train":
            task.train_features(tokenizer)
        else:
            task.eval_sets(tokenizer)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg.startswith(f"{files[split]}: {expected}"), msg


def test_squad_training_question_without_an_answer(tmp_path, tokenizer):
    """It trained as 'no answer here'; a dev question without answers stays allowed (a
    file to predict)."""
    unanswered = _squad({"id": "q7", "question": "Who sat?"})
    task, files = _task("squad", tmp_path, train=unanswered, dev=unanswered)
    with pytest.raises(DataError, match=rf"^{files['train']}: 1 training question\(s\) "
                                        rf"without 'answers' and not marked is_impossible "
                                        rf"\(first: q7\)"):
        task.train_features(tokenizer)
    (dev,) = task.eval_sets(tokenizer)
    assert not dev.labeled and len(dev.examples) == 1


def test_squad_training_set_without_a_usable_answer(tmp_path, tokenizer):
    """Every answer is whitespace (no token to point at): convert_examples skips them all;
    the features are refused naming the file, not trained on as an empty set."""
    blank_answer = json.dumps({"data": [{"paragraphs": [{"context": "cat  sat", "qas": [
        {"id": "q1", "question": "Who?", "answers": [{"text": " ", "answer_start": 3}]}]}]}]})
    task, files = _task("squad", tmp_path, train=blank_answer, dev=GOOD["squad"])
    with pytest.raises(DataError, match=rf"^{files['train']}: no features from its examples "
                                        rf"\(every one was skipped\)"):
        task.train_features(tokenizer)


CHINESE = "这是一个用于测试词汇表的中文句子。"   # 65% [UNK] with the uncased vocabulary
UNK_FILES = {
    "mrpc": MRPC + "".join(f"1\t{i}\t{i}\t{CHINESE}\t{CHINESE}\n" for i in range(3)),
    "squad": _squad({"id": "q1", "question": CHINESE, "answers": [{"text": "The cat",
                                                                   "answer_start": 0}]})
    .replace("The cat sat on the mat.", "The cat " + CHINESE * 3),
    "ner": "".join(f"{c} O\n" for c in CHINESE[:8]),
    "jsonl": json.dumps({"context": CHINESE, "endings": [CHINESE, CHINESE], "label": 0}),
}


@pytest.mark.parametrize("kind", sorted(UNK_FILES))
def test_most_text_unknown_to_the_vocabulary_is_an_error(kind, tmp_path, tokenizer):
    task, files = _task(kind, tmp_path, train=UNK_FILES[kind], dev=GOOD[kind])
    with pytest.raises(VocabError) as e:
        task.train_features(tokenizer)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg.startswith(f"{files['train']}: ") and "% of " in msg
    assert f"are [UNK] with the vocabulary {VOCAB} (do_lower_case=True), expected under 5%" \
        in msg, msg
    assert float(msg.split(": ", 1)[1].split("%")[0]) > 50


def test_a_casing_mismatch_is_a_warning_with_the_fraction(tmp_path, caplog):
    """Cased text through the uncased vocabulary, not lower-cased: each row has 12 word
    pieces, and its 5 capitalised words (The, Sat, Mat, A, Was) are [UNK]: 15 of 36."""
    rows = "".join(f"1\t{i}\t{i}\tThe cat Sat on the Mat.\tA dog Was here.\n" for i in range(3))
    task, files = _task("mrpc", tmp_path, train=MRPC + rows, dev=MRPC + rows)
    caplog.set_level(logging.WARNING)
    features = task.train_features(load_tokenizer(vocab_file=str(VOCAB), do_lower_case=False))
    assert len(features["input_ids"]) == 3
    (warning,) = [r.getMessage() for r in caplog.records if "[UNK]" in r.getMessage()]
    assert warning.startswith(f"{files['train']}: 41.7% of 36 word pieces are [UNK] with the "
                              f"vocabulary {VOCAB} (do_lower_case=False)"), warning
    caplog.clear()
    task.train_features(load_tokenizer(vocab_file=str(VOCAB), do_lower_case=True))
    assert not [r for r in caplog.records if "[UNK]" in r.getMessage()]


def test_finetune_run_refuses_a_header_only_train_file_before_any_compile(tmp_path,
                                                                          monkeypatch):
    """The entry point launch/train.py calls for a fine-tuning config."""
    from bert_jax.tasks import finetune
    from bert_jax.train import loop
    from tests.tasks.finetune_common import tiny_pairs_config

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.tsv").write_text("sentence1\tsentence2\tlabel\n")
    (tmp_path / "data" / "dev.tsv").write_text("sentence1\tsentence2\tlabel\na\tb\t0\n")
    config = tiny_pairs_config()
    config.task.data_dir = str(tmp_path / "data")

    def compiled(*a, **k):
        raise AssertionError("the model and steps were built before the data were read")
    monkeypatch.setattr(loop, "build", compiled)
    with pytest.raises(DataError, match=rf"^{tmp_path}/data/train.tsv: no examples \(only a "
                                        rf"header line\); expected one example per line in "
                                        rf"the GLUE tsv format$"):
        finetune.run(config, str(tmp_path / "run"), progress=False)
