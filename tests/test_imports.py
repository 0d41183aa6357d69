"""Imports run one way (WORKSPACE.md, "Import order"): a module imports only from its own
layer or the layers before it, and a bert_jax / data_prep import sits inside a function
only where it keeps TensorFlow, torch or Apache Beam off a path that must not load them, with
a comment (on its line or the two above) saying so. Static: the source is parsed, nothing imported."""

from __future__ import annotations

import ast
import functools
import pathlib

from tests.conftest import REPO

# Each layer may import from itself and the layers above it in this list.
LAYERS = [
    ("bert_jax.errors", "bert_jax.paths", "bert_jax.cli", "bert_jax.tokenization", "bert_jax"),
    ("bert_jax.models",),
    ("bert_jax.sharding", "bert_jax.optim"),
    ("bert_jax.data",),
    ("data_prep",),
    ("bert_jax.convert",),
    ("bert_jax.train",),
    ("bert_jax.tasks",),
    ("launch", "configs"),
]
HEAVY = ("tensorflow", "tensorflow_datasets", "torch", "transformers", "apache_beam")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for root in ("bert_jax", "data_prep", "launch", "configs"):
        for path in sorted((REPO / root).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _layer(name: str) -> int:
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    assert best is not None, f"{name} is in no layer of tests/test_imports.py"
    return best[0]


def _imports(path: pathlib.Path):  # noqa: C901
    """(module imported, line, inside a function) of every import in `path`."""
    tree = ast.parse(path.read_text())
    inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef,
                                                              ast.AsyncFunctionDef))
             for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` imports that module; `from module import name`
            # the module.
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            yield name, node.lineno, id(node) in inner


def _resolve(name: str):
    """The module `name` is (a `from X import y` of a function resolves to X)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


@functools.lru_cache(maxsize=None)
def _heavy(module: str, seen: frozenset = frozenset()) -> bool:
    """Whether importing `module` loads TensorFlow, torch or Apache Beam (its module-level
    imports, and theirs)."""
    for name, _, inner in _imports(MODULES[module]):
        if inner:
            continue
        if name.split(".")[0] in HEAVY:
            return True
        target = _resolve(name)
        if target and target not in seen | {module} and _heavy(target, seen | {module}):
            return True
    return False


def test_every_import_runs_one_way():
    wrong = []
    for module, path in MODULES.items():
        for name, line, _ in _imports(path):
            target = _resolve(name)
            if target and _layer(target) > _layer(module):
                wrong.append(f"{path.relative_to(REPO)}:{line}: {module} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_imports_inside_functions_only_keep_tensorflow_torch_or_beam_away():
    wrong = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        for name, line, inner in _imports(path):
            target = _resolve(name)
            if not inner or not target:
                continue
            said = " ".join(lines[max(0, line - 3):line]).lower()
            if not _heavy(target) or not any(w in said for w in ("tensorflow", "torch", "beam")):
                wrong.append(f"{path.relative_to(REPO)}:{line}: {target} imported inside a "
                             f"function" + ("" if _heavy(target) else
                                            " (it loads none of TensorFlow, torch, Beam)"))
    assert not sorted(set(wrong)), "\n".join(sorted(set(wrong)))


def test_the_loop_never_imports_a_task():
    train = [m for m in MODULES if m.startswith("bert_jax.train")]
    assert train
    for module in train:
        for name, line, _ in _imports(MODULES[module]):
            assert not name.startswith("bert_jax.tasks"), f"{module}:{line} imports {name}"
