"""The house's structure, from the source (nothing imported): no import circle in bert_jax/,
data_prep/ or benchmarks/ (imports inside functions count too: a circle is a circle, even
when Python tolerates it), no private name (`_name`, not a dunder) taken from another
module, tests included, and no file in bert_jax/ or data_prep/ over 600 lines. Each check
is also run on a planted tree, so that a circle or a private import it should see it sees."""

from __future__ import annotations

import ast
import pathlib

import pytest

from tests.conftest import REPO

ROOTS = ("bert_jax", "data_prep", "launch", "configs", "benchmarks", "tests")
MAX_LINES = 600


def find_modules(repo: pathlib.Path) -> dict[str, pathlib.Path]:
    """{dotted module name: path} of every .py file under the ROOTS (a package: its folder's
    name)."""
    out = {}
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            name = ".".join(path.relative_to(repo).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


class Source:
    """One module's imports: what each import binds and what it takes from where."""

    def __init__(self, modules: dict[str, pathlib.Path], module: str):
        self.modules, self.module = modules, module
        path = modules[module]
        self.package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        self.tree = ast.parse(path.read_text())

    def _qualify(self, name: str):
        """`name` as the project's dotted name, or None when it is not the project's.
        benchmarks/ scripts import their siblings by bare name (`from pretrain_step import
        build`, with benchmarks/ on sys.path)."""
        first = name.split(".")[0]
        if self.module.startswith("benchmarks.") and f"benchmarks.{first}" in self.modules:
            return f"benchmarks.{name}"
        return name if first in ROOTS else None

    def _owner(self, name: str):
        """The longest project module `name` is or lies in."""
        while name and name not in self.modules:
            name = name.rpartition(".")[0]
        return name or None

    def _base(self, node: ast.ImportFrom):
        if not node.level:
            return self._qualify(node.module or "")
        parts = self.package.split(".")
        parts = parts[:len(parts) - node.level + 1]
        return ".".join(parts + ([node.module] if node.module else []))

    def imports(self):
        """(imported module, line, name taken from it or None, name bound here or None) of
        every project import, at any depth; `from package import module` imports that
        module."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    full = self._qualify(a.name)
                    if full and self._owner(full):
                        # `import a.b.c` binds a; `import a.b.c as x` binds x to a.b.c
                        bound = (a.asname, full) if a.asname else (
                            a.name.split(".")[0], full[:len(full) - len(a.name)]
                            + a.name.split(".")[0])
                        yield self._owner(full), node.lineno, None, bound
            elif isinstance(node, ast.ImportFrom):
                base = self._base(node)
                if not base or not self._owner(base):
                    continue
                for a in node.names:
                    if f"{base}.{a.name}" in self.modules:
                        yield f"{base}.{a.name}", node.lineno, None, (
                            a.asname or a.name, f"{base}.{a.name}")
                    else:
                        yield self._owner(base), node.lineno, a.name, None

    def private_names(self) -> list[str]:
        """`from x import _name` and `x._name` (x another project module), as
        "line: module._name"."""
        wrong, bound = [], {}
        for target, line, name, binding in self.imports():
            if name and is_private(name) and target != self.module:
                wrong.append(f"{line}: {target}.{name}")
            if binding:
                bound[binding[0]] = binding[1]
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute) and is_private(node.attr):
                dotted = _dotted(node.value)
                if dotted and dotted[0] in bound:
                    owner = ".".join([bound[dotted[0]]] + dotted[1:])
                    if owner in self.modules and owner != self.module:
                        wrong.append(f"{node.lineno}: {owner}.{node.attr}")
        return wrong


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _dotted(node) -> list[str]:
    """["a", "b", "c"] of the expression a.b.c; [] for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id] + parts[::-1] if isinstance(node, ast.Name) else []


def import_graph(modules: dict[str, pathlib.Path], root: str) -> dict[str, set[str]]:
    """{module: modules it imports} within `root`. A module's import of its own package is
    left out: Python runs a package's __init__ before any of its modules anyway."""
    graph = {}
    for module in modules:
        if module.split(".")[0] != root:
            continue
        graph[module] = {t for t, _, _, _ in Source(modules, module).imports()
                         if t != module and t.split(".")[0] == root
                         and not module.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_imports(modules: dict[str, pathlib.Path], repo: pathlib.Path) -> list[str]:
    """"file:line: module._name" of every private name taken from another module."""
    return sorted({f"{modules[m].relative_to(repo)}:{w}" for m in modules
                   for w in Source(modules, m).private_names()})


def big_files(modules: dict[str, pathlib.Path]) -> list[str]:
    return [f"{p}: {n} lines" for m, p in modules.items()
            if m.split(".")[0] in ("bert_jax", "data_prep")
            and (n := len(p.read_text().splitlines())) > MAX_LINES]


MODULES = find_modules(REPO)


@pytest.mark.parametrize("root", ["bert_jax", "data_prep", "benchmarks"])
def test_no_import_circle(root):
    assert circles(import_graph(MODULES, root)) == []


def test_no_private_name_crosses_a_module():
    wrong = private_imports(MODULES, REPO)
    assert not wrong, "private names imported from another module:\n" + "\n".join(wrong)


def test_files_stay_small():
    big = big_files(MODULES)
    assert not big, "\n".join(big)


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


PLANTED = {
    # a circle through an import inside a function
    "bert_jax/__init__.py": "",
    "bert_jax/one.py": "from bert_jax import two\n\n_SECRET = 1\n",
    "bert_jax/two.py": "def f():\n    from bert_jax.one import g\n    return g\n",
    # a benchmark script's bare sibling import closing a circle
    "benchmarks/__init__.py": "",
    "benchmarks/script.py": "from helper import h\n",
    "benchmarks/helper.py": "def h():\n    import benchmarks.script\n",
    # private names taken four ways
    "tests/__init__.py": "",
    "tests/test_x.py": ("from bert_jax.one import _SECRET\n"
                        "from bert_jax import one\n"
                        "import bert_jax.two as t\n"
                        "import bert_jax.one\n"
                        "x = one._SECRET, one.__name__\n"
                        "y = t._f\n"
                        "z = bert_jax.one._SECRET\n"),
    "bert_jax/sub/__init__.py": "from .. import one as o\n\ny = o._SECRET\n",
    "bert_jax/big.py": "x = 1\n" * (MAX_LINES + 1),
}


def test_the_checks_find_what_is_planted(tmp_path):
    for name, text in PLANTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    modules = find_modules(tmp_path)
    assert circles(import_graph(modules, "bert_jax")) == [["bert_jax.one", "bert_jax.two"]]
    assert circles(import_graph(modules, "benchmarks")) == [
        ["benchmarks.helper", "benchmarks.script"]]
    assert private_imports(modules, tmp_path) == [
        "bert_jax/sub/__init__.py:3: bert_jax.one._SECRET",
        "tests/test_x.py:1: bert_jax.one._SECRET",
        "tests/test_x.py:5: bert_jax.one._SECRET",
        "tests/test_x.py:6: bert_jax.two._f",
        "tests/test_x.py:7: bert_jax.one._SECRET",
    ]
    assert big_files(modules) == [f"{tmp_path / 'bert_jax/big.py'}: {MAX_LINES + 1} lines"]
