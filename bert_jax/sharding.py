"""Logical axis names, and the rules that map them onto the device mesh.

Model code names every parameter and block-boundary activation axis with a name from
`LOGICAL_AXES`; it never names a mesh axis. A config's `mesh.rules` maps logical names onto
the mesh axes `data`, `fsdp`, `tensor`.
"""

from __future__ import annotations

from typing import Sequence
from bert_jax.models.config import ConfigError

# The one fixed vocabulary of logical axis names.
LOGICAL_AXES = (
    "batch",    # examples
    "length",   # sequence positions (also the position-embedding table rows)
    "embed",    # hidden size H
    "heads",    # attention heads
    "kv",       # per-head size H / heads
    "mlp",      # feed-forward inner size (4H), and the output side of H x H projections
    "vocab",    # WordPiece vocabulary
    "layers",   # the stacked layer axis of a scanned encoder
    "classes",  # small categorical axes: segment types, NSP / task labels; never sharded
)

MESH_AXES = ("data", "fsdp", "tensor")

# Default rules: batch over data and fsdp, parameters fully sharded over fsdp on their
# embed axis (ZeRO-3 style) and Megatron-style over tensor on heads / mlp / vocab.
# flax applies the rules in order and never uses a mesh axis twice in one array, so an
# activation [batch, length, embed] gets (("data", "fsdp"), None, None).
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("layers", None),
    ("classes", None),
)


def _config_error(message: str) -> Exception:
    # bert_jax.models imports this module: its ConfigError is imported when raised.

    return ConfigError(message)


def check_axis_names(names: Sequence[str | None], where: str = "") -> None:
    """Raises if a logical name is outside the fixed vocabulary."""
    for name in names:
        if name is not None and name not in LOGICAL_AXES:
            raise _config_error(
                f"{where}: logical axis name {name!r} is not one of {LOGICAL_AXES}")


# --- the device mesh and the shardings derived from the rules --------------------------


def rules_from_config(mesh_config=None) -> tuple:
    """The logical-axis rules of a config's `mesh` section (`mesh.rules`: a sequence of
    (logical name, mesh axis | sequence of mesh axes | None)); DEFAULT_RULES when unset."""
    rules = None if mesh_config is None else mesh_config.get("rules", None)
    if not rules:
        return DEFAULT_RULES
    out = []
    for i, rule in enumerate(rules):
        if len(rule) != 2:
            raise _config_error(
                f"config.mesh.rules[{i}]={rule!r}: expected (logical name, mesh axes)")
        name, axes = rule
        check_axis_names([name], where=f"config.mesh.rules[{i}]")
        axes_t = (axes,) if isinstance(axes, str) else tuple(axes or ())
        for a in axes_t:
            if a not in MESH_AXES:
                raise _config_error(
                    f"config.mesh.rules[{i}]: mesh axis {a!r} is not one of {MESH_AXES}")
        out.append((name, axes if isinstance(axes, str) or axes is None else tuple(axes)))
    return tuple(out)


def mesh_shape(mesh_config, num_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) sizes from `mesh.data/fsdp/tensor`; one of them may be -1 to take
    the devices left over. The product must equal the device count."""
    sizes = [int(mesh_config.get(a, 1)) for a in MESH_AXES]
    fills = [a for a, s in zip(MESH_AXES, sizes) if s == -1]
    if len(fills) > 1:
        raise _config_error(f"config.mesh: only one axis may be -1, got {fills}")
    if any(s == 0 or s < -1 for s in sizes):
        raise _config_error(f"config.mesh: sizes must be positive or -1, got "
                         f"{dict(zip(MESH_AXES, sizes))}")
    known = 1
    for s in sizes:
        if s != -1:
            known *= s
    if fills:
        if num_devices % known:
            raise _config_error(
                f"config.mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices are not "
                f"divisible by the fixed axes' product {known}")
        sizes = [num_devices // known if s == -1 else s for s in sizes]
    elif known != num_devices:
        raise _config_error(
            f"config.mesh {dict(zip(MESH_AXES, sizes))} needs {known} devices, "
            f"but there are {num_devices}")
    return tuple(sizes)


def make_mesh(mesh_config, devices=None):
    """A `jax.sharding.Mesh` with axes ("data", "fsdp", "tensor") over all (or the given)
    devices. On TPU `jax.make_mesh` orders devices along the physical torus so that the
    innermost axes (tensor, then fsdp) get the fastest links."""
    import jax
    import numpy as np

    devices = jax.devices() if devices is None else list(devices)
    shape = mesh_shape(mesh_config, len(devices))
    if len(devices) == len(jax.devices()):
        # Auto axes: GSPMD propagates shardings from the annotations (flax's logical
        # constraints), rather than the explicit-sharding type system.
        return jax.make_mesh(shape, MESH_AXES, (jax.sharding.AxisType.Auto,) * 3,
                             devices=devices)
    return jax.sharding.Mesh(np.asarray(devices).reshape(shape), MESH_AXES,
                             axis_types=(jax.sharding.AxisType.Auto,) * 3)


def logical_shardings(boxed_tree, mesh, rules=DEFAULT_RULES):
    """NamedShardings for a tree whose leaves are flax `LogicallyPartitioned` boxes (or
    plain leaves, which are replicated): the tree `nn.meta.unbox(boxed_tree)` has.

    A dimension whose size the mesh axes do not divide stays whole (e.g. BERT's 30,522-row
    vocabulary over tensor=4: 30522 = 2 x 3 x 5087): jax rejects uneven shardings of
    jit outputs, and replicating one table beats refusing the mesh."""
    import flax.linen as nn
    import jax

    specs = nn.get_partition_spec(boxed_tree)
    shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
    shapes = nn.meta.unbox(boxed_tree)
    return jax.tree_util.tree_map(lambda s, x: fit_sharding(s, getattr(x, "shape", ())),
                                  shardings, shapes)


def fit_sharding(sharding, shape):
    """`sharding` (a NamedSharding) with the mesh axes of each dimension of `shape` that they
    do not divide evenly dropped (that dimension replicated)."""
    from jax.sharding import NamedSharding, PartitionSpec

    spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
    fitted = []
    for dim, axes in zip(shape, spec):
        names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        size = 1
        for a in names:
            size *= sharding.mesh.shape[a]
        fitted.append(axes if dim % size == 0 else None)
    if tuple(fitted) == spec:
        return sharding
    return NamedSharding(sharding.mesh, PartitionSpec(*fitted))


def batch_mesh_axes(mesh, rules: Sequence | None = None) -> tuple[str, ...]:
    """Mesh axes of the logical "batch" axis under `rules`, limited to the mesh's axes."""
    rules = DEFAULT_RULES if rules is None else rules
    target = dict((name, axes) for name, axes in rules).get("batch")
    if target is None:
        return ()
    target = (target,) if isinstance(target, str) else tuple(target)
    return tuple(a for a in target if a in mesh.axis_names)


def batch_sharding(mesh, rules: Sequence | None = None):
    """NamedSharding of a batch array: dimension 0 over the "batch" mesh axes of `rules`
    (("data", "fsdp") by default), every other dimension whole."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(batch_mesh_axes(mesh, rules) or None))


def replicated(mesh):
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec())
