"""Host-local numpy batches -> global jax.Arrays sharded on the logical "batch" axis.

    sharding = device.batch_sharding(mesh, rules)            # rules: config.mesh rules
    batch = device.to_global(next(host_it), sharding)         # dict of global jax.Array
    it = device.DevicePrefetcher(host_it, sharding, size=2)   # a background thread keeps
    batch = next(it)                                          # `size` batches on device

Each host passes its own [local_batch, ...] arrays; `jax.make_array_from_process_local_data`
assembles the [global_batch, ...] array, dimension 0 sharded over the mesh axes the rules
give to "batch" (("data", "fsdp") by default).

`DevicePrefetcher.get_state()` stays exact although the thread runs ahead: the state is the
host iterator's state plus the host batches already pulled but not yet returned, which are
replayed first after `set_state`. Never imports TensorFlow.
"""

from __future__ import annotations

import collections
import math
import queue
import threading
from typing import Iterator, Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding

# The batch's mesh axes are a question about the mesh rules (sharding.py); the input side
# places its batches by them.
from bert_jax.sharding import batch_mesh_axes, batch_sharding  # noqa: F401
from bert_jax.data import state as state_lib


def to_global(batch: Mapping[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """Host-local numpy batch -> dict of global jax.Arrays (batch = local x processes)."""
    spec = sharding.spec[0] if len(sharding.spec) else None
    axes = () if spec is None else ((spec,) if isinstance(spec, str) else tuple(spec))
    shards = math.prod(sharding.mesh.shape[a] for a in axes)
    out = {}
    for name, local in batch.items():
        local = np.asarray(local)
        global_rows = local.shape[0] * jax.process_count()
        if global_rows % shards:
            raise ValueError(
                f"{name}: global batch {global_rows} is not divisible by the {shards} "
                f"devices of mesh axes {axes}; choose train.batch_size as a multiple of it")
        out[name] = jax.make_array_from_process_local_data(sharding, local)
    return out


class DevicePrefetcher:
    """Iterator of global-array batches, `size` batches prepared ahead in a thread.

    host_iterator: any of bert_jax.data's iterators (next -> dict of numpy; get_state /
    set_state). Call close() (or use as a context manager) to stop the thread.
    """

    def __init__(self, host_iterator, sharding: NamedSharding, size: int = 2):
        self._host = host_iterator
        self._sharding = sharding
        self._size = max(1, size)
        self._lock = threading.Lock()
        self._replay: collections.deque = collections.deque()
        self._returned: collections.deque = collections.deque(maxlen=4)  # for unread
        self._start()

    def _start(self):
        self._pending: collections.deque = collections.deque()  # pulled, not yet returned
        self._queue: queue.Queue = queue.Queue()
        self._slots = threading.Semaphore(self._size)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()

    def _work(self):
        while True:
            self._slots.acquire()
            if self._stop.is_set():
                return
            try:
                with self._lock:
                    host = self._replay.popleft() if self._replay else next(self._host)
                    self._pending.append(host)
                item = to_global(host, self._sharding)
            except BaseException as e:  # StopIteration or a data error: hand it over
                self._queue.put(e)
                return
            self._queue.put(item)

    def __iter__(self) -> Iterator[dict[str, jax.Array]]:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._queue.put(item)  # keep raising on later calls
            raise item
        with self._lock:
            self._returned.append(self._pending.popleft())
        self._slots.release()
        return item

    def unread(self, batches: int) -> None:
        """Puts the last `batches` returned batches (at most 4) back in front of the stream:
        the next calls return them again, and get_state counts them as not consumed (the
        loop undoes the steps that a failed input on another process made void)."""
        if not 0 <= batches <= len(self._returned):
            raise ValueError(f"can unread 0..{len(self._returned)} batches, not {batches}")
        if batches == 0:
            return
        self.close()
        back = list(self._returned)[len(self._returned) - batches:]
        self._replay = collections.deque(back + list(self._pending) + list(self._replay))
        self._returned.clear()
        self._start()

    def close(self):
        self._stop.set()
        self._slots.release()
        self._thread.join(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def get_state(self) -> dict[str, np.ndarray]:
        with self._lock:
            state = dict(self._host.get_state())
            ahead = list(self._pending) + list(self._replay)
        meta = state_lib.unpack_meta(state)
        meta["prefetched"] = len(ahead)
        state[state_lib.META] = state_lib.pack_meta(meta)
        for i, batch in enumerate(ahead):
            for name, value in batch.items():
                state[f"prefetched/{i}/{name}"] = np.asarray(value)
        return state

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self.close()
        meta = state_lib.unpack_meta(state)
        ahead = [{} for _ in range(meta.pop("prefetched", 0))]
        host_state = {state_lib.META: state_lib.pack_meta(meta)}
        for key, value in state.items():
            if key.startswith("prefetched/"):
                _, i, name = key.split("/", 2)
                ahead[int(i)][name] = value
            elif key != state_lib.META:
                host_state[key] = value
        self._host.set_state(host_state)
        self._replay = collections.deque(ahead)
        self._returned.clear()
        self._start()

    def seek(self, batches: int) -> None:
        """Drops what is prefetched and seeks the host iterator: the next batch is batch
        `batches` of its stream (see bert_jax.data.state.restore_input)."""
        self.close()
        self._host.seek(batches)
        self._replay = collections.deque()
        self._returned.clear()
        self._start()

    def save(self, path) -> None:
        state_lib.save_state(path, self.get_state())

    def restore(self, path) -> None:
        self.set_state(state_lib.load_state(path))
