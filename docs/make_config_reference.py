"""Writes docs/configuration.md, the configuration reference, from the configs themselves.

    python docs/make_config_reference.py           # rewrite the page
    python docs/make_config_reference.py --check   # exit 1 with a diff when the page is stale

Every config of SPECS is loaded as launch/train.py loads it (`load_config`); each key's
default comes from the configs, its description from docs/config_keys.py, the moved keys
from bert_jax.train.config.RENAMED. tests/test_config_reference.py runs `check()` and the
key checks (`undocumented`, `stale`).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import os
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "configuration.md"
# The page documents this checkout's configs and code, whichever bert_jax is installed.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import ml_collections  # noqa: E402

from bert_jax.tasks.choice import CHOICE_FORMATS  # noqa: E402
from bert_jax.tasks.glue import GLUE_TASKS  # noqa: E402
from bert_jax.train.config import RENAMED, config_keys, load_config  # noqa: E402


def _descriptions() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("config_keys", REPO / "docs" / "config_keys.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DESCRIPTIONS


# Every config and argument the reference covers (tests/test_config_reference.py checks that
# every configs/*.py file, GLUE task and multiple-choice format is here).
PRETRAINING = ["bert_base.py", "bert_base.py:phase2", "bert_large.py", "bert_large.py:phase2",
               "bert_tiny.py", "modernbert_base.py", "modernbert_base.py:long",
               "modernbert_base.py:tiny", "modernbert_large.py", "modernbert_large.py:long",
               "modernbert_large.py:tiny"]
FINETUNING = ([f"glue.py:{t}" for t in GLUE_TASKS] + ["squad.py:1.1", "squad.py:2.0", "ner.py"]
              + [f"swag.py:{f}" for f in CHOICE_FORMATS])
SPECS = PRETRAINING + FINETUNING

# A table's columns: (title, the config whose values the column shows, the configs it
# stands for). The other configs' different values are listed under the table.
FAMILIES = [("pre-training", "bert_base.py", PRETRAINING),
            ("fine-tuning", "glue.py:mrpc", FINETUNING)]
TASK_KINDS = [("glue", "glue.py:mrpc", [s for s in FINETUNING if s.startswith("glue.py")]),
              ("squad", "squad.py:1.1", ["squad.py:1.1", "squad.py:2.0"]),
              ("ner", "ner.py", ["ner.py"]),
              ("choice", "swag.py:swag", [s for s in FINETUNING if s.startswith("swag.py")])]

SECTIONS = ["train", "schedule", "optimizer", "mesh", "checkpoint", "sweep", "model", "data",
            "task", "tokenizer", "model_overrides"]

LONG_VALUE = 30  # characters: a longer default is written in full under its table


def load_all() -> dict[str, ml_collections.ConfigDict]:
    """{spec: its config}, loaded as launch/train.py loads `--config=configs/<spec>`."""
    return {spec: load_config(os.path.join(str(REPO), "configs", spec)) for spec in SPECS}


def flat(config: ml_collections.ConfigDict) -> dict[str, object]:
    """{dotted key: value} of every key, sections included (their value: None)."""
    out = {}
    for key in config_keys(config):
        node = config
        for part in key.split("."):
            node = node[part]
        out[key] = None if isinstance(node, ml_collections.ConfigDict) else node
    return out


def undocumented(configs, descriptions) -> list[str]:
    """Keys of some config without a description, each as 'key (spec)'."""
    missing = {}
    for spec, config in configs.items():
        for key in config_keys(config):
            if key not in descriptions:
                missing.setdefault(key, spec)
    return [f"{key} (configs/{spec})" for key, spec in sorted(missing.items())]


def stale(configs, descriptions) -> list[str]:
    """Described keys that no config has."""
    keys = {k for config in configs.values() for k in config_keys(config)}
    return sorted(set(descriptions) - keys)


# --- rendering ----------------------------------------------------------------------------

def fmt(value) -> str:
    """A default as it is written in a config file."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:_}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(fmt(v) for v in value)
        if isinstance(value, list):
            return f"[{inner}]"
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def code(value) -> str:
    return f"`{fmt(value)}`"


def _file(spec: str) -> str:
    return spec.split(":")[0]


def _arg(spec: str) -> str:
    return spec.partition(":")[2]


def differences(key: str, columns, values) -> list[str]:
    """'spec, spec: `value`' for the configs whose value differs from their column's (a
    file all of whose arguments agree is named once), or one phrase when each of them is
    its config's argument (glue.py:cola -> 'cola')."""
    lines, from_argument = [], []
    for _, base, members in columns:
        base_value = values[base].get(key, KeyError)
        groups: dict[str, list[str]] = {}
        for spec in members:
            value = values[spec].get(key, KeyError)
            if spec == base or value is KeyError or value == base_value:
                continue
            groups.setdefault(fmt(value), []).append(spec)
        differing = [s for specs in groups.values() for s in specs]
        if differing and all(values[s][key] == _arg(s) for s in differing):
            from_argument.append(f"`{differing[0]}`: {code(values[differing[0]][key])}")
            continue
        for value, specs in groups.items():
            names = []
            for spec in specs:
                whole = [s for s in SPECS if _file(s) == _file(spec)]
                name = _file(spec) if set(whole) <= set(specs) else spec
                if name not in names:
                    names.append(name)
            lines.append(", ".join(names) + f": `{value}`")
    if from_argument:
        lines.append("the config's argument (" + ", ".join(from_argument) + ")")
    return lines


def table(section: str, columns, values, descriptions) -> list[str]:
    keys = sorted({k.split(".", 1)[1] for spec in values for k in values[spec]
                   if k.startswith(section + ".")},
                  key=lambda k: _order(f"{section}.{k}", descriptions))
    columns = [c for c in columns if any(f"{section}.{k}" in values[s] for s in c[2]
                                          for k in keys)]
    out = ["| key | " + " | ".join(title for title, _, _ in columns) + " | description |",
           "|---" * (len(columns) + 2) + "|"]
    notes, long = [], []
    for key in keys:
        full = f"{section}.{key}"
        row = [f"`{key}`"]
        for _, base, _ in columns:
            if full not in values[base]:
                row.append("")
                continue
            text = fmt(values[base][full])
            if len(text) > LONG_VALUE:
                long.append((full, base, text))
                row.append("below")
            else:
                row.append(f"`{text}`")
        row.append(descriptions.get(full, ""))
        out.append("| " + " | ".join(cell(c) for c in row) + " |")
        diff = differences(full, columns, values)
        if diff:
            notes.append(f"- `{key}`: " + "; ".join(diff) + ".")
    if notes:
        out += ["", "Other configs:", ""] + notes
    shown = set()
    for full, base, text in long:
        if (full, text) in shown:  # the same value in another column
            continue
        shown.add((full, text))
        value = values[base][full]
        same = [b for _, b, _ in columns if values[b].get(full, KeyError) == value]
        where = "every config" if len(same) == len(columns) else f"`configs/{base}`"
        out += ["", f"`{full}` in {where}:", ""]
        if isinstance(value, (list, tuple)):
            out += [f"    {fmt(item)}," for item in value]
        else:
            out.append(f"    {text}")
    return out


def _order(full: str, descriptions) -> tuple:
    """Keys in the order of docs/config_keys.py (the configs' own order); others last."""
    order = list(descriptions)
    return (order.index(full), "") if full in order else (len(order), full)


def _where(section: str, values) -> str:
    pre = any(section in values[s] for s in PRETRAINING)
    fine = any(section in values[s] for s in FINETUNING)
    return ("Every config has this section." if pre and fine else
            "Pre-training configs have this section." if pre else
            "Fine-tuning configs have this section.")


def wrap(text: str) -> list[str]:
    return textwrap.wrap(text, 92, break_long_words=False, break_on_hyphens=False)


def summary(spec: str) -> str:
    """The first line of a config file's docstring."""
    path = REPO / "configs" / _file(spec)
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = doc.strip().splitlines()[0].rstrip(":") if doc.strip() else ""
    return first if not first or first.endswith(".") else first + "."


HEAD = """\
# Configuration reference

<!-- Generated by `python docs/make_config_reference.py` from configs/*.py and
docs/config_keys.py (the descriptions): edit those and run it; do not edit this page. -->

    python launch/train.py --config=configs/bert_tiny.py --workdir=/tmp/bert_tiny \\
        --config.train.steps=600 --config.schedule.lr=1e-3
    python launch/train.py --config=configs/glue.py:rte --config.sweep.restarts=5 --print_config

A config is a plain Python file, `configs/<name>.py[:argument]`, whose `get_config` returns
a locked `ml_collections.ConfigDict`. Any key below is overridden on the command line with
`--config.<section>.<key>=<value>`. `--print_config` prints the resolved config, overrides
applied, and exits. From Python, `bert_jax.train.config.load_config("configs/bert_tiny.py",
{"train.steps": 600})` does the same as the first command's flags.

An unknown key is an error that names the closest existing key: `--config.train.stepz=3`
stops with `unknown config key 'train.stepz' (did you mean 'train.steps'?)`. A key that moved
names its new place:
"""


def render(configs=None, descriptions=None) -> str:
    configs = load_all() if configs is None else configs
    descriptions = _descriptions() if descriptions is None else descriptions
    values = {spec: flat(config) for spec, config in configs.items()}
    lines = HEAD.splitlines() + ["", "| old key | new key |", "|---|---|"]
    lines += [f"| `{old}` | `{new}` |" for old, new in RENAMED.items()]
    lines += ["", "## Configs", "", "| config | arguments | what |", "|---|---|---|"]
    for name in dict.fromkeys(_file(s) for s in SPECS):
        args = [_arg(s) for s in SPECS if _file(s) == name and _arg(s)]
        lines.append(f"| `configs/{name}` | {', '.join(f'`{a}`' for a in args) or '-'} | "
                     f"{cell(summary(name))} |")
    sections = SECTIONS + sorted({k.split(".")[0] for v in values.values() for k in v}
                                 - set(SECTIONS))
    pre, fine = ([s for s in sections if any(s in values[c] for c in family)]
                 for family in (PRETRAINING, FINETUNING))
    lines += [""] + wrap(
        f"Pre-training configs have the sections {', '.join(pre)}; fine-tuning configs "
        f"{', '.join(fine)}. In the tables below, a column shows one config's values "
        f"(pre-training: `configs/{FAMILIES[0][1]}`; fine-tuning: `configs/{FAMILIES[1][1]}`; "
        f"task: one config per kind); the values where other configs differ are listed under "
        f"the table.")
    for section in sections:
        columns = TASK_KINDS if section == "task" else FAMILIES
        lines += ["", f"## {section}", ""]
        lines += wrap(f"{descriptions.get(section, '')} {_where(section, values)}") + [""]
        lines += table(section, columns, values, descriptions)
    return "\n".join(lines) + "\n"


def check(page: Path | None = None) -> str:
    """The unified diff between the committed page (`page`, default PAGE) and the
    generator's output; '' if they are the same."""
    page = PAGE if page is None else page
    want = render()
    have = page.read_text(encoding="utf-8") if page.exists() else ""
    return "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                        "docs/configuration.md (committed)",
                                        "docs/configuration.md (generated)"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 with a diff when docs/configuration.md is stale")
    args = parser.parse_args(argv)
    configs, descriptions = load_all(), _descriptions()
    problems = [f"no description in docs/config_keys.py: {k}"
                for k in undocumented(configs, descriptions)]
    problems += [f"described in docs/config_keys.py but in no config: {k}"
                 for k in stale(configs, descriptions)]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if args.check:
        diff = check()
        if diff:
            sys.stdout.write(diff)
            print("docs/configuration.md is stale: run python docs/make_config_reference.py",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(render(configs, descriptions), encoding="utf-8")
    print(f"wrote {os.path.relpath(PAGE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
