"""Every entry point ends a mistake in one line, `error: <message>` on stderr, with the exit
code of the error's kind (2: the user's input, 1: a fault); --verbose adds the traceback
(bert_jax/cli.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from bert_jax import cli
from bert_jax.errors import FaultError, UserError
from bert_jax.train.config import load_config
from tests.conftest import REPO

# Lines the C++ side of jax / TensorFlow may log on stderr whatever the program does.
_NATIVE_LOG = re.compile(r"^(WARNING: All log messages before absl::InitializeLog|[IWEF]\d{4} )")


def _run(*args, cwd=REPO):
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=300)
    lines = [line for line in r.stderr.splitlines() if line and not _NATIVE_LOG.match(line)]
    return r, lines


def test_train_py_mistyped_config_key_is_one_line_naming_the_closest_key(tmp_path):
    """A newcomer's typo: `--config.train.stpes` printed 53 lines of chained tracebacks
    (raised while absl parses flags, before main), the hint escaped on the last line."""
    args = ["launch/train.py", "--config=configs/bert_tiny.py", f"--workdir={tmp_path}",
            "--config.train.stpes=3"]
    r, lines = _run(*args)
    assert r.returncode == 2, r.stderr
    assert lines == ["error: configs/bert_tiny.py: unknown config key 'train.stpes' (did you "
                     "mean 'train.steps'?)"], r.stderr
    assert not os.listdir(tmp_path)  # nothing ran
    r, lines = _run(*args, "--verbose")
    assert r.returncode == 2 and "Traceback (most recent call last)" in r.stderr
    assert lines[-1].startswith("error: configs/bert_tiny.py: unknown config key 'train.stpes'")


def test_train_py_moved_config_key_is_one_line_naming_the_new_one(tmp_path):
    r, lines = _run("launch/train.py", "--config=configs/glue.py:mrpc", f"--workdir={tmp_path}",
                    "--config.train.max_steps=3")
    assert r.returncode == 2, r.stderr
    assert lines == ["error: configs/glue.py:mrpc: config.train.max_steps is now "
                     "config.train.steps"], r.stderr


def test_train_py_error_in_main_is_one_line(tmp_path):
    """A ReportedError raised in main (a GLUE config without a checkpoint) is one line."""
    workdir = tmp_path / "mrpc"
    r, lines = _run("launch/train.py", "--config=configs/glue.py:mrpc", f"--workdir={workdir}")
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith(
        "error: no train.init_checkpoint given: fine-tuning starts from a pretrained "
        "encoder; pass --config.train.init_checkpoint="), r.stderr
    assert not workdir.exists()  # refused before anything was written
    # train.do_train=False: the launcher predicts (bert_jax.tasks.predict), whose own check
    # names the missing fine-tuned checkpoint.
    r, lines = _run("launch/train.py", "--config=configs/glue.py:mrpc", f"--workdir={workdir}",
                    "--config.train.do_train=False")
    assert r.returncode == 2, r.stderr
    assert lines == ["error: train.do_train=False predicts with a fine-tuned model: set "
                     "train.init_checkpoint to it (e.g. a fine-tuning run's best_model/)"], \
        r.stderr
    assert not workdir.exists()


def _as_lists(value):
    """A config's to_dict() with tuples as lists, as YAML reads them back."""
    if isinstance(value, dict):
        return {k: _as_lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    return value


@pytest.mark.parametrize("spec, flags, overrides", [
    ("configs/bert_tiny.py", ["--config.train.steps=17", "--config.model.hidden_act=relu"],
     {"train.steps": 17, "model.hidden_act": "relu"}),
    ("configs/glue.py:mrpc", ["--config.sweep.lrs=(1e-5,3e-5)", "--config.task.data_dir=MRPC"],
     {"sweep.lrs": (1e-5, 3e-5), "task.data_dir": "MRPC"}),
])
def test_train_py_print_config_prints_the_resolved_config_without_a_workdir(
        spec, flags, overrides, tmp_path):
    """--print_config: the config after its overrides, as YAML, exit 0; no --workdir needed,
    nothing written (run from an empty directory, with the config's path absolute)."""
    r, lines = _run(str(REPO / "launch/train.py"), f"--config={REPO / spec}", *flags,
                    "--print_config", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert lines == [], r.stderr
    printed = yaml.safe_load(r.stdout)
    assert printed == _as_lists(load_config(spec, overrides).to_dict())
    for key, value in overrides.items():  # the override itself, not the config's default
        section, name = key.split(".")
        assert printed[section][name] == _as_lists(value)
        assert load_config(spec)[section][name] != value
    assert not os.listdir(tmp_path)  # nothing built or written


def test_train_py_print_config_keeps_the_one_line_errors(tmp_path):
    r, lines = _run("launch/train.py", "--config=configs/bert_tiny.py", "--config.train.stpes=3",
                    "--print_config")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert lines == ["error: configs/bert_tiny.py: unknown config key 'train.stpes' (did you "
                     "mean 'train.steps'?)"], r.stderr
    # without --print_config, --workdir is still required: one line, before anything runs
    r, lines = _run("launch/train.py", "--config=configs/bert_tiny.py", cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert lines == ["error: --workdir is required (only --print_config runs without it)"]


def test_train_py_help_says_where_the_keys_are_documented():
    r, _ = _run("launch/train.py", "--help")  # absl's --help exits 1 after printing
    assert "docs/configuration.md" in r.stdout and "--print_config" in r.stdout
    assert re.search(r"--\[no\]print_config: Print the resolved config", r.stdout), r.stdout


@pytest.mark.parametrize("args, message", [
    (["data_prep/create_pretraining_data.py", "--input_fil=x.txt"],
     r"error: Unknown command line flag 'input_fil'\. Did you mean: input_file \?"),
    (["data_prep/build_vocab.py", "--vocab_size=many"],
     r"error: flag --vocab_size=many: invalid literal for int\(\) with base 10: 'many'"),
    (["data_prep/prepare_corpus.py", "--input=nope_dir", "--output=x.txt"],
     "error: --input=nope_dir: no such file or folder"),
    (["-m", "bert_jax.data.inspect", "--input=nope/*.tfrecord"],
     r"error: --input: the glob 'nope/\*\.tfrecord' matches no file; check the path"),
    (["data_prep/create_pretraining_data.py", "--input_file=in.txt",
      "--output_file=in.txt/out.tfrecord", "--vocab_file=v.txt"],
     r"create_pretraining_data: error: --output_file: .*/in\.txt is a file, so "
     r"in\.txt/out\.tfrecord cannot be "
     r"written there: pass another path"),
    (["data_prep/build_vocab.py", "--input_file=in.txt", "--output=in.txt/vocab.txt"],
     r"build_vocab: error: --output=in\.txt/vocab\.txt: .*/in\.txt is a file, so nothing "
     r"can be written there: pass another path"),
    (["data_prep/prepare_corpus.py", "--input=in.txt", "--output=in.txt/corpus.txt"],
     r"error: --output=in\.txt/corpus\.txt: .*/in\.txt is a file, so nothing can be "
     r"written there: pass another path"),
    (["launch/extract_features.py", "--checkpoint=nope", "--input_file=x.txt",
      "--output_file=x.npy", "--pooling=mean"],
     "error: --checkpoint=nope: .*/nope is neither a model directory"),
    (["-m", "bert_jax.convert", "to-hf", "--checkpoint=nope", "--output=out"],
     "error: .*/nope is neither a model directory"),
])
def test_every_cli_ends_a_mistake_in_one_line_exit_2(args, message, tmp_path):
    """A bad flag (absl's own error, before main) or a bad input (in main): one line."""
    if not args[0].startswith("-"):
        args = [str(REPO / args[0]), *args[1:]]
    (tmp_path / "in.txt").write_text("A sentence.\nAnother one.\n")  # a file in the way
    r, lines = _run(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and re.match(message, lines[0]), r.stderr
    assert os.listdir(tmp_path) == ["in.txt"]


@pytest.mark.parametrize("flags, message", [
    (["--workdir={f}"], "error: --workdir={f} is a file, not a directory: pass a directory "
                        "(it is created if missing)"),
    (["--workdir={f}/run"], "error: --workdir={f}/run: {f} is a file, so no directory can be "
                            "made there: pass another path"),
    (["--workdir={d}/run", "--config.data.train_files={d}/none/*.tfrecord"],
     "error: data.train_files: the glob '{d}/none/*.tfrecord' matches no file; check the path "
     "(comma-separated globs, local or gs://)"),
    (["--workdir={d}/run", "--config.data.train_files={d}/data/*.tfrecord",
      "--config.data.eval_files={d}/none-*.tfrecord"],
     "error: data.eval_files: the glob '{d}/none-*.tfrecord' matches no file; check the path "
     "(comma-separated globs, local or gs://)"),
])
def test_train_py_workdir_and_input_mistakes_are_one_line_and_make_nothing(flags, message,
                                                                           tmp_path):
    """A workdir that is a file (or under one) and a glob that matches nothing: one line
    naming the flag or key, exit 2, before any workdir is made."""
    from tests.data.fixtures import write_files

    f = tmp_path / "a_file"
    f.write_text("not a folder\n")
    (tmp_path / "data").mkdir()
    write_files(tmp_path / "data", 1, 4, seq=64, preds=10)  # valid training files
    before = sorted(p.name for p in tmp_path.iterdir())
    fmt = {"f": str(f), "d": str(tmp_path)}
    r, lines = _run("launch/train.py", "--config=configs/bert_tiny.py",
                    *[x.format(**fmt) for x in flags])
    assert r.returncode == 2, r.stderr
    assert lines == [message.format(**fmt)], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no workdir made


def test_the_quick_start_prints_only_its_own_lines(tmp_path):
    """The quick start's command (a few steps of it) in the test environment, libtpu
    installed: no TPU lines, no TensorFlow start-up notices, nothing on stderr but the
    progress bar. The README's command 1 runs the same program."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS")}
    r = subprocess.run([sys.executable, "launch/train.py", "--config=configs/bert_tiny.py",
                        f"--workdir={tmp_path / 'run'}", "--config.train.steps=2"],
                       cwd=REPO, capture_output=True, text=True, timeout=600,
                       env=dict(env, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert "done at step 2" in r.stdout
    shown = [x.strip() for x in r.stderr.replace("\r", "\n").splitlines() if x.strip()]
    assert shown and all(x.startswith("pre-training:") for x in shown), r.stderr


def test_the_process_exits_without_walking_its_heap_again(tmp_path):
    """launch/train.py lingered 4-60 s after its last line: the interpreter's final garbage
    collections walked the ~0.5M objects of TensorFlow, JAX and flax several times. cli.run
    freezes what is alive when main returns, so no collection looks at it again (atexit
    handlers still run)."""
    program = tmp_path / "prog.py"
    program.write_text(
        "import atexit, gc\n"
        "from bert_jax import cli\n"
        "heap = []\n"
        "def main(argv):\n"
        "    heap.extend([i] for i in range(200_000))  # alive until the process exits\n"
        "    atexit.register(lambda: print('frozen', gc.get_freeze_count(), flush=True))\n"
        "cli.run(main)\n")
    r, _ = _run(str(program))
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split("frozen ")[1]) >= 200_000, r.stdout


def test_reported_exit_codes_and_verbose(capsys):
    with pytest.raises(SystemExit) as e, cli.reported():
        raise UserError("x.tsv: line 3: empty label")
    assert e.value.code == 2 and str(e.value) == "x.tsv: line 3: empty label"
    assert capsys.readouterr().err == "error: x.tsv: line 3: empty label\n"
    with pytest.raises(SystemExit) as e, cli.reported():
        raise FaultError("checkpoint at step 8 failed: no space left")
    assert e.value.code == 1
    with pytest.raises(SystemExit) as e, cli.reported(verbose=True):
        raise FaultError("disk full")
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.endswith("error: disk full\n")
    with pytest.raises(SystemExit) as e, cli.reported(also=(FileNotFoundError,)):
        raise FileNotFoundError("task.dev_file=nope.tsv: no such file")
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: task.dev_file=nope.tsv: no such file\n"
    with pytest.raises(SystemExit) as e, cli.reported():
        raise UserError("shard.tfrecord: truncated record\n  at byte 250190")
    assert capsys.readouterr().err == "error: shard.tfrecord: truncated record; at byte 250190\n"
    with pytest.raises(SystemExit) as e, cli.reported():
        raise KeyboardInterrupt
    assert e.value.code == 130 and capsys.readouterr().err == "error: interrupted\n"
    # Anything else is a bug: it keeps its traceback.
    with pytest.raises(KeyError), cli.reported():
        raise KeyError("input_ids")
