"""Comments and docstrings in the packages, the launchers, the configs and the benchmark
scripts keep the reason for a choice, not where it was measured: none names a particular
machine's core count ("2-core", "two cores"), "this machine" / "this VM", or an issue ("the
issue", "issue 17"). Measured figures live in benchmarks/RESULTS.md; a benchmark's docstring
says what it measures, how to run it and how to read its output. Strings the programs print
are not comments: an error message may well say "copy it to this machine"."""

from __future__ import annotations

import ast
import io
import re
import tokenize

import pytest

from tests.conftest import REPO

FOLDERS = ("bert_jax", "data_prep", "launch", "configs", "benchmarks")

_COUNT = r"(?:\d+|one|two|three|four|six|eight|twelve|sixteen)"
FORBIDDEN = re.compile(
    rf"\b{_COUNT}[- ](?:CPU[- ])?cores?\b"        # 2-core, 2 cores, two-core, 4 CPU cores
    r"|\bthis (?:machine|VM|box)\b"               # this machine, this VM
    r"|\b(?:dev|development) (?:machine|VM|box)\b"
    r"|\bthe issue\b"                             # the issue, the issue's
    r"|\b(?:issue|PR|pull request)s? ?#?\d+",     # issue 17, issue #17, PR 3
    re.IGNORECASE)


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every bare string statement (module, class and
    function docstrings, and strings documenting an attribute) of a Python source."""
    found = [(tok.start[0], tok.string) for tok in
             tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            found.append((node.lineno, node.value.value))
    return found


def offending(source: str) -> list[str]:
    """`line: match` for each forbidden reference in the comments and docstrings."""
    hits = []
    for line, text in comments_and_docstrings(source):
        for match in FORBIDDEN.finditer(text):
            hits.append(f"{line + text.count(chr(10), 0, match.start())}: {match.group(0)!r}")
    return hits


def _python_files():
    return sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py"))


def test_the_folders_hold_python_files():
    files = _python_files()
    assert {p.relative_to(REPO).parts[0] for p in files} == set(FOLDERS)
    assert len(files) > 50


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_comment_or_docstring_names_a_machine_or_an_issue(path):
    hits = offending(path.read_text(encoding="utf-8"))
    assert not hits, (f"{path.relative_to(REPO)}: keep the reason in the comment and move "
                      f"the figure to benchmarks/RESULTS.md: {hits}")


@pytest.mark.parametrize("text", [
    "halved the throughput on 2 cores", "a quiet 2-core CPU", "on a two-core VM",
    "4 CPU cores", "a ceiling of this machine", "measured on this VM", "the issue's newcomer",
    "as the issue asks", "(issue 19)", "see issue #7", "PR 12 changed it",
    "on the development VM",
])
def test_the_pattern_catches_each_kind_of_reference(text):
    source = f'"""Docstring: {text}."""\nx = 1  # fine\n'
    assert offending(source) == [f"1: {FORBIDDEN.search(text).group(0)!r}"]
    assert offending(f"x = 1  # {text}\n") != []


@pytest.mark.parametrize("text", [
    "num_workers (default: all cores)", "min(16, cores) parallel calls",
    "one device per core", "2 workers", "a TPU VM's disk goes when the VM does",
    "on one machine (the tests use it)", "this host's files", "tissue 3",
])
def test_the_pattern_leaves_legitimate_text_alone(text):
    assert offending(f'"""{text}"""\n# {text}\n') == []


def test_strings_the_program_prints_are_not_checked():
    source = 'raise ValueError("copy it to this machine first")  # a message, not a comment\n'
    assert offending(source) == []
    assert offending('def f():\n    """Line one.\n\n    Tuned on this machine."""\n') == [
        "4: 'this machine'"]
