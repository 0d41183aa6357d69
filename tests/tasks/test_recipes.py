"""The recipe tables of the pre-training configs (configs/bert_base.py, bert_large.py,
bert_tiny.py, modernbert_base.py, modernbert_large.py): each row of a config's docstring
table is the value its resolved config has, for every argument column, and every value the
config sets apart from the sections' defaults has a row, so that the file names each value
it sets (the recipes themselves: bert_jax/tasks/pretraining/recipes.py)."""

from __future__ import annotations

import ast
import re

import ml_collections
import pytest

from bert_jax.data.pretrain import data_config
from bert_jax.models.config import model_config
from bert_jax.train.config import add_training_sections, config_keys, load_config
from tests.conftest import REPO

TABLES = ["bert_base.py", "bert_large.py", "bert_tiny.py", "modernbert_base.py",
          "modernbert_large.py"]
INHERIT = re.compile(r"Every other value is configs/(\w+\.py)'s table")


def _cell(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare string: gelu, adamw, auto


def parse_table(name: str) -> dict:
    """{argument (None: the default): {dotted key: value}} of configs/<name>'s docstring
    table, the rows of a table it names ("Every other value is configs/x.py's table") under
    its own. The header is `config` then one column per argument; a row is a key then a
    cell under each column, an empty cell the column before's."""
    source = (REPO / "configs" / name).read_text()
    lines = ast.get_docstring(ast.parse(source), clean=False).splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"    config {2,}default\b", line))
    header = lines[start]
    columns = [(m.start(), m.group()) for m in re.finditer(r"\S+", header)][1:]
    args = [None if c == "default" else c.removeprefix(":") for _, c in columns]
    rows = {arg: {} for arg in args}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        key = line.split()[0]
        value = None
        for i, (pos, _) in enumerate(columns):
            end = columns[i + 1][0] if i + 1 < len(columns) else len(line)
            text = line[pos:end].strip()
            value = _cell(text) if text else value
            assert value is not None, f"configs/{name}: {key} has no value in its first column"
            rows[args[i]][key] = value
    inherit = INHERIT.search("\n".join(lines))
    if inherit:
        parent = parse_table(inherit.group(1))
        assert set(parent) == set(rows), f"configs/{name}: other columns than its parent's"
        rows = {arg: {**parent[arg], **rows[arg]} for arg in rows}
    return rows


def _value(config, key: str):
    for part in key.split("."):
        config = config[part]
    return config


def _spec(name: str, arg) -> str:
    return f"configs/{name}" + (f":{arg}" if arg else "")


@pytest.mark.parametrize("name", TABLES)
def test_every_row_is_the_resolved_value(name):
    table = parse_table(name)
    assert len(table[None]) >= 7
    for arg, rows in table.items():
        config = load_config(_spec(name, arg))
        wrong = {k: (v, _value(config, k)) for k, v in rows.items() if _value(config, k) != v}
        assert not wrong, f"{_spec(name, arg)}: (table, config) {wrong}"


@pytest.mark.parametrize("name", TABLES)
def test_every_value_set_apart_from_the_defaults_has_a_row(name):
    defaults = ml_collections.ConfigDict()
    defaults.model = model_config()
    defaults.data = data_config()
    add_training_sections(defaults)
    known = set(config_keys(defaults))
    for arg, rows in parse_table(name).items():
        config = load_config(_spec(name, arg))
        unnamed = [k for k in config_keys(config)
                   if not isinstance(_value(config, k), ml_collections.ConfigDict)
                   and (k not in known or _value(config, k) != _value(defaults, k))
                   and k not in rows]
        assert not unnamed, f"{_spec(name, arg)} sets {unnamed} without a row in its table"


def test_every_pretraining_config_has_a_table():
    # A config without a `task` section is a pre-training config; each shows its table.
    configs = sorted(p.name for p in (REPO / "configs").glob("*.py"))
    pretraining = [n for n in configs if "task" not in load_config(f"configs/{n}")]
    assert pretraining == sorted(TABLES)


def test_a_wrong_row_is_found(tmp_path, monkeypatch):
    # The parser reads what a reader reads: a changed cell is another value.
    text = (REPO / "configs" / "bert_base.py").read_text()
    assert "    schedule.lr                         1e-4\n" in text
    monkeypatch.setattr("tests.tasks.test_recipes.REPO", tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "bert_base.py").write_text(text.replace(
        "    schedule.lr                         1e-4\n",
        "    schedule.lr                         2e-4\n"))
    table = parse_table("bert_base.py")
    assert table[None]["schedule.lr"] == 2e-4 and table["phase2"]["schedule.lr"] == 2e-4
    assert table["phase2"]["data.max_seq_length"] == 512
    assert load_config("configs/bert_base.py").schedule.lr == 1e-4  # the row no longer is
