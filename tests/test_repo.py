"""The repository's own contracts: CI runs the README's test command; configs load."""

import importlib.util
import re

import pytest

from bert_jax.models import BertConfig
from bert_jax.models.config import from_config_dict
from tests.conftest import REPO


def _readme_test_command() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("Install and run the tests", 1)[1]
    return re.search(r"^ {6,}(python -m pip install .*)$", section, re.M).group(1).strip()


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert _readme_test_command() in ci.splitlines()


@pytest.mark.parametrize("name, layers, hidden", [
    ("bert_tiny", 2, 128), ("bert_base", 12, 768), ("bert_large", 24, 1024)])
def test_model_configs(name, layers, hidden):
    spec = importlib.util.spec_from_file_location(name, REPO / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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
    config = load_config("configs/glue.py:sst2", {"train.num_epochs": 1.5,
                                                  "task.data_dir": "glue/SST-2"})
    assert (config.task.name, config.train.num_epochs) == ("sst2", 1.5)
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
