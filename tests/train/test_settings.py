"""A warm start or resume whose settings that shape no tensor differ from the checkpoint's own
(bert_jax/train/settings.py) stops before anything is read or built, in one line naming each
setting and both values; train.accept_setting_changes=True takes them on purpose."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.convert import hf
from bert_jax.convert import sources as runs_lib
from bert_jax.models.config import from_config_dict
from bert_jax.tasks import pretraining
from bert_jax.tasks.pretraining import PretrainingTask
from bert_jax.train import checkpoint as ckpt_lib
from bert_jax.train import loop
from bert_jax.train import state as state_lib
from bert_jax.train.settings import SettingsChangedError
from tests.train.common import MemorySource, tiny_config


def _hf_dir(path, config) -> str:
    """A Hugging Face folder as far as a warm start's check reads it: its config.json."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(hf.BERT.config_to(from_config_dict(config.model), {})))
    return str(path)


def _never(*args, **kwargs):
    raise AssertionError("read or built before the settings check")


def test_a_warm_start_with_other_settings_stops_naming_each(tmp_path, monkeypatch):
    source = _hf_dir(tmp_path / "hf", tiny_config())   # gelu, layer_norm_eps 1e-12
    config = tiny_config()
    config.model.update(hidden_act="gelu_new", layer_norm_eps=1e-5)
    config.train.init_checkpoint = source
    monkeypatch.setattr(runs_lib.InitSource, "params", property(_never))
    with pytest.raises(SettingsChangedError) as err:
        pretraining.run(config, str(tmp_path / "run"), make_train_data=_never)
    assert str(err.value) == (
        f"config.train.init_checkpoint={source}: settings that shape no tensor differ from "
        f"the checkpoint's own, which its weights were trained with: hidden_act is 'gelu' "
        f"there, 'gelu_new' in the config (model.hidden_act); layer_norm_eps is 1e-12 there, "
        f"1e-05 in the config (model.layer_norm_eps); set them as the checkpoint's, or pass "
        f"--config.train.accept_setting_changes=True to train with the config's")
    assert err.value.exit_code == 2
    assert not (tmp_path / "run").exists()

    config.train.accept_setting_changes = True
    task = PretrainingTask(config, str(tmp_path / "run"))
    assert task.init_changes == ["hidden_act: 'gelu' -> 'gelu_new'",
                                 "layer_norm_eps: 1e-12 -> 1e-05"]
    config.model.update(hidden_act="gelu", layer_norm_eps=1e-12)  # the checkpoint's own
    config.train.accept_setting_changes = False
    assert PretrainingTask(config, str(tmp_path / "run")).init_changes == []


def test_a_resume_with_other_settings_stops_before_restoring(tmp_path, monkeypatch):
    config = tiny_config()
    pieces = state_lib.TrainState(step=jnp.asarray(5, jnp.int32),
                                  params={"bert": {"w": np.zeros(2)}}, opt_state={})
    saver = ckpt_lib.Checkpointer(str(tmp_path), every=1)
    saver.save(pieces, jax.random.key(0), MemorySource(8), loop.config_to_dict(config),
               force=True)
    saver.close()
    config.model.pre_ln = True
    monkeypatch.setattr(ckpt_lib.Checkpointer, "restore", _never)
    with pytest.raises(SettingsChangedError) as err:
        pretraining.run(config, str(tmp_path), make_train_data=_never)
    assert str(err.value).startswith(
        f"{tmp_path}: resuming: settings that shape no tensor differ from the checkpoint's "
        f"own, which its weights were trained with: pre_ln is False there, True in the config "
        f"(model.pre_ln); ")


def test_fine_tuning_a_cased_checkpoint_with_a_lowercasing_tokenizer_stops(tmp_path):
    from bert_jax.convert.model_dir import save_model_dir, task_record
    from bert_jax.train.checked import run_model
    from bert_jax.train.config import load_config

    model = tiny_config().model
    from tests.tasks.conftest import VOCAB

    save_model_dir(str(tmp_path / "cased"), {"bert": {}}, from_config_dict(model),
                   vocab_file=str(VOCAB), task=task_record("pretraining", do_lower_case=False))
    config = load_config("configs/glue.py:mrpc",
                         {"train.init_checkpoint": str(tmp_path / "cased")})
    with pytest.raises(SettingsChangedError) as err:
        run_model(config)
    assert ("do_lower_case is False there, True in the config (tokenizer.do_lower_case)"
            in str(err.value)), err.value
    config.tokenizer.do_lower_case = False
    run_model(config)


def test_a_fine_tuning_resume_with_the_other_casing_stops_naming_the_tokenizer_key(tmp_path):
    """A fine-tuning run resumed with the other tokenizer casing: its task's settings (the
    casing alone: the model is its checkpoint's) against the saved run's config."""
    from bert_jax.tasks.registry import task_from_config
    from bert_jax.train.settings import CASING, check_resume
    from tests.tasks.conftest import VOCAB
    from tests.tasks.finetune_common import tiny_pairs_config

    config = tiny_pairs_config()  # tokenizer.do_lower_case=True
    pieces = state_lib.TrainState(step=jnp.asarray(2, jnp.int32),
                                  params={"bert": {"w": np.zeros(2)}}, opt_state={})
    saver = ckpt_lib.Checkpointer(str(tmp_path), every=1)
    saver.save(pieces, jax.random.key(0), MemorySource(8), loop.config_to_dict(config),
               force=True)
    saver.close()
    config.tokenizer.do_lower_case = False
    task = task_from_config(config, vocab_file=str(VOCAB))
    task.prepare(config, from_config_dict(config.model), None, [], None)
    assert task.settings == {CASING: False}
    with pytest.raises(SettingsChangedError) as err:
        check_resume(task.settings, str(tmp_path), accept=False)
    assert (f"{tmp_path}: resuming: settings that shape no tensor differ from the "
            f"checkpoint's own, which its weights were trained with: do_lower_case is True "
            f"there, False in the config (tokenizer.do_lower_case); ") in str(err.value)
    assert check_resume(task.settings, str(tmp_path), accept=True) == [
        "do_lower_case: True -> False"]
    config.tokenizer.do_lower_case = True
    task.prepare(config, from_config_dict(config.model), None, [], None)
    assert check_resume(task.settings, str(tmp_path), accept=False) == []
