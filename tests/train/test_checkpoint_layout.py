"""Restoring a checkpoint with another number of processes, in process (fast): the data
states of the saved layout are taken apart by `bert_jax.data.state.restore_input`, and a
Checkpointer whose data item was written by "2 processes" restores onto 1.

The real thing (2 jax.distributed processes -> 1 -> 2) is test_layout_processes.py (slow).
"""

from __future__ import annotations

import logging
import os
import time

import jax
import numpy as np
import pytest

from bert_jax import sharding as sharding_lib
from bert_jax.data import device as data_device
from bert_jax.data import pretrain
from bert_jax.data import state as state_lib
from bert_jax.train import checkpoint as ckpt_lib
from tests.train.common import MemorySource, tiny_config, tiny_state

LOGGER = "bert_jax.data.state"


def _synthetic_cfg(**kw):
    base = dict(source="synthetic", max_seq_length=16,
                max_predictions_per_seq=3, vocab_size=64, seed=3)
    base.update(kw)
    return pretrain.data_config(**base)


def _iterator(index, count, **kw):
    return pretrain.train_iterator(_synthetic_cfg(**kw), 8, process_index=index,
                                   process_count=count)


def _save_layout(directory, count: int, batches: int, **kw):
    """Each of `count` hosts has produced `batches` batches; its state file as a
    `count`-process run writes it."""
    for i in range(count):
        it = _iterator(i, count, **kw)
        for _ in range(batches):
            next(it)
        state_lib.save_state(state_lib.state_file(directory, i, count), it.get_state())


def _same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_same_process_count_is_exact_and_silent(tmp_path, caplog):
    _save_layout(tmp_path, 2, 5)
    it = _iterator(1, 2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = state_lib.restore_input(tmp_path, it, process_index=1, process_count=2)
    assert out.exact and out.position is None and out.reason is None
    assert it.batches == 5
    assert not caplog.records


@pytest.mark.parametrize("saved,now,index", [(2, 1, 0), (1, 2, 1), (4, 2, 0)])
def test_other_process_count_seeks_to_the_consumed_batches(tmp_path, caplog, saved, now,
                                                           index):
    _save_layout(tmp_path, saved, 5)
    it = _iterator(index, now)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = state_lib.restore_input(tmp_path, it, process_index=index, process_count=now,
                                      fallback_batches=999)
    assert not out.exact
    assert out.position == 5                 # from the saved batch count, not the fallback
    assert f"saved by {saved} process(es)" in out.reason and f"restored by {now}" in out.reason
    # The next batch is batch 5 of this host's own stream in the new layout (5 x the global
    # batch counted as consumed) ...
    _same(next(it), _iterator(index, now).batch(5))
    # ... and the warning says exactly that, and that it is not exact. Process 0 logs only.
    if index == 0:
        text = caplog.text
        assert "NOT an exact resume" in text
        assert f"each of the {now} process(es) skips the first 5 batches" in text
        assert "may repeat" in text and "skipped" in text
    else:
        assert not caplog.records


def test_prefetched_batches_are_not_counted_as_consumed(tmp_path):
    """A DevicePrefetcher's state holds batches pulled but not yet trained on: the fallback
    position is what the loop had taken (3), not what the host iterator produced."""
    mesh = sharding_lib.make_mesh(tiny_config().mesh, jax.devices()[:1])
    sharding = data_device.batch_sharding(mesh)
    pf = data_device.DevicePrefetcher(_iterator(0, 2), sharding, size=3)
    for _ in range(3):
        next(pf)
    time.sleep(0.5)                          # let the thread fill its queue
    state = pf.get_state()
    pf.close()
    meta = state_lib.unpack_meta(state)
    assert meta["batches"] == 6 and meta["prefetched"] == 3, meta
    assert state_lib.consumed_batches(state) == 3
    state_lib.save_state(state_lib.state_file(tmp_path, 0, 2), state)

    new = data_device.DevicePrefetcher(_iterator(0, 1), sharding, size=2)
    next(new)                                # a running prefetcher is reset, not appended to
    out = state_lib.restore_input(tmp_path, new, process_index=0, process_count=1)
    assert out.position == 3
    _same(next(new), _iterator(0, 1).batch(3))
    _same(next(new), _iterator(0, 1).batch(4))
    new.close()


def test_refused_state_of_the_same_count_falls_back_too(tmp_path, caplog):
    """Same file name, but a pipeline that refuses it (here another data seed)."""
    _save_layout(tmp_path, 1, 4, seed=1)
    it = _iterator(0, 1, seed=2)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = state_lib.restore_input(tmp_path, it, process_index=0, process_count=1)
    assert not out.exact and out.position == 4
    assert "does not fit this pipeline" in out.reason
    _same(next(it), _iterator(0, 1, seed=2).batch(4))
    assert "NOT an exact resume" in caplog.text


def test_state_without_batch_count_uses_the_step_and_no_seek_restarts(tmp_path, caplog):
    # An iterator state that records no batch count: the caller's step decides.
    state_lib.save_state(state_lib.state_file(tmp_path, 0, 2),
                         {"meta": state_lib.pack_meta({"kind": "custom"})})
    src = MemorySource(8)
    out = state_lib.restore_input(tmp_path, src, fallback_batches=7, process_index=0,
                                  process_count=1)
    assert out.position == 7 and src.index == 7
    assert "the checkpoint's step" in caplog.text

    # An iterator without seek(): warned, left at its start, never an error.
    class NoSeek:
        def set_state(self, state):
            raise AssertionError("not called: the layout differs")

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = state_lib.restore_input(tmp_path, NoSeek(), fallback_batches=7,
                                      process_index=0, process_count=1)
    assert not out.exact and out.position == 0
    assert "has no seek()" in caplog.text and "starts from its beginning" in caplog.text

    # No state at all in the item: the step again.
    empty = tmp_path / "empty"
    empty.mkdir()
    src = MemorySource(8)
    out = state_lib.restore_input(empty, src, fallback_batches=4, process_index=0,
                                  process_count=1)
    assert out.position == 4 and "holds no input-iterator state" in out.reason


def test_without_an_iterator_nothing_moves_and_nothing_is_logged(tmp_path, caplog):
    """Warm starts and fine-tuning restore without an iterator: no error, no warning."""
    _save_layout(tmp_path, 2, 5)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = state_lib.restore_input(tmp_path, None, process_index=0, process_count=1)
    assert not out.exact and out.position == 5
    assert not caplog.records


def test_checkpointer_restores_a_two_process_checkpoint_onto_one(tmp_path, caplog):
    """A checkpoint whose data item holds process_0-of-2 / process_1-of-2 (what a 2-process
    run writes; the arrays are global either way) restores here: step, params, optimizer
    state and RNG bit for bit, the data at the consumed position with a warning."""
    t = tiny_state(tiny_config(optimizer=dict(name="lamb")), seed=1)
    mesh, state, abstract = t["mesh"], t["state"], t["abstract"]
    # Something non-trivial in every part of the state.
    state = state.replace(step=state.step + 6, opt_state=jax.tree_util.tree_map(
        lambda x: x + 0.5 if x.dtype == np.float32 else x, state.opt_state))
    rng = jax.random.key(42)
    rep = sharding_lib.replicated(mesh)

    ckpt = ckpt_lib.Checkpointer(str(tmp_path), every=1, async_save=False)
    # The two hosts of a 2-process run had each taken 6 batches of 4 rows.
    hosts = [MemorySource(8, i, 2) for i in range(2)]
    for h in hosts:
        h.index = 6
    ckpt.save(state, rng, hosts[0], {"note": "two hosts"}, force=True)
    ckpt.wait()
    data_dir = tmp_path / "checkpoints" / "6" / "data"
    os.rename(data_dir / "process_0-of-1.npz", data_dir / "process_0-of-2.npz")
    state_lib.save_state(data_dir / "process_1-of-2.npz", hosts[1].get_state())
    ckpt.close()

    src = MemorySource(8)
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), every=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        restored, restored_rng, saved_config = ckpt.restore(abstract, src, rng_sharding=rep)
    ckpt.close()
    assert int(restored.step) == 6
    for a, b in zip(jax.tree_util.tree_leaves(ckpt_lib.to_numpy(restored)),
                    jax.tree_util.tree_leaves(ckpt_lib.to_numpy(state))):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(jax.random.key_data(restored_rng), jax.random.key_data(rng))
    assert saved_config == {"note": "two hosts"}
    assert not ckpt.data_restore.exact and ckpt.data_restore.position == 6
    assert src.index == 6          # MemorySource's global stream: the exact next batch
    assert "saved by 2 process(es)" in caplog.text and "restored by 1" in caplog.text


def test_tfrecord_streams_seek_across_layouts(tmp_path):
    """The tf.data pipeline: states of 2 hosts, restored by 1 host, put it at batch 3 of
    its own (1-host) stream, skipped before parsing."""
    from tests.data import fixtures

    fixtures.write_files(tmp_path, 4, 20, seq=32, preds=5)
    cfg = pretrain.data_config(train_files=str(tmp_path / "*.tfrecord"), max_seq_length=32,
                               max_predictions_per_seq=5, shuffle_buffer=16,
                               vocab_size=fixtures.VOCAB_SIZE)
    saved = tmp_path / "data"
    for i in range(2):
        it = pretrain.train_iterator(cfg, 8, process_index=i, process_count=2)
        for _ in range(3):
            next(it)
        state_lib.save_state(state_lib.state_file(saved, i, 2), it.get_state())
    it = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    out = state_lib.restore_input(saved, it, process_index=0, process_count=1)
    assert out.position == 3 and it.batches == 3
    fresh = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    expected = [next(fresh) for _ in range(5)][3:]
    for want in expected:
        _same(next(it), want)
