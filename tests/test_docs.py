"""The documentation's promises: every command in README.md and docs/ names flags and config
keys that exist (and the small ones run), the README stays short with short paragraphs, and
every link points at a file of the repository."""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
# Commands of other tools (pip, gcloud, taskset's wrapped python is kept) are not ours to check.
_PYTHON = re.compile(r"^(?:taskset -c \S+ )?(python\S*) (.*)$")


def commands(page) -> list[str]:
    """The python command lines of a page's code blocks (indented or fenced), continuation
    lines joined and `a && b` split."""
    found, joined, fenced = [], "", False
    for line in page.read_text().splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        code = fenced or re.match(r"^ {4,}\S", line)
        if not code and not joined:
            continue
        text = line.strip()
        joined += (" " if joined else "") + text.rstrip("\\").strip()
        if text.endswith("\\"):
            continue
        for part in joined.split(" && "):
            match = _PYTHON.match(part.strip())
            if match:
                found.append(match.group(2).split(" # ")[0].strip())
        joined = ""
    return found


ALL = sorted({(page.relative_to(REPO).as_posix(), cmd) for page in PAGES for cmd in commands(page)})


def _program(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the program's invocation, its flags) of `python <argv>`."""
    if argv[0] == "-m":
        module = argv[1]
        if module == "bert_jax.convert":  # sub-commands, each with its own flags
            return argv[:3], argv[3:]
        return argv[:2], argv[2:]
    return argv[:1], argv[1:]


@functools.lru_cache(maxsize=None)
def _known_flags(program: tuple[str, ...]) -> frozenset:
    """The flags a program's help lists (absl's --helpfull, else argparse's --help)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    for flag in ("--helpfull", "--help"):
        proc = subprocess.run([sys.executable, *program, flag], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        if proc.returncode in (0, 1) and "--" in proc.stdout:  # absl help exits 1
            return frozenset(re.findall(r"--(?:\[no\])?([A-Za-z_][\w-]*)", proc.stdout))
    raise AssertionError(f"{' '.join(program)}: no help ({proc.stderr[-2000:]})")


def _config(argv: list[str], tmp_path):
    """launch/train.py's config of a command line, parsed as absl and ml_collections parse
    it: the file, its argument and every --config.* override (types checked)."""
    from absl import flags
    from ml_collections import config_flags

    from bert_jax.models.config import from_config_dict
    from bert_jax.train.config import check_config_flag

    argv = ["train.py"] + [a for a in argv if a.startswith("--config")]
    check_config_flag(argv)  # a moved or unknown key: one ConfigError naming it
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                    sys_argv=argv)
    values(argv)
    config = values.config
    if "task" not in config:
        from_config_dict(config.model)  # the model section makes a valid BertConfig
    return config


def test_config_check_catches_mistakes(tmp_path, monkeypatch):
    """_config, which the test below runs on every launch/train.py command, refuses an
    unknown key, a moved key and a value of the wrong type."""
    from bert_jax.models.config import ConfigError

    monkeypatch.chdir(REPO)
    assert _config(["--config=configs/bert_tiny.py", "--config.train.steps=7"],
                   tmp_path).train.steps == 7
    with pytest.raises(ConfigError, match="train.stepz"):
        _config(["--config=configs/bert_tiny.py", "--config.train.stepz=7"], tmp_path)
    with pytest.raises(ConfigError, match="is now config.train.steps"):
        _config(["--config=configs/glue.py:rte", "--config.train.max_steps=7"], tmp_path)
    with pytest.raises(Exception, match="many"):
        _config(["--config=configs/bert_tiny.py", "--config.train.steps=many"], tmp_path)


@pytest.mark.parametrize("page, command", ALL)
def test_command_flags_and_config_keys_exist(page, command, tmp_path, monkeypatch):
    argv = shlex.split(command)
    program, args = _program(argv)
    if program[:2] == ["-m", "pip"] or program[:2] == ["-m", "pytest"]:
        return
    if program[0].endswith(".py"):
        assert (REPO / program[0]).is_file(), f"{page}: {program[0]} does not exist"
    known = _known_flags(tuple(program))
    for arg in args:
        if arg.startswith("--") and not arg.startswith("--config."):
            name = arg[2:].split("=", 1)[0]
            assert name in known or name.removeprefix("no") in known, (
                f"{page}: `{command}` passes --{name}, which {' '.join(program)} does not "
                f"define")
    if program == ["launch/train.py"]:
        monkeypatch.chdir(REPO)
        _config(args, tmp_path)


def test_the_commands_are_found():
    """The extraction itself: the pages' commands are seen (a change in the pages' layout
    that hid them would make the test above check nothing)."""
    by_page = {}
    for page, command in ALL:
        by_page.setdefault(page, []).append(command)
    assert "launch/train.py --config=configs/bert_tiny.py --workdir=/tmp/bert_tiny" in \
        by_page["README.md"]
    assert "-m pytest -m \"not slow\"" in by_page["README.md"]
    assert any(c.startswith("-m bert_jax.convert from-tf") for c in by_page["docs/convert.md"])
    for page in PAGES:
        if page.parent.name == "docs":
            assert by_page.get(page.relative_to(REPO).as_posix()), f"{page}: no command"


def _run(argv: list[str], tmp_path, timeout=300) -> str:
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    argv = [a.replace("/tmp/", f"{tmp_path}/") for a in argv]
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc.stdout + proc.stderr


def _command(page: str, start: str) -> list[str]:
    matches = [c for p, c in ALL if p == page and c.startswith(start)]
    assert len(matches) == 1, (page, start, matches)
    return shlex.split(matches[0])


def test_the_data_page_runs(tmp_path):
    """docs/data.md's first three commands, as written (paths under /tmp moved into the
    test's folder; the run shortened): make TFRecords of the sample corpus, check them,
    train on them."""
    made = _run(_command("docs/data.md", "data_prep/create_pretraining_data.py "
                                         "--input_file='data_prep/sample_corpus/*.txt' "
                                         "--output_file=/tmp/pretrain/sample"), tmp_path)
    assert "instances" in made
    assert (tmp_path / "pretrain" / "sample.tfrecord").stat().st_size > 1_000_000
    checked = _run(_command("docs/data.md", "-m bert_jax.data.inspect "
                                            "--input='/tmp/pretrain/*.tfrecord'"), tmp_path)
    assert "[UNK]" in checked
    trained = _run(_command("docs/data.md", "launch/train.py --config=configs/bert_tiny.py "
                                           "--workdir=/tmp/bert_tiny_sample") + [
        "--config.train.steps=4", "--config.train.log_every=2", "--config.train.eval_steps=1",
        "--config.checkpoint.every=0"], tmp_path)
    assert (tmp_path / "bert_tiny_sample" / "checkpoints" / "4").is_dir(), trained[-2000:]


def test_readme_is_short_with_short_paragraphs():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 180
    for page in PAGES:
        for paragraph in _paragraphs(page.read_text()):
            words = len(paragraph.split())
            assert words <= 120, f"{page.name}: a paragraph of {words} words: {paragraph[:80]}"


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs: blocks between blank lines that are not code, tables or headings;
    each item of a list is a paragraph of its own."""
    prose = []
    for block in re.split(r"\n\s*\n", text):
        lines = [l for l in block.splitlines() if l.strip()]
        if not lines or lines[0].startswith(("    ", "|", "#", "```")):
            continue
        for item in re.split(r"\n(?=\s*(?:[-*]|\d+\.) )", "\n".join(lines)):
            prose.append(" ".join(l.strip() for l in item.splitlines()))
    return prose


def test_paragraph_counter_sees_long_prose():
    long = " ".join(["word"] * 130)
    assert [len(p.split()) for p in _paragraphs(f"# t\n\n{long}\n\n    python x.py\n")] == [130]
    assert [len(p.split()) for p in _paragraphs(f"- a b\n  c\n- {long}\n")] == [4, 131]


def test_every_docs_page_is_linked_and_every_link_resolves():
    readme = (REPO / "README.md").read_text()
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
    for page in PAGES + [REPO / "WORKSPACE.md"]:
        for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)]*))?\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name}: link to {target} is broken"
            if anchor and target.endswith(".md"):
                headings = re.findall(r"^#+ (.+)$", (page.parent / target).read_text(), re.M)
                assert anchor in {_slug(h) for h in headings}, (
                    f"{page.name}: {target} has no heading for #{anchor}")


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation but hyphens dropped,
    spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_slug_is_githubs():
    assert _slug("From a Wikipedia dump to training") == "from-a-wikipedia-dump-to-training"
    assert _slug("Text in, logits out") == "text-in-logits-out"


def test_the_readme_print_config_command_runs(tmp_path):
    out = _run(_command("README.md", "launch/train.py --config=configs/bert_tiny.py "
                                     "--config.train.steps=100 --print_config"), tmp_path)
    assert re.search(r"^  steps: 100$", out, re.M), out[-2000:]
