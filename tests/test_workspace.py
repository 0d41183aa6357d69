"""WORKSPACE.md's statements spot-checked against the repository, with the convention the
page states at its top: a path in backticks (a span with a slash and no spaces) exists;
names in backticks in parentheses right after a path (`launch/train.py` (`main`)) are
defined at the top level of that file (a folder: its `__init__.py`; `Class.method`: a
method); every module of bert_jax/ and data_prep/ has its path on the page; relative links
point at files that exist. Static: the source is parsed, nothing imported."""

from __future__ import annotations

import ast
import pathlib
import re

from tests.conftest import REPO

PAGE = REPO / "WORKSPACE.md"
SPAN = re.compile(r"`([^`\n]+)`")
# `path` (`name`, `name`, ...): the parentheses may follow on the next line.
NAMED = re.compile(r"`([^`\s]+)`\s*\(\s*(`[^`\n]+`(?:\s*,\s*`[^`\n]+`)*)\s*\)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
COVERED = ("bert_jax", "data_prep")   # every module here must have a line
# docs/ is written beside this page; until it exists here, links into it are not checked.
DOCS = REPO / "docs"


def _prose(text: str) -> str:
    """The page without its fenced blocks (diagrams: their paths are shorthand)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _is_path(span: str) -> bool:
    return "/" in span and not re.search(r"\s|://|[<>*|=$]", span)


def _missing_paths(text: str) -> list[str]:
    return sorted({s for s in SPAN.findall(_prose(text))
                   if _is_path(s) and not (REPO / s).exists()})


def _defined(path: pathlib.Path) -> set[str]:
    """Top-level functions, classes and assigned names of a module (inside top-level if /
    try / with blocks too), and `Class.member` for what a class body defines."""
    source = path / "__init__.py" if path.is_dir() else path
    names: set[str] = set()

    def visit(body, prefix=""):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + node.name)
                if isinstance(node, ast.ClassDef) and not prefix:
                    visit(node.body, node.name + ".")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for n in ast.walk(target):
                        if isinstance(n, ast.Name):
                            names.add(prefix + n.id)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for part in ("body", "orelse", "finalbody"):
                    visit(getattr(node, part, []), prefix)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body, prefix)

    visit(ast.parse(source.read_text()).body)
    return names


def _named(text: str) -> list[tuple[str, list[str]]]:
    """(path, [names]) of every `path` (`name`, ...) entry."""
    return [(path, SPAN.findall(names)) for path, names in NAMED.findall(_prose(text))
            if _is_path(path)]


def _undefined_names(text: str) -> list[str]:
    wrong = []
    for path, names in _named(text):
        target = REPO / path
        if not (target.is_file() and path.endswith(".py")
                or (target / "__init__.py").is_file()):
            wrong.append(f"{path}: not a module or package, so ({', '.join(names)}) cannot "
                         f"be checked")
            continue
        defined = _defined(target)
        wrong += [f"{path}: {name} is not defined there" for name in names
                  if name not in defined]
    return wrong


def _module_paths(root: str) -> list[str]:
    """Each module under `root` as the page writes it: its path, a package as `folder/`."""
    out = []
    for path in sorted((REPO / root).rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        out.append(rel[:-len("__init__.py")] if path.name == "__init__.py" else rel)
    return out


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_path_in_backticks_exists():
    missing = _missing_paths(PAGE.read_text())
    assert not missing, f"WORKSPACE.md names paths that do not exist: {missing}"


def test_every_named_function_and_class_is_defined_in_its_file():
    text = PAGE.read_text()
    # The map writes a line per module in this form: a change of form that the pattern
    # no longer reads must fail here, not pass with nothing checked.
    assert len(_named(text)) >= 100, len(_named(text))
    wrong = _undefined_names(text)
    assert not wrong, "\n".join(wrong)


def test_every_module_of_bert_jax_and_data_prep_has_a_line():
    spans = set(SPAN.findall(_prose(PAGE.read_text())))
    missing = [m for root in COVERED for m in _module_paths(root) if m not in spans]
    assert not missing, f"modules without a line in WORKSPACE.md: {missing}"


def test_links_point_at_files_and_headings_that_exist():
    text = PAGE.read_text()
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", _prose(text), re.M)}
    wrong = []
    for target in LINK.findall(_prose(text)):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        if not file:
            if anchor not in anchors:
                wrong.append(target)
        elif not (file.startswith("docs/") and not DOCS.is_dir()) and not (REPO / file).exists():
            wrong.append(target)
    assert not wrong, f"WORKSPACE.md links to what is not there: {wrong}"


def test_lines_stay_short():
    """One short line per module or test: no row of hundreds of words."""
    long = [f"{i}: {len(line)}" for i, line in enumerate(PAGE.read_text().splitlines(), 1)
            if len(line) > 200]
    assert not long, f"WORKSPACE.md lines over 200 characters: {long}"


def test_the_checks_catch_a_bogus_path_a_bogus_name_and_a_missing_module():
    """The checkers themselves, on a made-up page: each finds what it is for."""
    page = ("- `bert_jax/train/loop.py` (`train`, `Outcome.summary`, `no_such_function`): x\n"
            "- `bert_jax/train/no_such_module.py`: y\n"
            "- `bert_jax/tasks/glue/` (`GlueTask`,\n  `NoSuchTask`): z\n"
            "```\n`bert_jax/only/in/a/diagram.py` (`ignored`)\n```\n")
    assert _missing_paths(page) == ["bert_jax/train/no_such_module.py"]
    assert _undefined_names(page) == [
        "bert_jax/train/loop.py: no_such_function is not defined there",
        "bert_jax/tasks/glue/: NoSuchTask is not defined there"]
    spans = set(SPAN.findall(_prose(page)))
    assert "bert_jax/tasks/glue/" in _module_paths("bert_jax")
    assert "bert_jax/train/step.py" in _module_paths("bert_jax")
    assert "bert_jax/train/step.py" not in spans
