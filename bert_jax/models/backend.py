"""Which platform a trace compiles for, as the kernel dispatch (attention, FFN) names it."""

from __future__ import annotations

import jax


def platform() -> str:
    """The platform the current trace compiles for: the mesh's devices when a mesh is set
    (so a GPU compile target on a CPU host counts as GPU), else jax's default backend.
    "cuda" and "rocm" are reported as "gpu"."""
    mesh = jax.sharding.get_abstract_mesh()
    name = None
    if not mesh.empty and mesh.abstract_device is not None:
        name = mesh.abstract_device.platform
    return platform_name(name or jax.default_backend())


def platform_name(name: str) -> str:
    """A device's platform as the dispatch names it: "cuda" and "rocm" are "gpu"."""
    return "gpu" if name in ("cuda", "rocm", "gpu") else name
