"""Checkpoints of a training run: orbax CheckpointManager under WORKDIR/checkpoints.

    WORKDIR/checkpoints/<step>/state/    params, opt_state, step, rng key (orbax, sharded),
                                         and a model.fp8 run's FP8 scaling state (fp8)
                              /data/     each process's input-iterator state
                                         (bert_jax.data.checkpointing: process_<i>-of-<n>.npz)
                              /config/   the run's config (JSON), for reading back a run

Saves are asynchronous (the train loop goes on while the arrays are written) and atomic
(orbax writes to a temporary directory and renames it once every process has finished), so
a run killed mid-save leaves the previous checkpoint as the latest. Restoring takes the
abstract state of the *current* mesh, so a checkpoint saved on one mesh restores onto any
other (orbax reads each shard's slice), and by any number of processes.

The data-iterator state is per process. Restored by the process count that saved it, it is
exact. Restored by another count (saved by 2 processes, resumed by 1, or the reverse) the
params, optimizer state, step and RNG still restore exactly, and each new process's
iterator is moved to a deterministic position: it skips as many batches of its own stream
as the run had consumed, with a warning that this is not an exact resume (examples may
repeat or be skipped within the current pass over the data). See
`bert_jax.data.state.restore_input`; `Checkpointer.data_restore` tells what happened.

Faults (bert_jax.train.checkpoint_faults). A save that fails in the background (a full disk)
is reported by `check()`, which the loops call after every step, or at the latest by the
next `save` / `wait`: a CheckpointSaveError naming the step, the cause and the last good
checkpoint, after the failed temporary folder is removed; older checkpoints are kept (orbax
deletes old steps only once a new one is complete). A restore of the latest step that fails
(a truncated or missing file) falls back to the newest step that restores, with a warning
naming the step skipped and why; the damaged folder is renamed `<step>.damaged` (kept, never
listed, so neither the keep-N policy nor the resumed run's save of that step touches it).
A checkpoint of another model shape is a CheckpointMismatchError, before any tensor is read.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Any, Optional

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp

from bert_jax import paths
from bert_jax.convert.sources import plain, reader
from bert_jax.data.checkpointing import InputStateRestore, InputStateSave
from bert_jax.errors import ReportedError
from bert_jax.models.params import layer_layout
from bert_jax.train import checkpoint_faults as faults
from bert_jax.train import coordination
from bert_jax.train.state import TrainState

log = logging.getLogger(__name__)

ITEMS = ("state", "data", "config")


class Checkpointer:
    """Keeps the last `keep` checkpoints plus every `keep_period`-th step (0: none).
    `save(..., force=True)` always saves; unforced saves follow orbax's interval `every`
    (the loop forces its own schedule: every `checkpoint.every` steps, the end, SIGTERM).
    `read_only`: another run's checkpoints (a warm start): nothing is created or cleaned;
    otherwise temporary folders left by a killed save are removed when it opens."""

    def __init__(self, workdir: str, *, every: int, keep: int = 3, keep_period: int = 0,
                 async_save: bool = True, read_only: bool = False, timeout: int = 300,
                 fail_at_step: Optional[int] = None):
        self.directory = paths.join(workdir, "checkpoints")  # gs://... stays a URI
        # A fault drill's hook: the save of this step fails on this process (no space).
        self.fail_at_step = fail_at_step
        multi = jax.process_count() > 1
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=max(int(every), 1),
            max_to_keep=int(keep) if keep and keep > 0 else None,
            keep_period=int(keep_period) if keep_period and keep_period > 0 else None,
            enable_async_checkpointing=bool(async_save),
            create=not read_only,
            read_only=bool(read_only),
            cleanup_tmp_directories=not read_only,
            async_options=ocp.AsyncOptions(
                timeout_secs=int(timeout),
                barrier_sync_fn=coordination.save_barrier if multi else None),
        )
        faults.quiet_orbax_errors()  # a fault is reported in one line, not 200 tracebacks
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        # bert_jax.data.state.RestoredInput of the last restore (exact or not, and why).
        self.data_restore = None
        # (step, reason, where it was moved) of each damaged step the last restore skipped.
        self.skipped: list[tuple[int, str, str]] = []
        self._pending: Optional[int] = None   # step of a save whose outcome is not known yet

    def latest_step(self) -> Optional[int]:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, state: TrainState, rng: jax.Array, data_iterator: Any, config: dict,
             *, force: bool = False) -> bool:
        """Starts saving at `state.step` (non-blocking): the arrays, `data_iterator`'s state
        as of now (snapshotted before the next `next()`), and `config` (a JSON-able dict).
        Returns whether a save started (it does every `every` steps, or when forced).
        Raises CheckpointSaveError if this save, or the previous one, failed."""
        step = int(jax.device_get(state.step))
        self._settle()
        tree = {"step": state.step, "params": state.params, "opt_state": state.opt_state,
                "rng": jax.random.key_data(rng)}
        if state.fp8:  # a model.fp8 run (none other has the item: their layout is as it was)
            tree["fp8"] = state.fp8
        try:
            started = self.manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(tree),
                    data=InputStateSave(iterator=data_iterator, fault=self._fault(step)),
                    config=ocp.args.JsonSave(config)),
                force=force)
        except Exception as e:  # noqa: BLE001  (any failure of the writers is this step's)
            raise self._save_failed(step, e) from None
        if started:
            self._pending = step
        return started

    def _fault(self, step: int) -> Optional[OSError]:
        if step != self.fail_at_step:
            return None
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected at step {step})")

    def check(self) -> None:
        """Raises CheckpointSaveError if the save in flight has finished and failed. Does not
        wait (a save still writing is left alone): call it after every step, so a failed
        save stops the run at the first step after it failed."""
        if self._pending is not None and not self.manager.is_saving_in_progress():
            self._settle()

    def _settle(self) -> None:
        """Waits for the save in flight; raises CheckpointSaveError if it failed."""
        step, self._pending = self._pending, None
        if step is None:
            return
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            raise self._save_failed(step, e) from None

    def _save_failed(self, step: int, error: BaseException) -> faults.CheckpointSaveError:
        elsewhere = faults.cause(error, coordination.SaveFailedElsewhere)
        if elsewhere is None:
            coordination.save_failed(step)  # first: the others stop waiting for this one
        self.manager.reload()  # orbax dropped steps it meant to delete from its list: re-read
        good = [s for s in self.manager.all_steps() if s != step]
        last_good = max(good) if good else None
        if elsewhere is not None:  # the failing process names the cause and cleans up
            faults.release(error)
            good = (f"last good checkpoint: {last_good}; fix the cause and run the same "
                    f"command again to resume from it" if last_good is not None else
                    "no earlier checkpoint; fix the cause and run the same command again")
            return faults.CheckpointSaveError(
                f"checkpoint at step {step} failed on process {elsewhere.process} (its log "
                f"names the cause); {good}", process=elsewhere.process)
        return faults.save_failed(self.directory, step, error, last_good)

    def restore(self, abstract_state: TrainState, data_iterator: Any = None,
                step: Optional[int] = None, rng_sharding=None):
        """(state on abstract_state's shardings, rng key, config) of `step`, onto any mesh
        and process count; `data_iterator` (if given) is moved to the saved position, or,
        when the checkpoint was saved by another process count, to the deterministic
        fallback position (warning; `self.data_restore.exact` is False).

        step=None: the latest step that restores. A damaged step is skipped and set aside
        (listed in `self.skipped` with the cause: the loops print one line for each);
        DamagedCheckpointError if none restores. A named `step` that fails to restore is a
        DamagedCheckpointError (nothing is moved). Other param shapes than
        `abstract_state`'s: CheckpointMismatchError, before any tensor is read."""
        self.skipped = []
        if step is not None:
            return self._restore_or_raise(abstract_state, data_iterator, step, rng_sharding)
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no checkpoint under {self.directory}")
        failures = []
        for candidate in steps:
            try:
                restored = self._restore(abstract_state, data_iterator, candidate,
                                         rng_sharding)
            except ReportedError:
                raise
            except Exception as e:  # noqa: BLE001  (any read error: this step is damaged)
                failures.append((candidate, faults.describe(e)))
                faults.release(e)
                continue
            for bad, reason in failures:
                self._skip(bad, reason)
            return restored
        shown = "; ".join(f"step {s}: {r}" for s, r in failures)
        raise faults.DamagedCheckpointError(
            f"no checkpoint under {self.directory} can be restored ({shown}); they are left "
            f"as they are: restore a copy, or start a new --workdir")

    def _skip(self, step: int, reason: str) -> None:
        """Sets a damaged step aside (process 0 renames it; the others wait for that)."""
        moved = self.directory
        if jax.process_index() == 0:
            moved = faults.set_aside(self.directory, step)
        ocp.multihost.sync_global_processes(f"bert_jax_set_aside_{step}")
        self.manager.reload()
        self.skipped.append((step, reason, moved))

    def _restore_or_raise(self, abstract_state, data_iterator, step, rng_sharding):
        try:
            return self._restore(abstract_state, data_iterator, step, rng_sharding)
        except ReportedError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._damaged(step, e) from None

    def _damaged(self, step: int, error: BaseException) -> faults.DamagedCheckpointError:
        reason = faults.describe(error)
        faults.release(error)
        return faults.DamagedCheckpointError(
            f"checkpoint {self.directory}/{step} cannot be restored: {reason}; name an "
            f"earlier step as WORKDIR/checkpoints/<step> (saved: {sorted(self.all_steps())})")

    def _restore(self, abstract_state, data_iterator, step, rng_sharding):
        # Raw data of the run's RNG key (jax's default implementation, threefry: uint32[2]);
        # traced here, not at import: jax.distributed.initialize comes first.
        key_data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
        check_shapes(self.directory, step, abstract_state.params, partial=False,
                     remedy="resume with the config that wrote it, or use a new --workdir",
                     fp8=bool(abstract_state.fp8))
        target = {"step": abstract_state.step, "params": abstract_state.params,
                  "opt_state": abstract_state.opt_state,
                  "rng": jax.ShapeDtypeStruct(key_data.shape, key_data.dtype,
                                              sharding=rng_sharding)}
        if abstract_state.fp8:
            target["fp8"] = abstract_state.fp8
        restored = self.manager.restore(
            step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target),
                data=InputStateRestore(iterator=data_iterator, fallback_batches=int(step)),
                config=ocp.args.JsonRestore()))
        self.data_restore = restored["data"]
        tree = restored["state"]
        state = TrainState(step=tree["step"], params=tree["params"],
                           opt_state=tree["opt_state"], fp8=tree.get("fp8", {}))
        rng = jax.random.wrap_key_data(tree["rng"])
        return state, rng, restored["config"]

    def restore_params(self, abstract_params, step: Optional[int] = None):
        """Only the params of a checkpoint (a warm start from another run)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint under {self.directory}")
        check_shapes(self.directory, step, abstract_params, partial=True,
                     remedy="start from a checkpoint of the config's architecture")
        try:
            restored = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
                    item={"params": abstract_params},
                    restore_args=jax.tree_util.tree_map(
                        lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding),
                        {"params": abstract_params}),
                    partial_restore=True)))
        except Exception as e:  # noqa: BLE001
            raise self._damaged(step, e) from None
        return restored["state"]["params"]

    def wait(self) -> None:
        """Waits for the save in flight; raises CheckpointSaveError if it failed."""
        self._settle()
        self.manager.wait_until_finished()

    def close(self, quiet: bool = False) -> None:
        """Waits for the save in flight and closes the manager. Never raises: a failure not
        reported yet (the run is already stopping on another error) is logged; `quiet`: the
        run stops on a failed save already, whose report this one would repeat (INFO)."""
        try:
            self._settle()
        except faults.CheckpointSaveError as e:
            log.log(logging.INFO if quiet else logging.ERROR, "%s", e)
        finally:
            self.manager.close()


def check_shapes(directory: str, step: int, abstract_params, *, partial: bool,
                 remedy: str, fp8: bool | None = None) -> None:
    """The params saved at `step` have the shapes of `abstract_params` (a tree of
    ShapeDtypeStructs), read from the checkpoint's metadata (no tensor is read); else a
    CheckpointMismatchError naming a differing parameter and both shapes. `partial`: only
    the parameters of `abstract_params` must be there (a warm start's encoder). `fp8`
    (a resume): whether the run has FP8 scaling state, which the checkpoint must have
    too, or not. A checkpoint whose metadata cannot be read is left to the restore (which
    reports the damage)."""
    manager = reader(directory)
    try:
        state = manager.item_metadata(step)["state"]
        meta = state["params"]
        saved_fp8 = "fp8" in state
    except Exception:  # noqa: BLE001
        return
    finally:
        manager.close()
    if fp8 is not None and saved_fp8 != fp8:
        raise faults.CheckpointMismatchError(
            f"{directory}/{step} was saved by a run with model.fp8={saved_fp8}, and this one "
            f"has model.fp8={fp8}: the FP8 scaling state is part of a run's state; resume "
            f"with --config.model.fp8={saved_fp8}, or start a new --workdir from its params "
            f"(--config.train.init_checkpoint={directory})")
    saved = {k: tuple(v.shape) for k, v in flax.traverse_util.flatten_dict(
        plain(meta)).items() if hasattr(v, "shape")}
    if not saved:  # metadata without shapes (another writer): nothing to compare
        return
    wanted = {k: tuple(v.shape) for k, v in flax.traverse_util.flatten_dict(
        plain(abstract_params)).items()}
    differ = sorted(k for k in wanted if saved.get(k) != wanted[k])
    if not partial:
        differ += sorted(k for k in saved if k not in wanted)
    if differ:
        k = differ[0]
        layout = layer_layout(saved)
        hint = (f" (its layers are saved with model.scan_layers={layout}: set "
                f"--config.model.scan_layers={str(layout).lower()})"
                if layout is not None and layout != layer_layout(wanted) else "")
        raise faults.CheckpointMismatchError(
            f"{directory}/{step} holds another model than the config: params/{'/'.join(k)} "
            f"is {saved.get(k, 'missing')} there, {wanted.get(k, 'missing')} in the config "
            f"({len(differ)} parameter(s) differ); {remedy}{hint}")


def to_numpy(tree):
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))
