"""Process-level setup before JAX touches a backend (multi-host initialisation), and the
SIGTERM (preemption) flag the training loops read between steps."""

from __future__ import annotations

import glob
import os
import signal
import threading
from typing import Optional


def on_tpu_vm() -> bool:
    """A Cloud TPU VM (one host of a slice or pod, or a single-host slice): TPU device
    files or the TPU runtime's environment. jax.distributed.initialize() then finds the
    other hosts by itself (and is harmless with a single host)."""
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return True
    return any(os.environ.get(k) for k in ("TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE",
                                           "TPU_WORKER_ID"))


def initialize(mode: str = "auto", coordinator_address: Optional[str] = None,
               num_processes: Optional[int] = None, process_id: Optional[int] = None) -> bool:
    """Calls jax.distributed.initialize() when asked (mode "on", e.g. under SLURM, which
    jax detects), or in "auto" mode on a TPU VM or when a coordinator address is given.
    Returns whether it did.

    On CPU, processes exchange collectives through gloo (jax's default CPU collectives),
    so a multi-process CPU run works on one machine (the tests use it)."""
    import jax

    from bert_jax.models.config import ConfigError

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
