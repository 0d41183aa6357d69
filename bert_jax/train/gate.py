"""Input that fails on one of several processes stops every process at the same step, with
the last good step saved (before, the failing process stopped to save while the others
waited in the next step's collectives until the runtime gave up, nothing saved). A
checkpoint save that fails on one of them (`fail`) stops them all the same way, with nothing
saved after it: the last good checkpoint is the one to resume from.

One process: `next()` is next(train_data) and a failure is raised at once. Several: the
batch gets `input_ok` (bert_jax.train.step); a process whose input (or save) failed feeds
its previous batch with the failure flag, the step keeps the state for all alike, and
`check()` (reading each step's metrics one step behind, as the non-finite check does)
raises VoidSteps on every process at the same step. The first fetch of a run is agreed on
directly (runtime.agree). The flag of process p out of n is -1 - p for its input and
-1 - n - p for its save (the step keeps the smallest: one failure names one process).
"""

from __future__ import annotations

from typing import Optional

import jax
import numpy as np

from bert_jax.data import device as data_device
from bert_jax.errors import ReportedError
from bert_jax.train.checkpoint_faults import CheckpointSaveError
from bert_jax.train.runtime import InputFailedElsewhere, agree


INPUT, SAVE = "input", "save"   # what failed


class VoidSteps(Exception):
    """The step read from the metrics, and the `steps - 1` dispatched after it, ran after
    the `kind` (INPUT or SAVE) of process `process` failed: they kept the state as it was."""

    def __init__(self, steps: int, process: int, kind: str = INPUT):
        super().__init__(f"{steps} void step(s): the {kind} of process {process} failed")
        self.steps, self.process, self.kind = steps, process, kind


class InputGate:
    def __init__(self, sharding, local_rows: int):
        self.multi = jax.process_count() > 1
        self.error: Optional[ReportedError] = None   # this process's failure
        self.kind = INPUT
        self.last = None
        if self.multi:
            self.count = jax.process_count()
            p = jax.process_index()
            self.ok, self.bad = (data_device.to_global(
                {"input_ok": np.full(local_rows, v, np.float32)}, sharding)["input_ok"]
                for v in (1.0, -1.0 - p))
            self.sharding, self.rows = sharding, local_rows

    def fail(self, error: ReportedError) -> None:
        """A checkpoint save failed (several processes): from the next step on every
        process's steps are void, and `check` stops them all at the same step. The flag
        names the process whose part failed (`error.process`, else this one)."""
        if self.error is not None:
            return
        self.error, self.kind = error, SAVE
        failed = getattr(error, "process", None)
        failed = jax.process_index() if failed is None else failed
        self.bad = data_device.to_global(
            {"input_ok": np.full(self.rows, -1.0 - self.count - failed, np.float32)},
            self.sharding)["input_ok"]

    def next(self, train_data, first: bool) -> dict:
        if not self.multi:
            return next(train_data)
        if first:  # no previous batch to feed again
            batch = agree(lambda: next(train_data), "the first batch")
        elif self.error is None:
            try:
                batch = next(train_data)
            except ReportedError as e:
                self.error = e
        if self.error is not None:
            return dict(self.last, input_ok=self.bad)
        self.last = batch
        return dict(batch, input_ok=self.ok)

    def check(self, metrics: dict, void_after: int) -> None:
        if "train/input_ok" in metrics:
            flag = float(jax.device_get(metrics["train/input_ok"]))
            if flag <= 0:
                kind, process = divmod(int(round(-flag)) - 1, self.count)
                raise VoidSteps(1 + void_after, process, SAVE if kind else INPUT)


def void_error(gate: InputGate, void: VoidSteps, step: int,
               last_good: Optional[int] = None) -> ReportedError:
    """The error every process stops with: its own failure's, or one naming the process
    whose input or save failed (a save: with `last_good`, the checkpoint to resume from)."""
    if gate.error is not None and gate.kind == void.kind:
        if void.kind == SAVE:
            return type(gate.error)(f"{gate.error}; every process stopped at step {step}")
        return gate.error
    if void.kind == SAVE:
        good = (f"last good checkpoint: {last_good}; fix the cause and run the same command "
                f"again to resume from it" if last_good is not None else
                "no earlier checkpoint; fix the cause and run the same command again")
        return CheckpointSaveError(
            f"a checkpoint save failed on process {void.process} (its log names the step and "
            f"the cause); every process stopped at step {step}; {good}")
    return InputFailedElsewhere(
        f"the input of process {void.process} failed (its log names the file and what to "
        f"do); every process stopped at step {step}.")
