"""Input-iterator state as a flat dict of numpy arrays, and its file format.

Every iterator in `bert_jax.data` (tf.data, synthetic, the device prefetcher) exposes
`get_state() -> dict[str, np.ndarray]` and `set_state(state)`, plus `save(path)` /
`restore(path)` which use `save_state` / `load_state` here (npz, no pickle, written to a
temp file and renamed). The state is host-local: each process keeps its own file,
`process_<i>-of-<n>.npz` (`state_file`). For orbax checkpoints see
`bert_jax.data.checkpointing`. This module never imports TensorFlow or orbax.
"""

from __future__ import annotations

import io
import json
from typing import Any

import jax
import numpy as np
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
