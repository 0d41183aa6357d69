"""The tf.data pre-training pipeline: read-back, host sharding, exact resume, evaluation."""

import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.data import features as features_lib
from bert_jax.data import checks, pretrain
from bert_jax.data import shards as shard_lib
from tests.data import fixtures

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FEATURES = list(features_lib.PRETRAIN_FEATURES)


def _cfg(pattern, **kw):
    base = dict(train_files=pattern, eval_files=pattern, max_seq_length=32,
                max_predictions_per_seq=5, shuffle_buffer=64,
                vocab_size=fixtures.VOCAB_SIZE)
    base.update(kw)
    return pretrain.data_config(**base)


def _assert_same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_batches_have_the_documented_shapes_and_dtypes(shards):
    pattern, _, records = shards
    batch = next(pretrain.train_iterator(_cfg(pattern), 8, process_index=0, process_count=1))
    want = {"input_ids": (8, 32), "input_mask": (8, 32), "segment_ids": (8, 32),
            "masked_lm_positions": (8, 5), "masked_lm_ids": (8, 5),
            "masked_lm_weights": (8, 5), "next_sentence_labels": (8,),
            "example_weights": (8,)}
    assert {k: v.shape for k, v in batch.items()} == want
    for k, v in batch.items():
        assert v.dtype == (np.float32 if "weights" in k else np.int32), k
    np.testing.assert_array_equal(batch["example_weights"], 1.0)
    checks.check_batch(batch, max_seq_length=32, max_predictions_per_seq=5,
                       vocab_size=fixtures.VOCAB_SIZE)
    # Every row is one of the written records, all seven features identical.
    for row in range(8):
        rec = records[fixtures.record_key(batch["input_ids"][row])]
        for name in FEATURES:
            np.testing.assert_array_equal(batch[name][row], rec[name].reshape(-1), err_msg=name)


def test_eval_reads_every_record_back_identically_exactly_once(shards):
    pattern, _, records = shards
    seen = {}
    ev = pretrain.eval_iterator(_cfg(pattern), 16, process_index=0,
                                process_count=1)
    n_batches = 0
    for batch in ev:
        n_batches += 1
        for row in range(16):
            if batch["example_weights"][row] == 0:
                continue
            key = fixtures.record_key(batch["input_ids"][row])
            assert key not in seen, f"record {key} yielded twice"
            seen[key] = {k: batch[k][row] for k in FEATURES}
    assert n_batches == len(ev) == -(-len(records) // 16)
    assert set(seen) == set(records)
    for key, rec in records.items():
        for name in FEATURES:
            np.testing.assert_array_equal(seen[key][name], rec[name].reshape(-1))


@pytest.mark.parametrize("num_files,process_count", [(6, 2), (6, 4), (1, 2)])
def test_eval_hosts_cover_every_record_once_with_equal_batch_counts(
        tmp_path, num_files, process_count):
    sizes = [7, 13, 5, 9, 1, 11][:num_files]
    paths, records = fixtures.write_files(tmp_path, num_files, sizes, seq=32, preds=5)
    cfg = _cfg(str(tmp_path / "*.tfrecord"))
    seen, lengths = [], set()
    for host in range(process_count):
        ev = pretrain.eval_iterator(cfg, 4 * process_count, process_index=host,
                                    process_count=process_count)
        batches = list(ev)
        lengths.add(len(batches))
        assert len(batches) == len(ev)
        for b in batches:
            w = b["example_weights"]
            assert set(np.unique(w)) <= {0.0, 1.0}
            # Real rows first, then filler; filler rows are all zeros.
            assert np.all(np.diff(w) <= 0)
            for name in FEATURES:
                assert not b[name][w == 0].any(), name
            seen += [fixtures.record_key(r) for r in b["input_ids"][w == 1]]
    assert len(lengths) == 1, f"hosts disagree on the number of eval batches: {lengths}"
    assert sorted(seen) == sorted(records)


def test_two_hosts_read_disjoint_files_covering_all(shards):
    pattern, paths, records = shards
    cfg = _cfg(pattern)
    files_seen = []
    for host in (0, 1):
        it = pretrain.train_iterator(cfg, 8, process_index=host, process_count=2)
        assert it.local_batch == 4
        mine, record_level = shard_lib.shard_files(sorted(paths), host, 2)
        assert not record_level and it.files == mine
        # Two epochs of this host's records: every one of its files shows up, no other.
        n = sum(len([k for k in records if k[0] == paths.index(f)]) for f in mine)
        ids = set()
        for _ in range(2 * n // 4):
            ids |= {fixtures.record_key(r)[0] for r in next(it)["input_ids"]}
        files_seen.append(ids)
    assert files_seen[0].isdisjoint(files_seen[1])
    assert files_seen[0] | files_seen[1] == set(range(len(paths)))


def test_fewer_files_than_hosts_falls_back_to_records(tmp_path, caplog):
    paths, records = fixtures.write_files(tmp_path, 1, 30, seq=32, preds=5)
    cfg = _cfg(str(tmp_path / "*.tfrecord"), shuffle=False)
    seen = []
    for host in (0, 1):
        it = pretrain.train_iterator(cfg, 8, process_index=host, process_count=2)
        seen.append({fixtures.record_key(r) for _ in range(3) for r in next(it)["input_ids"]})
    assert "record-level sharding" in caplog.text
    assert seen[0].isdisjoint(seen[1]) and len(seen[0] | seen[1]) == 24


def test_unknown_config_key_is_an_error():
    with pytest.raises(KeyError, match="shuffle_bufer"):
        pretrain.data_config(shuffle_bufer=10)


def test_missing_glob_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        pretrain.train_iterator(_cfg(str(tmp_path / "nothing-here*")), 8, process_index=0,
                                process_count=1)
    with pytest.raises(ValueError, match="multiple of the number of hosts, 3"):
        pretrain.train_iterator(_cfg(str(tmp_path / "x*")), 8, process_index=0, process_count=3)


@pytest.mark.parametrize("dynamic,read_threads", [(False, -1), (True, -1), (True, -2)])
def test_state_roundtrip_in_process_is_exact(shards, dynamic, read_threads, tmp_path):
    """read_threads -1: local files read in the pipeline thread; -2: AUTOTUNE threads."""
    pattern, _, _ = shards
    cfg = _cfg(pattern, dynamic_masking=dynamic, read_threads=read_threads)
    it = pretrain.train_iterator(cfg, 8, process_index=1, process_count=2)
    for _ in range(7):
        next(it)
    it.save(tmp_path / "state.npz")
    reference = [next(it) for _ in range(12)]   # crosses an epoch boundary (~17 batches)
    fresh = pretrain.train_iterator(cfg, 8, process_index=1, process_count=2)
    fresh.restore(tmp_path / "state.npz")
    assert fresh.batches == 7
    for a in reference:
        _assert_same(a, next(fresh))


def test_state_without_tf_blob_falls_back_to_skipping(shards, caplog):
    pattern, _, _ = shards
    cfg = _cfg(pattern, dynamic_masking=True)
    it = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    for _ in range(5):
        next(it)
    state = it.get_state()
    reference = [next(it) for _ in range(4)]
    state["tf_iterator"] = np.zeros(0, np.uint8)
    fresh = pretrain.train_iterator(cfg, 8, process_index=0, process_count=1)
    fresh.set_state(state)
    assert "skipping 5 batches" in caplog.text
    for a in reference:
        _assert_same(a, next(fresh))


def test_state_of_another_pipeline_is_refused(shards):
    pattern, _, _ = shards
    state = pretrain.train_iterator(_cfg(pattern), 8, process_index=0,
                                    process_count=1).get_state()
    other = pretrain.train_iterator(_cfg(pattern, seed=1), 8, process_index=0, process_count=1)
    with pytest.raises(ValueError, match='"seed": \\[0, 1\\]'):
        other.set_state(state)


_RESUME = r"""
import sys, numpy as np
from bert_jax.data import pretrain
cfg = pretrain.data_config(train_files=sys.argv[1], max_seq_length=32,
    max_predictions_per_seq=5, shuffle_buffer=64, vocab_size=2000,
    dynamic_masking=True)
it = pretrain.train_iterator(cfg, 8, process_index=0, process_count=2)
it.restore(sys.argv[2])
np.savez(sys.argv[3], **{f"{i}/{k}": v for i in range(10) for k, v in next(it).items()})
"""


def test_resume_in_a_new_process_equals_uninterrupted(shards, tmp_path):
    """10 batches, save, restore in a NEW process, 10 more == 20 uninterrupted."""
    pattern, _, _ = shards
    cfg = _cfg(pattern, dynamic_masking=True)
    full = [next(it) for it in [pretrain.train_iterator(cfg, 8, process_index=0,
                                                        process_count=2)] for _ in range(20)]
    it = pretrain.train_iterator(cfg, 8, process_index=0, process_count=2)
    first = [next(it) for _ in range(10)]
    it.save(tmp_path / "state.npz")
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-c", _RESUME, pattern, str(tmp_path / "state.npz"),
                    str(tmp_path / "second.npz")], check=True, env=env, cwd=REPO)
    second = np.load(tmp_path / "second.npz")
    for i in range(20):
        for name in full[i]:
            got = first[i][name] if i < 10 else second[f"{i - 10}/{name}"]
            np.testing.assert_array_equal(got, full[i][name], err_msg=f"batch {i} {name}")
    # and the stream is not trivially constant
    assert not np.array_equal(full[0]["input_ids"], full[10]["input_ids"])


def test_device_prefetcher_over_tfrecords_resumes_exactly(shards):
    import time

    import jax
    from jax.sharding import Mesh

    from bert_jax.data import device
    pattern, _, _ = shards
    cfg = _cfg(pattern, dynamic_masking=True)
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    sharding = device.batch_sharding(mesh)
    with device.DevicePrefetcher(pretrain.train_iterator(cfg, 8, process_index=0,
                                                         process_count=1), sharding) as pf:
        for _ in range(4):
            next(pf)
        time.sleep(0.3)
        state = pf.get_state()
        ref = [next(pf) for _ in range(5)]
    with device.DevicePrefetcher(pretrain.train_iterator(cfg, 8, process_index=0,
                                                         process_count=1), sharding) as pf:
        pf.set_state(state)
        for a in ref:
            b = next(pf)
            for k in a:
                np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)



def test_device_prefetcher_unread_gives_batches_back_and_the_state_counts_them(shards):
    """unread(n) (the loop, after steps another process's failed input made void): the
    last n batches come again, and a state taken then resumes at the first of them."""
    import jax
    from jax.sharding import Mesh

    from bert_jax.data import device
    pattern, _, _ = shards
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    sharding = device.batch_sharding(mesh)

    def prefetcher():
        return device.DevicePrefetcher(pretrain.train_iterator(
            _cfg(pattern), 8, process_index=0, process_count=1), sharding)

    with prefetcher() as pf:
        seen = [np.asarray(next(pf)["input_ids"]) for _ in range(5)]
        pf.unread(2)
        state = pf.get_state()
        again = [np.asarray(next(pf)["input_ids"]) for _ in range(3)]
        with pytest.raises(ValueError, match="can unread 0..3 batches, not 4"):
            pf.unread(4)
    np.testing.assert_array_equal(again[0], seen[3])
    np.testing.assert_array_equal(again[1], seen[4])
    with prefetcher() as pf:
        pf.set_state(state)
        for want in again:
            np.testing.assert_array_equal(np.asarray(next(pf)["input_ids"]), want)

def test_window_shuffle_is_a_permutation_of_the_record_stream(shards):
    """Windows of 64 records are permuted and cut into batches: the first 8 windows (512
    records) hold exactly 2 epochs of the 228 records plus 56 of the third, none dropped or
    duplicated; within an epoch no record repeats; batches mix files."""
    pattern, _, records = shards
    assert len(records) == 228
    it = pretrain.train_iterator(_cfg(pattern, shuffle_buffer=64), 8, process_index=0,
                                 process_count=1)
    batches = [next(it)["input_ids"] for _ in range(64)]   # 64 x 8 = 512 records
    keys = [fixtures.record_key(r) for b in batches for r in b]
    counts = {k: keys.count(k) for k in records}
    assert sorted(set(counts.values())) == [2, 3] and sum(counts.values()) == 512
    assert list(counts.values()).count(3) == 512 - 2 * 228
    assert len(set(keys[:192])) == 192
    assert len({k[0] for k in keys[:8]}) > 1
    plain = pretrain.train_iterator(_cfg(pattern, shuffle=False), 8, process_index=0,
                                    process_count=1)
    assert [fixtures.record_key(r) for r in next(plain)["input_ids"]] != keys[:8]
