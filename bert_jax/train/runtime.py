"""Process-level setup before JAX touches a backend (multi-host initialisation, with the
watchdog of bert_jax.train.coordination), SIGTERM as a stop every process agrees on
(`Preemption`), and the agreement of all processes on an input check (`agree`)."""

from __future__ import annotations

import glob
import os
import signal
import threading
from typing import Callable, Optional

from bert_jax.errors import ReportedError, UserError
from bert_jax.models.config import ConfigError
from bert_jax.supervise import on_tpu_vm
from bert_jax.train import coordination


class InputFailedElsewhere(UserError):
    """Another process's input failed (a corrupt shard, a bad file): this one stopped too."""


def agree(check: Callable[[], object], what: str):
    """Runs `check` on every process and stops them all if it raised a ReportedError on
    any: that process raises its own error, the others InputFailedElsewhere naming it.
    One process: just check(). Otherwise a process whose check failed leaves the others
    in their next collective (a barrier, a jitted step) until the runtime gives up, with
    its error only in its own log. Every process must call it at the same point."""
    import jax

    if jax.process_count() == 1:
        return check()
    from jax.experimental import multihost_utils

    import numpy as np

    result, error = None, None
    try:
        result = check()
    except ReportedError as e:
        error = e
    flags = multihost_utils.process_allgather(
        np.int32(-1 - jax.process_index() if error is not None else 1))
    if error is not None:
        raise error
    if int(np.min(flags)) < 0:
        raise InputFailedElsewhere(
            f"{what} of process {-1 - int(np.min(flags))} failed (its log names the file "
            f"and what to do)")
    return result


def tpu_chips() -> int:
    """Google TPU chips on this host's PCI bus (what jax's own Cloud TPU set-up counts)."""
    count = 0
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                count += f.read().strip() == "0x1ae0"  # Google's PCI vendor id
        except OSError:
            pass
    return count


def skip_absent_tpu() -> bool:
    """On a host with no TPU, keeps jax from trying its TPU backend; returns whether it did.

    Where libtpu is installed (the [test] extra, for the TPU compile tests) jax loads it on
    its first device query on any host, and libtpu then logs five lines of errors about TPU
    hosts it cannot find before jax falls back to the CPU. Skipped when the user chose
    (JAX_PLATFORMS, JAX_FORCE_TPU_INIT), on a TPU VM, or once jax's backends are up."""
    if (os.environ.get("JAX_PLATFORMS") or "JAX_FORCE_TPU_INIT" in os.environ
            or on_tpu_vm() or tpu_chips()):
        return False
    from jax._src import xla_bridge  # the factories jax tries, by platform name

    factories = getattr(xla_bridge, "_backend_factories", None)
    if (not isinstance(factories, dict) or "tpu" not in factories
            or xla_bridge.backends_are_initialized()):
        return False
    del factories["tpu"]
    return True


def initialize(mode: str = "auto", coordinator_address: Optional[str] = None,
               num_processes: Optional[int] = None, process_id: Optional[int] = None, *,
               heartbeat_timeout: float = 60, workdir: Optional[str] = None,
               verbose: bool = False) -> bool:
    """Calls jax.distributed.initialize() when asked (mode "on", e.g. under SLURM, which
    jax detects), or in "auto" mode on a TPU VM or when a coordinator address is given.
    Returns whether it did.

    With several processes, a process silent for `heartbeat_timeout` seconds is lost: every
    other one prints one line naming it (and the last complete checkpoint in `workdir`) and
    exits 1 (bert_jax.train.coordination; `verbose` adds the traceback of a failed
    collective). jax's own heartbeat timeout is twice that: it never ends a process before
    the watchdog's line.

    On CPU, processes exchange collectives through gloo (jax's default CPU collectives),
    so a multi-process CPU run works on one machine (the tests use it)."""
    import jax

    skip_absent_tpu()
    if mode not in ("auto", "on", "off"):
        raise ConfigError(f"distributed mode {mode!r}; expected auto, on or off")
    wanted = mode == "on" or (mode == "auto" and bool(coordinator_address or on_tpu_vm()))
    if not wanted:
        return False
    if coordinator_address and (num_processes is None or process_id is None):
        raise ConfigError("--coordinator_address needs --num_processes and --process_id")
    if not heartbeat_timeout > 0:
        raise ConfigError(f"config.train.heartbeat_timeout={heartbeat_timeout}: expected a "
                          f"number of seconds > 0")
    # jax's shutdown barrier waits at exit for a process still finishing alone (fine-tuning's
    # best model is written by process 0): at least jax's own default.
    kwargs = dict(heartbeat_timeout_seconds=int(2 * heartbeat_timeout + 1),
                  shutdown_timeout_seconds=max(300, int(2 * heartbeat_timeout + 1)))
    if coordinator_address:
        kwargs.update(coordinator_address=coordinator_address, num_processes=num_processes,
                      process_id=process_id)
    jax.distributed.initialize(**kwargs)
    coordination.start(heartbeat_timeout, workdir, verbose)
    return True


def any_process(flag: bool) -> bool:
    """Whether `flag` is True on any process (every process must call it at the same point;
    one process: `flag`)."""
    import jax

    if jax.process_count() == 1:
        return bool(flag)
    from jax.experimental import multihost_utils

    import numpy as np

    return bool(np.max(multihost_utils.process_allgather(np.int32(bool(flag)))))


# The coordination service's key of a preemption notice (jax's preemption sync manager
# writes it when a process receives SIGTERM).
NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"


class Preemption:
    """SIGTERM as a stop that every process makes after the same step, read between steps:

        with Preemption() as p:
            if p.noticed(start): stop before the first step
            ... after each step: if p.due(step): save and stop

    One process: a Python handler sets a flag (installed on the main thread only, where
    Python delivers signals; the previous one is put back on exit). Several: jax's
    preemption sync hears SIGTERM on any process (its own handler, set by
    jax.distributed.initialize: a Python handler would replace it, so none is installed)
    and picks the step after the furthest any process has reported; `due(step)` is True on
    every process at that step. Every process calls it after every step, with the step
    number (orbax's save reports steps to it too). `noticed(start)` reports the step the
    loop starts from and agrees whether a SIGTERM came before (while the run started, when
    no step had been reported: the step it picked is then one the loop never reaches)."""

    def __init__(self):
        import jax

        from jax._src import distributed

        self.requested = False
        self._previous = None
        self.sync = (jax.process_count() > 1
                     and distributed.global_state.preemption_sync_manager is not None)

    def __enter__(self):
        if not self.sync and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def due(self, step: int) -> bool:
        if not self.sync:
            return self.requested
        from jax.experimental import multihost_utils

        return multihost_utils.reached_preemption_sync_point(int(step))

    def noticed(self, start: int) -> bool:
        if not self.sync:
            return self.requested
        self.due(start)
        store = coordination.client()
        try:
            store.key_value_try_get(NOTICE_KEY)
            seen = True
        except Exception:  # noqa: BLE001  (NOT_FOUND: no SIGTERM yet)
            seen = False
        return any_process(seen)

    def _handle(self, signum, frame):  # noqa: ARG002
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
