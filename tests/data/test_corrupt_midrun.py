"""A shard whose damage the sampled check before compile cannot see (its tail is cut) is met
mid-run: the run saves the last good step, then stops with one line naming the file, the
byte offset and data.skip_corrupt; the same command with skip_corrupt resumes from there."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from bert_jax.data import pretrain
from bert_jax.data.shards import CorruptShardError
from bert_jax.errors import UserError
from tests.data import fixtures
from tests.train.common import LENGTH, PREDICTIONS, tiny_config


def cut_last_record(path) -> tuple[int, int]:
    """Cuts the file inside its last record: (byte offset of that record, good records)."""
    data = open(path, "rb").read()
    offset, count = 0, 0
    while True:
        (n,) = struct.unpack("<Q", data[offset:offset + 8])
        if offset + 16 + n == len(data):
            break
        offset, count = offset + 16 + n, count + 1
    open(path, "wb").write(data[:offset + 20])
    return offset, count


def midrun_config(pattern: str, steps: int):
    config = tiny_config(steps=steps, checkpoint=dict(every=1000, keep=3))
    config.model.vocab_size = fixtures.VOCAB_SIZE
    config.data.update(dict(source="tfrecord", train_files=pattern, shuffle_buffer=16,
                            vocab_size=fixtures.VOCAB_SIZE, cls_id=fixtures.CLS,
                            sep_id=fixtures.SEP, mask_id=fixtures.MASK))
    config.train.tensorboard = False
    return config


@pytest.fixture()
def cut(tmp_path):
    """2 shards of 20 records (length 16), the second one cut inside its last record."""
    (tmp_path / "data").mkdir()
    paths, _ = fixtures.write_files(tmp_path / "data", 2, 20, seq=LENGTH, preds=PREDICTIONS)
    offset, good = cut_last_record(paths[1])
    return str(tmp_path / "data" / "*.tfrecord"), paths, offset, good


def _good_batches(cfg) -> int:
    it = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    for n in range(1000):
        try:
            next(it)
        except CorruptShardError:
            return n
    raise AssertionError("the cut shard was never read")


def test_the_error_names_file_byte_and_option_on_one_line(cut):
    pattern, paths, offset, good = cut
    cfg = midrun_config(pattern, 10).data
    pretrain.check_input(cfg, process_index=0, process_count=1)  # the sample misses it
    it = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    with pytest.raises(CorruptShardError) as e:
        for _ in range(1000):
            next(it)
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg and "'" not in msg, msg
    assert (f"corrupt or truncated input shard {paths[1]}: truncated record at byte {offset} "
            f"(read less bytes than requested), after {good} good records. Re-create it, or "
            f"set --config.data.skip_corrupt=True") in msg, msg
    assert paths[0] not in msg


def test_state_after_the_error_resumes_exactly_on_the_repaired_files(cut, tmp_path):
    """After a read error tf.data's iterator is not serialized: the state holds the batch
    count, and set_state rebuilds the pipeline and skips that many batches (exact)."""
    pattern, paths, _, _ = cut
    cfg = midrun_config(pattern, 10).data
    broken = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    n = _good_batches(cfg)
    for _ in range(n):
        next(broken)
    with pytest.raises(CorruptShardError):
        next(broken)
    state = broken.get_state()
    assert "tf_iterator" not in state
    # The shard re-created whole (same name, here the same records).
    fixtures.write_files(tmp_path / "data", 2, 20, seq=LENGTH, preds=PREDICTIONS)
    fresh = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    resumed = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    resumed.set_state(state)
    for _ in range(n):
        next(fresh)
    for _ in range(3):
        a, b = next(fresh), next(resumed)
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_the_run_saves_the_last_good_step_then_resumes_with_skip_corrupt(cut, tmp_path,
                                                                        compile_cache):
    from bert_jax.train import checkpoint as ckpt_lib
    from bert_jax.tasks import pretraining

    pattern, paths, offset, _ = cut
    config = midrun_config(pattern, 40)
    good = _good_batches(config.data)
    assert 0 < good < 40  # the run meets the cut shard mid-way
    workdir = str(tmp_path / "run")
    with pytest.raises(CorruptShardError) as e:
        pretraining.run(config, workdir)
    msg = str(e.value)
    assert "\n" not in msg and paths[1] in msg and f"byte {offset}" in msg, msg
    assert "data.skip_corrupt" in msg and f"Saved step {good}, the last good one" in msg, msg
    assert ckpt_lib.Checkpointer(workdir, every=1000).all_steps() == [good]

    config = midrun_config(pattern, good + 2)
    config.data.skip_corrupt = True
    summary = pretraining.run(config, workdir)
    assert summary["step"] == good + 2


def test_a_file_gone_mid_run_is_a_fault_naming_it(tmp_path):
    """Read one file at a time, so the third is opened only once the first two are read;
    it is deleted before: a FaultError (exit 1) naming it, which the run also saves before
    (a raw NotFoundError traceback before)."""
    from bert_jax.data.shards import InputReadError
    from bert_jax.errors import FaultError

    paths, _ = fixtures.write_files(tmp_path, 3, 20, seq=LENGTH, preds=PREDICTIONS)
    cfg = midrun_config(str(tmp_path / "*.tfrecord"), 10).data
    cfg.update(dict(shuffle=False, num_parallel_reads=1))
    it = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    next(it)
    (tmp_path / paths[2]).unlink()
    with pytest.raises(InputReadError) as e:
        for _ in range(20):
            next(it)
    msg = str(e.value)
    assert isinstance(e.value, FaultError) and "\n" not in msg, msg
    assert msg.startswith(f"cannot read the input files ({paths[0]}, {paths[1]}, {paths[2]}): "
                          f"{paths[2]}; No such file or directory"), msg
