"""bert_jax/train/checked.py: a run config's checks in one place, once per run; the values
the loop takes from them."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from bert_jax.models.config import ConfigError
from bert_jax.train.checked import Checked, check
from tests.train.common import tiny_config


def test_the_values_a_checked_config_gives():
    config = tiny_config(batch_size=8, train=dict(accum_steps=2, eval_batch_size=0,
                                                  init_extend_positions="repeat"),
                         checkpoint=dict(every=0))
    c = check(config)
    n = jax.device_count()
    assert dict(c.mesh.shape) == {"data": n, "fsdp": 1, "tensor": 1}
    assert c.batch_sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
    assert c.replicated.spec == jax.sharding.PartitionSpec()
    assert (c.checkpoint_every, c.accum_steps) == (0, 2)
    assert (c.resize.positions, c.resize.vocab, c.resize.active) == ("repeat", "", True)
    assert [tuple(r) for r in c.rules][0][0] == "batch"
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.checkpoint_every = 5


def test_batch_rules_decide_the_batch_shards():
    """The batch's mesh axes come from mesh.rules: a rule giving "batch" no mesh axis leaves
    the batch whole on every device."""
    config = tiny_config()
    config.mesh.rules = [["batch", None] if r[0] == "batch" else r for r in config.mesh.rules]
    c = check(config)
    assert c.batch_sharding.spec == jax.sharding.PartitionSpec(None)


@pytest.mark.parametrize("key, value, message", [
    ("train.bogus", 1, r"unknown config key 'train.bogus'"),
    ("checkpoint.every", -1, r"config.checkpoint.every=-1: expected N > 0"),
    ("checkpoint.timeout", 0, r"config.checkpoint.timeout=0: expected a number of seconds"),
    ("train.heartbeat_timeout", True, r"config.train.heartbeat_timeout=True: expected a "
                                      r"number of seconds > 0"),
    ("train.init_extend_vocab", "avg", r"config.train.init_extend_vocab='avg'; expected ''"),
    ("train.init_state", "all", r"config.train.init_state='all'; expected 'params' or 'full'"),
    ("train.accum_steps", 0, r"config.train.accum_steps=0: expected a positive number"),
    ("train.accum_steps", 3, r"config.train.batch_size=8 is not divisible by "
                             r"config.train.accum_steps=3"),
    ("optimizer.name", "sgd", r"config.optimizer.name='sgd'; expected one of"),
    ("optimizer.layer_decay", 0.0, r"config.optimizer.layer_decay=0.0; expected 0 <"),
    ("mesh.tensor", 3, r"config.mesh"),
])
def test_each_check_names_its_key(key, value, message):
    config = tiny_config()
    section, name = key.split(".")
    config[section][name] = value
    with pytest.raises(ConfigError, match=message):
        check(config)


def test_a_warmup_ratio_out_of_range():
    config = tiny_config()
    config.schedule.warmup_steps = -1
    config.schedule.warmup_ratio = 1.5
    with pytest.raises(ConfigError, match=r"config.schedule.warmup_ratio=1.5: expected 0 <="):
        check(config)


def test_the_loop_takes_the_checked_values_it_is_given(monkeypatch, tmp_path):
    """loop.train with `checked` runs no check of its own (a sweep's runs share one); without
    it, it checks the config itself."""
    from bert_jax.train import loop

    calls = []
    monkeypatch.setattr(loop, "check", lambda config: calls.append(config) or check(config))

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(loop, "check_task", stop)  # the first thing after the check
    config = tiny_config()
    checked = check(config)
    assert isinstance(checked, Checked)
    with pytest.raises(Stop):
        loop.train(config, str(tmp_path / "a"), task=None, checked=checked)
    assert calls == []
    with pytest.raises(Stop):
        loop.train(config, str(tmp_path / "b"), task=None)
    assert calls == [config]
