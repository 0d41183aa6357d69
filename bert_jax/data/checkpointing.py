"""The input-iterator state as an item of an orbax checkpoint (one file per process).

Save it with the rest of the train state:

    from bert_jax.data.checkpointing import InputStateSave, InputStateRestore
    mngr = ocp.CheckpointManager(directory, item_names=("state", "data"))
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state), data=InputStateSave(train_iter)))
    mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=InputStateRestore(train_iter)))

Every process writes `<step>/data/process_<i>-of-<n>.npz` with its own iterator's state.
`InputStateSave` snapshots the state when it is constructed, i.e. right after the last
batch the step consumed, so an asynchronous save never records a later position.
Never imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from bert_jax.data.state import load_state, save_state, state_file


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
