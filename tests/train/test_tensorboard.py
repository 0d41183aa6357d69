"""What `tensorboard --logdir WORKDIR` shows of a run, read with TensorBoard's own loaders
(tensorboard is in the test extra): the scalars of metrics.jsonl, step for step, and the
trace of train.profile_steps where the profile tab looks for it; with xprof installed (the
[tensorboard] extra), the profile plugin itself lists it."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from bert_jax.tasks import pretraining
from tests.train.common import MemorySource, tiny_config

event_multiplexer = pytest.importorskip(
    "tensorboard.backend.event_processing.event_multiplexer",
    reason="pip install -e '.[tensorboard]'")


def test_tensorboard_reads_the_runs_scalars_and_finds_its_profile(tmp_path):
    from tensorboard.backend.event_processing import plugin_asset_util

    config = tiny_config(steps=4)
    config.train.tensorboard = True
    config.train.profile_start, config.train.profile_steps = 1, 2
    pretraining.run(config, str(tmp_path), make_train_data=lambda c, w: MemorySource(8),
                    make_eval_data=lambda c, w: None)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    jsonl = {}
    for record in records:
        for tag, value in record.items():
            if tag != "step":
                jsonl.setdefault(tag, []).append((record["step"], value))
    assert [step for step, _ in jsonl["train/loss"]] == [1, 2, 3, 4]

    # As `tensorboard --logdir WORKDIR` loads it: every run (directory of event files) under it.
    multiplexer = event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    assert list(multiplexer.Runs()) == ["tensorboard"]
    scalars = multiplexer.Runs()["tensorboard"]["scalars"]
    assert sorted(scalars) == sorted(jsonl)
    for tag, expected in jsonl.items():
        events = multiplexer.Scalars("tensorboard", tag)
        assert [e.step for e in events] == [step for step, _ in expected], tag
        # Event files hold float32; metrics.jsonl the float64 the step computed.
        np.testing.assert_array_equal(np.float32([e.value for e in events]),
                                      np.float32([v for _, v in expected]), err_msg=tag)
    losses = [e.value for e in multiplexer.Scalars("tensorboard", "train/loss")]
    assert np.all(np.isfinite(losses)) and len(set(losses)) == 4  # real, changing values

    # The profile tab: run WORKDIR/profile, one session under plugins/profile/ holding the
    # jax.profiler trace (<host>.xplane.pb), which is what the profile plugin lists.
    sessions = plugin_asset_util.ListAssets(str(tmp_path / "profile"), "profile")
    assert len(sessions) == 1, sessions
    session = tmp_path / "profile" / "plugins" / "profile" / sessions[0]
    assert len(list(session.glob("*.xplane.pb"))) == 1, sorted(session.iterdir())
    if importlib.util.find_spec("xprof") is None:
        return  # the test extra has TensorBoard; xprof comes with [tensorboard]
    # xprof, TensorBoard's profile plugin, as `tensorboard --logdir WORKDIR` starts it: it
    # lists the trace as run profile/<session> and offers its tools (trace viewer, ...).
    import types

    from tensorboard.plugins import base_plugin
    from xprof import profile_plugin

    plugin = profile_plugin.ProfilePlugin(base_plugin.TBContext(
        logdir=str(tmp_path), flags=types.SimpleNamespace(master_tpu_unsecure_channel="")))
    assert list(plugin.generate_runs()) == [f"profile/{sessions[0]}"]
    tools = plugin.run_tools_imp(f"profile/{sessions[0]}")
    assert "overview_page" in tools and any(t.startswith("trace_viewer") for t in tools), tools
