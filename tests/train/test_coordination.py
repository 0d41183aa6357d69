"""The processes' watch on each other (bert_jax/train/coordination.py) on a stand-in of jax's
key-value store: when a peer counts as lost, and when a commit barrier may stop waiting for
a process whose save failed (and, as important, when it may not)."""

from __future__ import annotations

import pytest

from bert_jax.train import coordination as co


class Store:
    """The store's calls the module makes, on a dict; `down` makes every call fail."""

    def __init__(self):
        self.kv, self.down = {}, False

    def _up(self):
        if self.down:
            raise RuntimeError("UNAVAILABLE: Failed to send RPC to coordination service")

    def key_value_set(self, key, value, allow_overwrite=False):
        self._up()
        if key in self.kv and not allow_overwrite:
            raise RuntimeError(f"ALREADY_EXISTS: {key}")
        self.kv[key] = value

    def key_value_increment(self, key, n):
        self._up()
        self.kv[key] = str(int(self.kv.get(key, "0")) + n)
        return int(self.kv[key])

    def key_value_dir_get(self, prefix):
        self._up()
        return sorted((k, v) for k, v in self.kv.items() if k.startswith(prefix))

    def key_value_try_get(self, key):
        self._up()
        if key not in self.kv:
            raise RuntimeError(f"NOT_FOUND: {key}")
        return self.kv[key]

    def key_value_delete(self, key):
        self.kv.pop(key, None)


def test_a_peer_is_lost_after_the_timeout_or_a_few_beats_once_suspect():
    store = Store()
    dog = co.Watchdog(store, process=1, count=3, timeout=60)
    assert (dog.interval, dog.quick) == (2.0, 6.0)
    t = 1000.0
    for _ in range(5):  # everyone beats
        t += 2
        store.key_value_increment(f"{co.BEAT}0", 1)
        store.key_value_increment(f"{co.BEAT}2", 1)
        assert dog.check(t) is None
    # Process 2 dies; process 0 beats on.
    for _ in range(29):
        t += 2
        store.key_value_increment(f"{co.BEAT}0", 1)
        assert dog.check(t) is None     # 58 s of silence: not yet
    t += 2
    store.key_value_increment(f"{co.BEAT}0", 1)
    assert dog.check(t) == (2, "no heartbeat for 60 s")

    dog = co.Watchdog(store, process=1, count=3, timeout=60)
    t = 2000.0
    dog.check(t)
    store.key_value_increment(f"{co.BEAT}0", 1)
    dog._suspect_until = t + 100   # a collective failed (suspect() with this clock)
    assert dog.check(t + 4) is None
    store.key_value_increment(f"{co.BEAT}0", 1)
    assert dog.check(t + 6) == (2, "no heartbeat for 6 s")  # process 0's moved: only 2's not


def test_the_store_of_process_0_gone_is_process_0_lost():
    store = Store()
    dog = co.Watchdog(store, process=1, count=2, timeout=10)
    assert dog.check(0.0) is None
    store.down = True
    assert dog.check(5.0) is None
    assert dog.check(15.5) == (0, "the coordination service it hosts did not answer for 10 s")
    store.down = False
    store.kv[co.LOST] = "0"   # a peer named it first
    assert dog.check(16.0) == (0, "named by another process")


@pytest.fixture
def uses(monkeypatch):
    """This process's uses of each barrier key so far."""
    table = {}
    monkeypatch.setattr(co, "_USES", table)
    return table


def test_a_commit_barrier_stops_waiting_for_a_process_past_it(uses):
    """Process 1 waits at the write barrier of step 30; process 0's save failed there, so it
    went on to orbax's bookkeeping (set_value_start, its 6th use) without arriving."""
    store, key = Store(), "_async_write_complete.30"
    prefix = f"{co.BARRIER}{key}/0/"
    start = "ThreadSaveMultiHostValueHolder:set_value_start"
    uses.update({start: 5, "ThreadSaveMultiHostValueHolder:set_value_end": 5, key: 1})
    store.kv[f"{prefix}1"] = "1"
    store.kv[f"{co.AT}0"] = f"5#{start}"
    assert co.failed_elsewhere(store, key, prefix, {0}) == 0
    # The same place, but it arrived here first (it passed this barrier: not a failure).
    store.kv[f"{prefix}0"] = "1"
    assert co.failed_elsewhere(store, key, prefix, {0}) is None
    # Still writing: its place is the last bookkeeping barrier this process passed too.
    del store.kv[f"{prefix}0"]
    store.kv[f"{co.AT}0"] = f"4#{start}"
    assert co.failed_elsewhere(store, key, prefix, {0}) is None
    # Or at another commit barrier: no proof either.
    store.kv[f"{co.AT}0"] = "0#_async_commit_complete.20"
    assert co.failed_elsewhere(store, key, prefix, {0}) is None
    # A process that marked the step failed.
    store.kv[f"{co.SAVE_FAILED}30"] = "0"
    assert co.failed_elsewhere(store, key, prefix, {0}) == 0
    assert co.failed_elsewhere(store, "_async_write_complete.40", prefix, {0}) is None


def test_collective_failures_are_told_from_our_reports():
    from bert_jax.train.checkpoint_faults import CheckpointSaveError

    def under(cause):
        try:
            try:
                raise cause
            except Exception:  # noqa: BLE001
                raise CheckpointSaveError("checkpoint at step 10 failed: ...") from None
        except CheckpointSaveError as e:
            return e

    gloo = ValueError("UNKNOWN: Gloo AllGather failed: [pair.cc:538] Read error "
                      "[127.0.0.1]:26290: Connection reset by peer")
    assert co.collective_failure(gloo) and co.collective_failure(under(gloo))
    assert not co.collective_failure(under(OSError(28, "No space left on device")))
    assert not co.collective_failure(under(co.SaveFailedElsewhere(10, 1)))
    assert not co.collective_failure(CheckpointSaveError("checkpoint at step 10 failed"))
