"""Process-level setup before JAX touches a backend (multi-host initialisation), the
SIGTERM (preemption) flag the training loops read between steps, and the agreement of all
processes on an input check (`agree`)."""

from __future__ import annotations

import glob
import os
import signal
import threading
from typing import Callable, Optional

from bert_jax.errors import ReportedError, UserError
from bert_jax.models.config import ConfigError


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


def on_tpu_vm() -> bool:
    """A Cloud TPU VM (one host of a slice or pod, or a single-host slice): TPU device
    files or the TPU runtime's environment. jax.distributed.initialize() then finds the
    other hosts by itself (and is harmless with a single host)."""
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return True
    return any(os.environ.get(k) for k in ("TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE",
                                           "TPU_WORKER_ID"))


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
               num_processes: Optional[int] = None, process_id: Optional[int] = None) -> bool:
    """Calls jax.distributed.initialize() when asked (mode "on", e.g. under SLURM, which
    jax detects), or in "auto" mode on a TPU VM or when a coordinator address is given.
    Returns whether it did.

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
    kwargs = {}
    if coordinator_address:
        kwargs = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                      process_id=process_id)
    jax.distributed.initialize(**kwargs)
    return True


class Preemption:
    """Turns SIGTERM into a flag a loop reads between steps (`with Preemption() as p: ...
    if p.requested: save and stop`). The handler is installed only on the main thread
    (Python delivers signals there) and the previous one is put back on exit."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame):  # noqa: ARG002
        self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
