"""create_pretraining_data in process (`create(Options(...))`, what training from raw text
calls): the command line's work with its errors as exceptions, the same bytes and summary as
the command line (`python -m data_prep.create_pretraining_data`), and no absl flags defined
by importing it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bert_jax.errors import UserError
from bert_jax.tokenization import VocabError
from data_prep import SAMPLE_CORPUS, SAMPLE_VOCAB
from data_prep import create_pretraining_data as cpd
from data_prep.paths import InputError
from tests.data_prep.helpers import REPO, SAMPLE, VOCAB

# Summary lines that measure time, not the data.
_TIMED = ("seconds", "instances/s", "input MB/s")


def _data_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith(_TIMED)]


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_the_package_data_is_the_sample_corpus_and_vocabulary():
    assert SAMPLE_VOCAB == VOCAB and os.path.isfile(SAMPLE_VOCAB)
    assert sorted(os.path.join(SAMPLE_CORPUS, n) for n in os.listdir(SAMPLE_CORPUS)
                  if n.endswith(".txt")) == SAMPLE


def test_create_writes_what_the_command_line_writes(tmp_path):
    """Same settings: the same bytes, the same summary (but its timings), the same
    warnings; the command line run as a module from another working directory."""
    settings = dict(input_file=SAMPLE[1], num_output_shards=2, vocab_file=VOCAB,
                    dupe_factor=1, max_seq_length=64, max_predictions_per_seq=10,
                    random_seed=7, progress=False)
    result = cpd.create(cpd.Options(output_file=str(tmp_path / "api"), num_workers=1,
                                    **settings))
    assert result.outputs == [str(tmp_path / f"api-0000{i}-of-00002") for i in range(2)]
    assert result.stats.instances > 0 and result.warnings == []
    flags = [f"--{k}={v}" for k, v in settings.items() if k != "progress"] + ["--noprogress"]
    r = subprocess.run([sys.executable, "-m", "data_prep.create_pretraining_data", *flags,
                        f"--output_file={tmp_path / 'cli'}", "--num_workers=2"],
                       cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    cli_outputs = [str(tmp_path / f"cli-0000{i}-of-00002") for i in range(2)]
    assert _data_lines(r.stdout) == _data_lines(result.summary) + [
        "wrote " + ", ".join(cli_outputs)]
    for mine, theirs in zip(result.outputs, cli_outputs):
        assert open(mine, "rb").read() == open(theirs, "rb").read()


def test_create_raises_the_users_mistakes_and_faults(tmp_path):
    out = tmp_path / "o.tfrecord"

    def create(**kw):
        return cpd.create(cpd.Options(**{"output_file": str(out), "vocab_file": VOCAB,
                                         "num_workers": 1, "progress": False, **kw}))

    bad_vocab = tmp_path / "vocab.txt"
    bad_vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n")
    control = tmp_path / "control.bin"
    control.write_bytes(b"\x00\x01\n\n\x02\n")
    cases = [  # (settings, exception type, message)
        (dict(), InputError, "--input_file and --output_file are required"),
        (dict(input_file=str(tmp_path / "missing.txt")), InputError,
         f"--input_file: file not found: {tmp_path / 'missing.txt'}"),
        (dict(input_file=SAMPLE[0], max_seq_length=4), InputError,
         "max_seq_length must be >= 5 (got 4)"),
        (dict(input_file=SAMPLE[0], vocab_file=str(tmp_path / "nope.txt")), InputError,
         "nope.txt"),
        (dict(input_file=SAMPLE[0], vocab_file=str(bad_vocab)), VocabError, "[MASK]"),
        (dict(input_file=str(blank)), InputError, "no text (empty or blank)"),
        (dict(input_file=str(control)), InputError, "no training instances from"),
    ]
    for settings, kind, message in cases:
        with pytest.raises(kind) as e:
            create(**settings)
        assert isinstance(e.value, UserError) and message in str(e.value), settings
    assert not out.exists()

    # An output path through a file is the user's path, named before any work starts.
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(UserError, match=r"--output_file: .*/a_file is a file, so .*/a_file/"
                                        r"sub/o\.tfrecord cannot be written there"):
        create(input_file=SAMPLE[0], output_file=str(blocker / "sub" / "o.tfrecord"))


def test_create_returns_the_warnings(tmp_path):
    (tmp_path / "blank.txt").write_text("\n")
    (tmp_path / "emoji.txt").write_text(
        "".join(f"\U0001F600 \U0001F680 cat {i}\n\n" for i in range(5)), encoding="utf-8")
    result = cpd.create(cpd.Options(
        input_file=f"{tmp_path}/*.txt", output_file=str(tmp_path / "o.tfrecord"),
        vocab_file=VOCAB, max_seq_length=16, max_predictions_per_seq=4, num_workers=1,
        progress=False))
    assert len(result.warnings) == 2, result.warnings
    assert result.warnings[0].startswith("--input_file: 1 of 2 input files hold no text")
    assert "word pieces are [UNK]" in result.warnings[1]


def test_importing_it_defines_no_flags():
    """Training from raw text imports it into a program with flags of its own
    (launch/train.py): the command line's flags exist only when it runs."""
    code = ("import dataclasses; from absl import flags; "
            "from data_prep import create_pretraining_data as cpd; "
            "import bert_jax.tasks.pretraining.data; "
            "print([f.name for f in dataclasses.fields(cpd.Options) if f.name in flags.FLAGS])")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr[-2000:]


def test_every_data_prep_package_is_installed():
    """setup.cfg installs data_prep's packages too (corpus/, beam/): training from raw text
    imports data_prep.corpus from an installed copy, and a Beam --runner data_prep.beam."""
    import configparser
    import fnmatch

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    include = [p.strip() for p in cfg["options.packages.find"]["include"].split(",")]
    packages = sorted(".".join(p.parent.relative_to(REPO).parts)
                      for p in (REPO / "data_prep").rglob("__init__.py"))
    assert {"data_prep", "data_prep.corpus", "data_prep.beam"} <= set(packages)
    assert [p for p in packages if not any(fnmatch.fnmatchcase(p, i) for i in include)] == []
