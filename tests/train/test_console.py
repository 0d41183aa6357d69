"""Lines and log records written while the progress bar is drawn land above it, never on
the end of its line (bert_jax/train/console.py). The terminal is one stream for stdout and
stderr, as on a console: a line that landed on the bar's line shows there as the text after
its last carriage return starting with the bar."""

from __future__ import annotations

import io
import logging
import sys

from bert_jax.tasks import pretraining
from bert_jax.train import console
from tests.train.common import memory_data, memory_eval_data, tiny_config


def _terminal(monkeypatch) -> io.StringIO:
    term = io.StringIO()
    monkeypatch.setattr(sys, "stdout", term)
    monkeypatch.setattr(sys, "stderr", term)
    return term


def _shown(term: io.StringIO, text: str) -> str:
    """What the terminal shows on the line that holds `text`: the part after the line's
    last carriage return."""
    line = next(x for x in term.getvalue().split("\n") if text in x)
    return line.split("\r")[-1]


def test_lines_and_log_records_go_above_the_bar(monkeypatch):
    term = _terminal(monkeypatch)
    root = logging.getLogger()
    handler = logging.StreamHandler(term)  # as absl's handler on the root logger
    root.addHandler(handler)
    try:
        bar = console.Bar(True, 0, 10, "pre-training")
        bar.update(3)
        console.say("compiled the train step in 4.4s")
        logging.getLogger("bert_jax.test").warning("a warning while the bar is up")
        bar.update(2)
        assert handler not in root.handlers  # wrapped while the bar is up
        bar.close()
        assert handler in root.handlers  # and put back after
    finally:
        root.removeHandler(handler)
    assert "3/10" in term.getvalue()  # the bar was drawn before the lines
    assert _shown(term, "compiled the train step") == "compiled the train step in 4.4s"
    assert _shown(term, "a warning while") == "a warning while the bar is up"


def test_a_plain_print_would_land_on_the_bar(monkeypatch):
    """The check above can fail: a print while the bar is up shows after the bar."""
    term = _terminal(monkeypatch)
    bar = console.Bar(True, 0, 10, "pre-training")
    bar.update(3)
    print("compiled the train step in 4.4s")
    bar.close()
    assert _shown(term, "compiled the train step").startswith("pre-training:")


def test_the_loops_lines_go_above_the_bar(monkeypatch, tmp_path):
    """A run with the bar: its compile line and a mid-run evaluation's line each start
    their own line on the terminal."""
    config = tiny_config(steps=4, train=dict(eval_every=2))
    config.train.tensorboard = False
    term = _terminal(monkeypatch)
    summary = pretraining.run(config, str(tmp_path), make_train_data=memory_data,
                              make_eval_data=memory_eval_data, progress=True)
    assert summary["step"] == 4
    assert "2/4" in term.getvalue()
    assert _shown(term, "compiled the train step").startswith("compiled the train step in ")
    assert _shown(term, "step 2: eval/").startswith("step 2: eval/")
