"""Input-iterator state as a flat dict of numpy arrays, and its file format.

Every iterator in `bert_jax.data` (tf.data, synthetic, the device prefetcher) exposes
`get_state() -> dict[str, np.ndarray]` and `set_state(state)`, plus `save(path)` /
`restore(path)` which use `save_state` / `load_state` here (npz, no pickle, written to a
temp file and renamed). The state is host-local: each process keeps its own file,
`process_<i>-of-<n>.npz` (`state_file`). For orbax checkpoints see
`bert_jax.data.checkpointing`. This module never imports TensorFlow or orbax.

Restoring onto another host layout (`restore_input`). A checkpoint's per-process states
only fit the process count that wrote them: with n processes, process i reads its own
`process_i-of-n.npz`. When that file is missing (the run was saved by another number of
processes) or does not fit the pipeline (`set_state` refuses it), the iterator is put at a
deterministic position instead: `seek(k)`, where k is the number of batches the run had
consumed (the saved `batches` minus those still `prefetched`, the same on every process
since each step takes one batch from each). Each process then skips the first k batches of
its own stream, i.e. k x the global batch examples are counted as consumed, as many as
before. That is not an exact resume and a warning says so: the new processes read
differently sharded and shuffled streams, so which examples come next is not what the
uninterrupted run would have read; within the current pass over the data (epoch) some
examples may repeat and others be skipped.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
from typing import Any, Optional

import jax
import numpy as np
from etils import epath

META = "meta"
_STATE_FILE = re.compile(r"^process_(\d+)-of-(\d+)\.npz$")

log = logging.getLogger(__name__)


def pack_meta(meta: dict[str, Any]) -> np.ndarray:
    """JSON metadata as a uint8 array (the state is a flat dict of arrays, npz-friendly)."""
    return np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8).copy()


def unpack_meta(state: dict[str, np.ndarray]) -> dict[str, Any]:
    if META not in state:
        raise ValueError(f"not an input-iterator state: no {META!r} entry in {sorted(state)}")
    return json.loads(np.asarray(state[META], np.uint8).tobytes().decode())


def state_file(directory, process_index: int | None = None,
               process_count: int | None = None) -> epath.Path:
    i = jax.process_index() if process_index is None else process_index
    n = jax.process_count() if process_count is None else process_count
    return epath.Path(directory) / f"process_{i}-of-{n}.npz"


def save_state(path, state: dict[str, np.ndarray]) -> None:
    """Writes `state` to `path` (npz, no pickle) atomically: temp file, then rename."""
    path = epath.Path(path)
    buf = io.BytesIO()
    np.savez(buf, **state)
    tmp = path.parent / (path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(buf.getvalue())
    tmp.rename(path)


def load_state(path) -> dict[str, np.ndarray]:
    path = epath.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no input-iterator state at {path}")
    with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def saved_layout(directory) -> list[tuple[int, int, epath.Path]]:
    """(process_index, process_count, path) of every per-process state file in
    `directory`, sorted by count then index."""
    directory = epath.Path(directory)
    found = []
    if directory.exists():
        for path in directory.iterdir():
            m = _STATE_FILE.match(path.name)
            if m:
                found.append((int(m.group(1)), int(m.group(2)), path))
    return sorted(found, key=lambda x: (x[1], x[0]))


def consumed_batches(state: dict[str, np.ndarray]) -> Optional[int]:
    """Batches the training loop had taken from the iterator when `state` was saved: the
    `batches` it had produced minus those still held `prefetched` (DevicePrefetcher).
    None if the state does not record a count."""
    try:
        meta = unpack_meta(state)
    except ValueError:
        return None
    if "batches" not in meta:
        return None
    return int(meta["batches"]) - int(meta.get("prefetched", 0))


@dataclasses.dataclass
class RestoredInput:
    """What `restore_input` did. exact: the iterator is exactly where it was saved.
    position: batches skipped from the start of this process's stream (fallback only);
    reason: why the saved state was not used (fallback only); state: the saved state read
    (this process's own, or another process's when the layout changed; None if none)."""

    exact: bool
    state: Optional[dict[str, np.ndarray]] = None
    position: Optional[int] = None
    reason: Optional[str] = None


def restore_input(directory, iterator: Any = None, *, fallback_batches: Optional[int] = None,
                  process_index: Optional[int] = None,
                  process_count: Optional[int] = None) -> RestoredInput:
    """Restores `iterator` (if given) from the per-process states in `directory`.

    Exact when this process's own `process_<i>-of-<n>.npz` exists and `set_state` accepts
    it. Otherwise (saved by another process count, or a state the pipeline refuses) the
    iterator is `seek`-ed to the number of batches the run had consumed
    (`consumed_batches` of a saved state, or `fallback_batches`, the checkpoint's step,
    when the state records none) and a warning says that this is not exact. Never raises
    for a mismatched layout; with no iterator nothing is moved and no warning is given.
    """
    i = jax.process_index() if process_index is None else process_index
    n = jax.process_count() if process_count is None else process_count
    directory = epath.Path(directory)
    own = state_file(directory, i, n)
    if own.exists():
        state = load_state(own)
        if iterator is None:
            return RestoredInput(exact=True, state=state)
        try:
            iterator.set_state(state)
            return RestoredInput(exact=True, state=state)
        except ValueError as e:
            reason = f"the saved input state does not fit this pipeline ({e})"
            differs = "the input pipeline differs from the saved one"
    else:
        layout = saved_layout(directory)
        counts = sorted({c for _, c, _ in layout})
        differs = f"this run's streams are sharded and shuffled for {n} process(es)"
        if layout:
            state = load_state(layout[0][2])   # any process's: they consumed the same
            reason = (f"it was saved by {'/'.join(map(str, counts))} process(es) "
                      f"({', '.join(p.name for _, _, p in layout)}) and is restored by {n}")
        else:
            state = None
            reason = "the checkpoint holds no input-iterator state"
    position = consumed_batches(state) if state is not None else None
    source = "the batch count saved with it"
    if position is None:
        position, source = fallback_batches, "the checkpoint's step (no batch count saved)"
    if iterator is None:
        return RestoredInput(exact=False, state=state, position=position, reason=reason)
    where = directory.parent if directory.name == "data" else directory
    if position is None or not hasattr(iterator, "seek"):
        why = ("no position is known" if position is None else
               f"{type(iterator).__name__} has no seek()")
        _warn(i, f"input-iterator state of checkpoint {where} not restored: {reason}. "
                 f"{why}, so the data stream starts from its beginning: NOT an exact "
                 f"resume (params, optimizer state, step and RNG are restored exactly).")
        return RestoredInput(exact=False, state=state, position=0, reason=reason)
    iterator.seek(int(position))
    _warn(i, f"input-iterator state of checkpoint {where} not restored exactly: {reason}. "
             f"Params, optimizer state, step and RNG are restored exactly; the data continues "
             f"from a deterministic position instead: each of the {n} process(es) skips the "
             f"first {position} batches of its own stream ({position} x the global batch "
             f"examples counted as consumed, from {source}). NOT an exact resume: "
             f"{differs}, so which examples come next is not what an uninterrupted run "
             f"would have read; within the current pass over the data some examples may "
             f"repeat and others be skipped. Skipping re-reads the skipped records.")
    return RestoredInput(exact=False, state=state, position=int(position), reason=reason)


def _warn(process_index: int, message: str) -> None:
    if process_index == 0:   # the same on every process; only process 0 logs
        log.warning(message)
