"""Input that fails on one of several processes stops every process at the same step, with
the last good step saved (before, the failing process stopped to save while the others
waited in the next step's collectives until the runtime gave up, nothing saved).

One process: `next()` is next(train_data) and a failure is raised at once. Several: the
batch gets `input_ok` (bert_jax.train.step); a process whose input failed feeds its previous
batch with the failure flag, the step keeps the state for all alike, and `check()` (reading
each step's metrics one step behind, as the non-finite check does) raises VoidSteps on every
process at the same step. The first fetch of a run is agreed on directly (runtime.agree).
"""

from __future__ import annotations

from typing import Optional

import jax
import numpy as np

from bert_jax.data import device as data_device
from bert_jax.errors import ReportedError
from bert_jax.train.runtime import InputFailedElsewhere, agree


class VoidSteps(Exception):
    """The step read from the metrics, and the `steps - 1` dispatched after it, ran on a
    failed input of process `process`: they kept the state as it was."""

    def __init__(self, steps: int, process: int):
        super().__init__(f"{steps} void step(s): the input of process {process} failed")
        self.steps, self.process = steps, process


class InputGate:
    def __init__(self, sharding, local_rows: int):
        self.multi = jax.process_count() > 1
        self.error: Optional[ReportedError] = None   # this process's input failure
        self.last = None
        if self.multi:
            p = jax.process_index()
            self.ok = data_device.to_global(
                {"input_ok": np.ones(local_rows, np.float32)}, sharding)["input_ok"]
            self.bad = data_device.to_global(
                {"input_ok": np.full(local_rows, -1.0 - p, np.float32)}, sharding)["input_ok"]

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
                raise VoidSteps(1 + void_after, int(-flag) - 1)


def void_error(gate: InputGate, void: VoidSteps, step: int) -> ReportedError:
    """The error every process stops with: its own input's, or one naming the process."""
    return gate.error or InputFailedElsewhere(
        f"the input of process {void.process} failed (its log names the file and what to "
        f"do); every process stopped at step {step}.")
