"""Logical axis names, and the rules that map them onto the device mesh.

Model code names every parameter and block-boundary activation axis with a name from
`LOGICAL_AXES`; it never names a mesh axis. A config's `mesh.rules` maps logical names onto
the mesh axes `data`, `fsdp`, `tensor`.
"""

from __future__ import annotations

from typing import Sequence

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


def check_axis_names(names: Sequence[str | None], where: str = "") -> None:
    """Raises if a logical name is outside the fixed vocabulary."""
    for name in names:
        if name is not None and name not in LOGICAL_AXES:
            raise ValueError(
                f"{where}: logical axis name {name!r} is not one of {LOGICAL_AXES}")
