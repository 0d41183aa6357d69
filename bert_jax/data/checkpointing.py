"""The input-iterator state as an item of an orbax checkpoint (one file per process).

Save it with the rest of the train state:

    from bert_jax.data.checkpointing import InputStateSave, InputStateRestore
    mngr = ocp.CheckpointManager(directory, item_names=("state", "data"))
    mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state), data=InputStateSave(train_iter)))
    mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=InputStateRestore(train_iter)))

Every process writes `<step>/data/process_<i>-of-<n>.npz` with its own iterator's state,
in the save's background commit as orbax's array writes are: a write that fails (a full
disk) fails the save there, on that process alone, like theirs. `InputStateSave`
snapshots the state when it is constructed, i.e. right after the last batch the step
consumed, so an asynchronous save never records a later position.
Restoring with the same process count is exact; with another count (or a state the
pipeline refuses) the iterator is moved to a deterministic position with a warning, never
an error (`bert_jax.data.state.restore_input`). Never imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from bert_jax.data.state import restore_input, save_state, state_file


class InputStateHandler(ocp.AsyncCheckpointHandler):
    """orbax handler: each process writes / reads its own `process_<i>-of-<n>.npz`."""

    async def async_save(self, directory: epath.Path, *args, **kwargs):
        save_args = kwargs.get("args", args[0] if args else None)
        path, state, fault = state_file(directory), save_args.state, save_args.fault

        async def write():
            if fault is not None:
                raise fault
            save_state(path, state)

        return [ocp.future.CommitFutureAwaitingContractedSignals(write(),
                                                                 name="input_state_save")]

    def save(self, directory: epath.Path, *args, **kwargs):
        save_args = kwargs.get("args", args[0] if args else None)
        if save_args.fault is not None:
            raise save_args.fault
        save_state(state_file(directory), save_args.state)

    def restore(self, directory: epath.Path, *args, **kwargs):
        """-> bert_jax.data.state.RestoredInput (exact or not, and why)."""
        restore_args = kwargs.get("args", args[0] if args else None)
        iterator = restore_args.iterator if restore_args is not None else None
        fallback = restore_args.fallback_batches if restore_args is not None else None
        return restore_input(directory, iterator, fallback_batches=fallback)

    def metadata(self, directory: epath.Path):
        return None


@ocp.args.register_with_handler(InputStateHandler, for_save=True)
@dataclasses.dataclass
class InputStateSave(ocp.args.CheckpointArgs):
    """Saves `iterator.get_state()`, snapshotted now (at construction). `fault`: an error
    the write raises instead (fault drills: a save that fails on one process)."""
    iterator: Any = None
    state: dict | None = None
    fault: BaseException | None = None

    def __post_init__(self):
        if self.state is None:
            if self.iterator is None:
                raise ValueError("InputStateSave needs an iterator or a state")
            self.state = self.iterator.get_state()


@ocp.args.register_with_handler(InputStateHandler, for_restore=True)
@dataclasses.dataclass
class InputStateRestore(ocp.args.CheckpointArgs):
    """Restores into `iterator.set_state(...)` (if given). When this process count's state
    is missing or refused, `iterator.seek(k)` with k the batches the run had consumed, or
    `fallback_batches` (the caller's step) if the saved state records no count. The
    restore returns a `bert_jax.data.state.RestoredInput`."""
    iterator: Any = None
    fallback_batches: int | None = None
