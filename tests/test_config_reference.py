"""docs/configuration.md, the configuration reference, against the configs: every key of
every config has a description in docs/config_keys.py, no description is of a key that no
config has, and the committed page is what docs/make_config_reference.py writes."""

import re
import subprocess
import sys

import pytest

from bert_jax.tasks.choice import CHOICE_FORMATS
from bert_jax.tasks.glue import GLUE_TASKS
from tests.conftest import REPO, load_script

STALE_HINT = "run `python docs/make_config_reference.py` and commit docs/configuration.md"


@pytest.fixture(scope="module")
def gen():
    return load_script("docs/make_config_reference.py")


@pytest.fixture(scope="module")
def configs(gen):
    return gen.load_all()


@pytest.fixture(scope="module")
def descriptions(gen):
    return gen._descriptions()


def test_every_config_and_argument_is_in_the_reference(gen):
    files = sorted(p.name for p in (REPO / "configs").glob("*.py"))
    assert sorted({s.split(":")[0] for s in gen.SPECS}) == files
    args = lambda name: {s.split(":")[1] for s in gen.SPECS if s.startswith(name + ":")}
    assert args("glue.py") == set(GLUE_TASKS)
    assert args("swag.py") == set(CHOICE_FORMATS)
    assert args("squad.py") == {"1.1", "2.0"}
    assert "phase2" in args("bert_base.py") and "phase2" in args("bert_large.py")
    from bert_jax.tasks.pretraining.recipes import MODERNBERT_ARGS
    for name in ("modernbert_base.py", "modernbert_large.py"):
        assert args(name) == {a for a in MODERNBERT_ARGS if a}


def test_every_key_has_a_description(gen, configs, descriptions):
    missing = gen.undocumented(configs, descriptions)
    assert not missing, ("config keys without a line in docs/config_keys.py DESCRIPTIONS: "
                         + ", ".join(missing))


def test_every_description_is_of_a_key_some_config_has(gen, configs, descriptions):
    extra = gen.stale(configs, descriptions)
    assert not extra, ("docs/config_keys.py describes keys that no config has (removed or "
                       "renamed?): " + ", ".join(extra))


def test_descriptions_are_one_table_cell(descriptions):
    for key, text in descriptions.items():
        assert text.strip() == text and text, key
        assert "\n" not in text and "|" not in text, key
        assert len(text) <= 130, f"{key}: {len(text)} characters; keep it to one short line"


def test_the_key_checks_catch_a_new_and_a_removed_key(gen, configs, descriptions):
    """A key added to a config is named as undocumented; a key no config has any more is
    named as stale."""
    ner = configs["ner.py"].copy_and_resolve_references()
    ner.unlock()
    ner.task.new_key = 1
    with_new = dict(configs, **{"ner.py": ner})
    assert gen.undocumented(with_new, descriptions) == ["task.new_key (configs/ner.py)"]
    assert gen.stale(with_new, descriptions) == []
    fewer = {k: v for k, v in descriptions.items() if k != "train.steps"}
    assert gen.undocumented(configs, fewer) == ["train.steps (configs/bert_base.py)"]
    assert gen.stale(configs, dict(descriptions, **{"train.max_steps": "x"})) == [
        "train.max_steps"]


def test_the_page_is_current(gen):
    diff = gen.check()
    assert not diff, f"docs/configuration.md is stale: {STALE_HINT}\n{diff}"


def test_the_page_shows_every_key_and_its_default(gen, configs):
    page = (REPO / "docs" / "configuration.md").read_text()
    values = gen.flat(configs["bert_tiny.py"])
    sections = {k for k in values if "." not in k}
    for section in sections:
        assert f"\n## {section}\n" in page
    for key in values:
        if "." in key:
            assert f"| `{key.split('.', 1)[1]}` |" in page, key
    # bert_tiny's own values are listed under the tables.
    assert re.search(r"\n- `steps`: [^\n]*bert_tiny\.py[^;\n]*: `2400`", page)
    assert "| `configs/glue.py` |" in page and "`stsb`" in page


def test_check_exits_1_with_a_diff_when_the_page_is_stale(gen, tmp_path, monkeypatch, capsys):
    stale_page = tmp_path / "configuration.md"
    stale_page.write_text((REPO / "docs" / "configuration.md").read_text()
                          .replace("| `steps` |", "| `stepz` |"))
    monkeypatch.setattr(gen, "PAGE", stale_page)
    assert gen.main(["--check"]) == 1
    out = capsys.readouterr()
    assert "-| `stepz` |" in out.out and "+| `steps` |" in out.out
    assert "stale" in out.err
    assert gen.main([]) == 0  # rewrites it
    assert gen.main(["--check"]) == 0


def test_the_script_runs_as_a_program():
    result = subprocess.run([sys.executable, "docs/make_config_reference.py", "--check"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
