"""Saving and restoring input-iterator state, alone or inside an orbax checkpoint.

Every iterator in `bert_jax.data` (tf.data, synthetic, the device prefetcher) exposes
`get_state() -> dict[str, np.ndarray]` and `set_state(state)`. The state is host-local:
each process saves its own file, `process_<i>-of-<n>.npz`, next to the model checkpoint.

With orbax, register the item once and save it with the rest of the train state:

    mngr = ocp.CheckpointManager(dir, item_names=("state", "data"))
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state), data=InputStateSave(train_iter)))
    mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=InputStateRestore(train_iter)))

`InputStateSave` snapshots the iterator state when it is constructed (before the next
`next()`), so an asynchronous checkpoint never records a later position.

This module never imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

META = "meta"


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


class InputStateHandler(ocp.CheckpointHandler):
    """orbax handler: each process writes / reads its own `process_<i>-of-<n>.npz`."""

    def save(self, directory: epath.Path, *args, **kwargs):
        save_args = kwargs.get("args", args[0] if args else None)
        save_state(state_file(directory), save_args.state)

    def restore(self, directory: epath.Path, *args, **kwargs):
        restore_args = kwargs.get("args", args[0] if args else None)
        state = load_state(state_file(directory))
        if restore_args is not None and restore_args.iterator is not None:
            restore_args.iterator.set_state(state)
        return state

    def metadata(self, directory: epath.Path):
        return None


@ocp.args.register_with_handler(InputStateHandler, for_save=True)
@dataclasses.dataclass
class InputStateSave(ocp.args.CheckpointArgs):
    """Saves `iterator.get_state()`, snapshotted now (at construction)."""
    iterator: Any = None
    state: dict | None = None

    def __post_init__(self):
        if self.state is None:
            if self.iterator is None:
                raise ValueError("InputStateSave needs an iterator or a state")
            self.state = self.iterator.get_state()


@ocp.args.register_with_handler(InputStateHandler, for_restore=True)
@dataclasses.dataclass
class InputStateRestore(ocp.args.CheckpointArgs):
    """Restores into `iterator.set_state(...)` (if given); the state dict is also returned."""
    iterator: Any = None
