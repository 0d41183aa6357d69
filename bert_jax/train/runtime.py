"""Process-level setup before JAX touches a backend: multi-host initialisation."""

from __future__ import annotations

import os
from typing import Optional


def on_multihost_tpu() -> bool:
    """A TPU VM that is one host of several (TPU_WORKER_HOSTNAMES lists them all)."""
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return len([h for h in hosts.split(",") if h.strip()]) > 1


def initialize(mode: str = "auto", coordinator_address: Optional[str] = None,
               num_processes: Optional[int] = None, process_id: Optional[int] = None) -> bool:
    """Calls jax.distributed.initialize() when asked (mode "on"), or in "auto" mode on a
    multi-host TPU VM or when a coordinator address is given. Returns whether it did.

    On CPU, processes exchange collectives through gloo (jax's default CPU collectives),
    so a multi-process CPU run works on one machine (the tests use it)."""
    import jax

    if mode not in ("auto", "on", "off"):
        raise ValueError(f"distributed mode {mode!r}; expected auto, on or off")
    wanted = mode == "on" or (mode == "auto" and (coordinator_address or on_multihost_tpu()))
    if not wanted:
        return False
    if coordinator_address and (num_processes is None or process_id is None):
        raise ValueError("--coordinator_address needs --num_processes and --process_id")
    kwargs = {}
    if coordinator_address:
        kwargs = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                      process_id=process_id)
    jax.distributed.initialize(**kwargs)
    return True
