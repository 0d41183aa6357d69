"""train.init_checkpoint = one of our pre-training workdirs: the latest step's encoder params
(restored onto the fine-tuning mesh) and its model config; a size mismatch fails before any
compile, naming the tensor and both shapes."""

from __future__ import annotations

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax.convert.sources import open_source
from bert_jax.tasks import finetune
from bert_jax.train import loop
from bert_jax.train.checked import run_model
from tests.tasks.finetune_common import prepared, tiny_pairs_config

# _saved_bert reads the checkpoint back as numpy (no target shardings): expected.
pytestmark = pytest.mark.filterwarnings("ignore:Sharding info not provided")


@pytest.fixture(scope="module")
def pretrain_workdir(tmp_path_factory, compile_cache):
    """2 steps of the pre-training loop (bert_jax.train.loop, as launch/train.py runs it) on
    the tiny test model with BERT's 30,522-token vocabulary and scanned layers, both steps
    saved."""
    from bert_jax.tasks import pretraining
    from tests.train.common import memory_data, tiny_config

    workdir = tmp_path_factory.mktemp("pretrain")
    config = tiny_config(steps=2)
    config.model.vocab_size = 30522
    config.model.scan_layers = True
    config.train.tensorboard = False
    config.checkpoint.every = 1  # steps 1 and 2 saved
    pretraining.run(config, str(workdir), make_train_data=memory_data,
               make_eval_data=lambda c, w: None)
    return workdir


def _saved_bert(workdir, step):
    with ocp.PyTreeCheckpointer() as ckptr:
        tree = ckptr.restore(str(workdir / "checkpoints" / str(step) / "state"))
    return flax.traverse_util.flatten_dict(tree["params"]["bert"])


def _config(workdir):
    from bert_jax.models.config import model_config

    config = tiny_pairs_config(steps=2)
    config.model = model_config()  # the architecture comes from the checkpoint
    config.train.init_checkpoint = str(workdir)
    return config


def test_model_section_set_beside_a_checkpoint_is_an_error(pretrain_workdir):
    from bert_jax.models.config import ConfigError

    config = _config(pretrain_workdir)
    config.model.dropout_rng = "jax"      # meant for the run, but config.model is not read
    config.model.hidden_size = 32         # what the checkpoint has anyway: fine
    with pytest.raises(ConfigError) as err:
        run_model(config)
    msg = str(err.value)
    assert "config.model.dropout_rng='jax' (the run uses 'hash')" in msg
    assert "hidden_size" not in msg and "config.model_overrides.<key>" in msg
    assert str(pretrain_workdir) in msg

    config.model.dropout_rng = "hash"
    config.model.hidden_dropout_prob = 0.2  # model_overrides' 0.1 wins: also an error
    with pytest.raises(ConfigError, match=r"config.model.hidden_dropout_prob=0.2 \(the run uses 0.1\)"):
        run_model(config)
    config.model.hidden_dropout_prob = 0.1
    config.model_overrides.scan_layers = False  # the workdir was saved scanned
    with pytest.raises(ConfigError, match="saved with scan_layers=True"):
        run_model(config)
    config.model_overrides.scan_layers = None
    config.lock()  # as launch/train.py's config flag: only existing keys can be set
    config.model_overrides.dropout_rng = "jax"
    config.model_overrides.remat = "full"
    bert_config = run_model(config)[0]
    # dtype is the run's (model_overrides.dtype=auto), whatever the checkpoint names
    assert (bert_config.dropout_rng, bert_config.remat, bert_config.dtype) == (
        "jax", "full", "auto")


def test_encoder_params_equal_the_checkpoints(pretrain_workdir):
    source = open_source(str(pretrain_workdir / "checkpoints"))
    assert (source.kind, source.step) == ("workdir", 2)
    assert source.config.hidden_size == 32 and source.config.num_hidden_layers == 2
    assert source.config.vocab_size == 30522 and source.config.scan_layers
    assert source.saved_shapes["bert/encoder/layers/intermediate/kernel"] == (2, 32, 64)

    config = _config(pretrain_workdir)
    bert_config, source, _ = run_model(config)
    assert bert_config.scan_layers and bert_config.hidden_dropout_prob == 0.1
    task, checked, programs = prepared(config)
    state, _ = loop.fresh_state(config, task, programs, checked)

    got = flax.traverse_util.flatten_dict(jax.device_get(state.params["bert"]))
    want = _saved_bert(pretrain_workdir, 2)
    assert sorted(got) == sorted(want) and len(got) > 10
    for key in want:
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]),
                                      err_msg="/".join(key))
    # ...trained weights, not a fresh init: step 2 differs from a fresh seed-0 init.
    task.init_source = None
    fresh, _ = loop.fresh_state(config, task, programs, checked)
    fresh_kernel = np.asarray(fresh.params["bert"]["encoder"]["layers"]["intermediate"]["kernel"])
    assert not np.array_equal(fresh_kernel, want[("encoder", "layers", "intermediate", "kernel")])
    # The head is new and the optimizer state fresh (all moments zero).
    assert state.params["classifier"]["dense"]["kernel"].shape == (32, 2)
    moments = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.device_get(state.opt_state))
               if np.asarray(x).dtype == np.float32 and np.asarray(x).ndim > 0]
    assert moments and all(not m.any() for m in moments)


def test_encoder_from_a_chosen_step(pretrain_workdir):
    """WORKDIR/checkpoints/<step> loads that step's encoder, not the latest; a step that was
    not saved is an error listing the saved ones."""
    config = _config(pretrain_workdir / "checkpoints" / "1")
    task, checked, programs = prepared(config)
    assert (task.init_source.kind, task.init_source.step) == ("workdir", 1)
    state, _ = loop.fresh_state(config, task, programs, checked)
    got = flax.traverse_util.flatten_dict(jax.device_get(state.params["bert"]))
    want, latest = _saved_bert(pretrain_workdir, 1), _saved_bert(pretrain_workdir, 2)
    key = ("encoder", "layers", "intermediate", "kernel")
    assert not np.array_equal(want[key], latest[key])
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]),
                                      err_msg="/".join(k))
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at step 5 in .*checkpoints; "
                                                r"saved steps: \[1, 2\]"):
        open_source(str(pretrain_workdir / "checkpoints" / "5"))


def test_finetune_from_pretraining_workdir_end_to_end(pretrain_workdir, tmp_path):
    config = _config(pretrain_workdir)
    config.sweep.save_best_model = True
    summary = finetune.run(config, str(tmp_path), progress=False)
    assert summary["runs"] == 1 and 0.0 <= summary["dev/accuracy_mean"] <= 1.0
    # best_model/ is a model directory with the layers unstacked, whose encoder is the
    # checkpoint's moved by 2 fine-tuning steps.
    source = open_source(str(tmp_path / "best_model"))
    assert source.kind == "model_dir" and not source.config.scan_layers
    kernel = source.params["bert"]["encoder"]["layer_1"]["intermediate"]["kernel"]
    before = _saved_bert(pretrain_workdir, 2)[("encoder", "layers", "intermediate", "kernel")][1]
    assert kernel.shape == (32, 64) and 0 < np.abs(kernel - before).max() < 0.05


def test_size_mismatch_fails_before_compiling(pretrain_workdir, tmp_path, monkeypatch):
    config = _config(pretrain_workdir)
    config.model_overrides.intermediate_size = 128

    def no_training(*args, **kwargs):
        raise AssertionError("reached training: the shape check came too late")

    monkeypatch.setattr(loop, "build", no_training)
    with pytest.raises(ValueError, match=r"bert/encoder/layers/intermediate/bias has shape "
                                         r"\(2, 64\) in the checkpoint, the model expects "
                                         r"\(2, 128\)"):
        finetune.run(config, str(tmp_path), progress=False)


def test_not_a_checkpoint_is_a_clear_error(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        open_source(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="nor a training run"):
        open_source(str(tmp_path / "checkpoints" / "nothing"))


def test_model_section_under_an_override_is_an_error_without_a_checkpoint():
    from bert_jax.models.config import ConfigError

    config = tiny_pairs_config(steps=2)  # random init from config.model
    assert run_model(config)[0].hidden_size == 32
    config.model.attention_probs_dropout_prob = 0.3  # model_overrides' 0.1 would win
    with pytest.raises(ConfigError, match=r"config.model: .*which wins, so "
                       r"config.model.attention_probs_dropout_prob=0.3 \(the run uses 0.1\)"):
        run_model(config)
    config.model_overrides.attention_probs_dropout_prob = 0.3
    assert run_model(config)[0].attention_probs_dropout_prob == 0.3
