"""The repository's own contracts: CI runs the README's test command; configs load."""

import re

import pytest

from bert_jax.models import BertConfig
from bert_jax.models.config import from_config_dict
from tests.conftest import REPO, load_script


def _readme_test_command() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("Install and run the tests", 1)[1]
    return re.search(r"^ {6,}(python -m pip install .*)$", section, re.M).group(1).strip()


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert _readme_test_command() in ci.splitlines()


def test_the_test_command_installs_tensorflow_text():
    """tests/convert/test_savedmodel.py skips the string signatures without tensorflow-text;
    the suite's own install must have it, at the pinned version, so that CI runs them."""
    command = _readme_test_command()
    assert "--no-deps -c constraints.txt tensorflow-text" in command
    pins = (REPO / "constraints.txt").read_text().splitlines()
    assert any(re.fullmatch(r"tensorflow-text==[\d.]+", line) for line in pins)


@pytest.mark.parametrize("name, layers, hidden", [
    ("bert_tiny", 2, 128), ("bert_base", 12, 768), ("bert_large", 24, 1024)])
def test_model_configs(name, layers, hidden):
    module = load_script(f"configs/{name}.py")
    config = from_config_dict(module.get_config().model)
    assert isinstance(config, BertConfig)
    assert (config.num_hidden_layers, config.hidden_size) == (layers, hidden)
    assert config.intermediate_size == 4 * hidden  # the paper's FFN size


def test_load_config_is_locked_with_dotted_overrides(tmp_path, monkeypatch):
    """bert_jax.train.config.load_config: what `--config=FILE[:arg] --config.a.b=v` does on
    the command line, for notebooks and Python callers."""
    from bert_jax.models.config import ConfigError
    from bert_jax.train.config import load_config

    monkeypatch.chdir(tmp_path)  # a path not under the working directory: the repository's
    config = load_config("configs/glue.py:sst2", {"train.epochs": 1.5,
                                                  "task.data_dir": "glue/SST-2"})
    assert (config.task.name, config.train.epochs) == ("sst2", 1.5)
    assert config.task.data_dir == "glue/SST-2"
    assert load_config("configs/bert_base.py:phase2").data.max_seq_length == 512
    with pytest.raises(ConfigError, match=r"^configs/bert_tiny.py: unknown config key "
                                          r"'train.stepz' \(did you mean 'train.steps'\?\)$"):
        load_config("configs/bert_tiny.py", {"train.stepz": 3})
    # The closest key: the same name in another section first, else the spelling.
    with pytest.raises(ConfigError, match=r"'optimizer.lr' \(did you mean 'schedule.lr'\?\)"):
        load_config("configs/bert_tiny.py", {"optimizer.lr": 3e-4})
    with pytest.raises(ConfigError, match=r"'trian.steps' \(did you mean 'train.steps'\?\)"):
        load_config("configs/bert_tiny.py", {"trian.steps": 3})
    with pytest.raises(TypeError, match="steps"):
        load_config("configs/bert_tiny.py", {"train.steps": "many"})
    with pytest.raises((AttributeError, KeyError), match="locked"):
        config.train.stepz = 3
    with pytest.raises(FileNotFoundError, match="configs/nope.py not found .* the configs are "
                                                "configs/bert_base.py, configs/bert_large.py"):
        load_config("configs/nope.py")


@pytest.mark.parametrize("spec, old, new", [
    ("configs/glue.py:sst2", "train.max_steps", "train.steps"),
    ("configs/glue.py:sst2", "train.num_epochs", "train.epochs"),
    ("configs/squad.py:1.1", "train.num_restarts", "sweep.restarts"),
    ("configs/ner.py", "schedule.lr_grid", "sweep.lrs"),
    ("configs/swag.py", "checkpoint.delete_finished", "sweep.delete_finished"),
    ("configs/bert_tiny.py", "data.batch_size", "train.batch_size"),
    ("configs/bert_base.py", "data.eval_batch_size", "train.eval_batch_size")])
def test_a_moved_key_names_its_new_place(spec, old, new, tmp_path):
    """One config schema for pre-training and fine-tuning: an old key is one line naming
    the new one, given as an override or set by a config file of the user's own."""
    from bert_jax.models.config import ConfigError
    from bert_jax.train.config import load_config

    message = rf"config.{old} is now config.{new}$"
    with pytest.raises(ConfigError, match=message):
        load_config(spec, {old: 1})
    own = tmp_path / "my_config.py"
    section, key = old.split(".")
    own.write_text(f"import importlib.util\n"
                   f"spec = importlib.util.spec_from_file_location('c', {str(REPO / spec.split(':')[0])!r})\n"
                   f"base = importlib.util.module_from_spec(spec)\n"
                   f"spec.loader.exec_module(base)\n\n\n"
                   f"def get_config(arg=None):\n"
                   f"    config = base.get_config(*([{spec.partition(':')[2]!r}] if "
                   f"{spec.partition(':')[2]!r} else []))\n"
                   f"    config.{section}.{key} = 1\n"
                   f"    return config\n")
    with pytest.raises(ConfigError, match=message):
        load_config(str(own))


def _setup_cfg_requirements() -> dict:
    """{where: [Requirement]} for install_requires and each extra of setup.cfg."""
    import configparser

    from packaging.requirements import Requirement

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    sections = {"install_requires": cfg["options"]["install_requires"]}
    sections.update({f"[{k}]": v for k, v in cfg["options.extras_require"].items()})
    return {where: [Requirement(line) for line in text.splitlines() if line.strip()]
            for where, text in sections.items()}


def _constraints() -> dict:
    """{canonical name: (line, Version)} of constraints.txt, whose lines are name==version."""
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            match = re.fullmatch(r"([A-Za-z0-9._-]+)==([0-9][^\s;+]*)", line)
            assert match, f"constraints.txt: {line!r} is not name==version (no local +tag)"
            name = canonicalize_name(match.group(1))
            assert name not in pins, f"constraints.txt pins {name} twice"
            pins[name] = (line, Version(match.group(2)))
    return pins


def test_constraints_pin_every_requirement_inside_its_range():
    """CI installs with constraints.txt: each package setup.cfg names (install_requires and
    every extra) is pinned there, at a version its range in setup.cfg allows."""
    from packaging.utils import canonicalize_name

    pins = _constraints()
    requirements = _setup_cfg_requirements()
    assert {"install_requires", "[test]", "[tpu]", "[gpu]", "[tensorboard]"} <= set(requirements)
    for where, reqs in requirements.items():
        for req in reqs:
            name = canonicalize_name(req.name)
            assert name in pins, f"setup.cfg {where} {req} has no line in constraints.txt"
            line, version = pins[name]
            assert req.specifier.contains(version, prereleases=True), (
                f"constraints.txt {line} is outside setup.cfg {where} {req}")
    # The bounds the code's use of moving internals needs (see setup.cfg's comment).
    bounded = {canonicalize_name(r.name): r for r in requirements["install_requires"]}
    for name in ("jax", "jaxlib", "flax", "orbax-checkpoint"):
        assert any(s.operator == "<" for s in bounded[name].specifier), bounded[name]


def test_the_test_command_installs_with_the_constraints():
    assert " -c constraints.txt " in _readme_test_command()
    # torch is named on the command line for the CPU build; the pin is the same.
    _, torch = _constraints()["torch"]
    assert f"torch=={torch} " in _readme_test_command()
