"""Which platform a trace compiles for, as the kernel dispatch (attention, FFN) names it,
which mesh axes a custom kernel's operands are sharded over, and the check of a kernel's
launch parameters."""

from __future__ import annotations

import math

import flax.linen as nn
import jax


def check_tiles(tuning, names: tuple[str, ...]) -> None:
    """Each named field of a launch-parameter dataclass is a power of two (Triton's tiles
    and warp counts); a ValueError names the field otherwise."""
    for name in names:
        value = getattr(tuning, name)
        if value < 1 or value & (value - 1):
            raise ValueError(f"{type(tuning).__name__}.{name}={value}: a power of two "
                             f"(Triton's tiles)")


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


def sharded_axes(logical: tuple[str, ...]):
    """(mesh, per logical axis name the mesh axes of size > 1 its rule maps it to) under the
    current abstract mesh, for the shard_map of a custom kernel, which XLA's sharding
    propagation cannot see into; None without a mesh of more than one device. The names
    are resolved together, as flax resolves an activation's names (a mesh axis serves the
    first name that claims it)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return None
    spec = nn.logical_to_mesh_axes(logical)
    axes = lambda a: () if a is None else (a,) if isinstance(a, str) else tuple(a)  # noqa: E731
    return mesh, tuple(tuple(n for n in axes(a) if mesh.shape[n] > 1) for a in spec)


def axes_size(mesh, names) -> int:
    """How many shards the mesh axes `names` make (1 for none)."""
    return math.prod(mesh.shape[n] for n in names)
