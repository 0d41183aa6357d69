"""Format-independent machinery for moving named tensors in and out of our parameter tree.

A checkpoint format (formats.Format: TF1, Hugging Face BERT, ModernBERT) lists its tensors
as rows of `(source_name, our_path, kind)`, where `our_path` starts at the root of our tree
("bert", "mlm", "nsp", "classifier", "qa_outputs") and `kind` (formats.Kind / Fused) turns
a tensor from the source's layout into ours and back (`to_ours`, `to_source`,
`source_shape`). Everything else -- which tensors must be there, what shape each must
have, what is left over -- is decided here, once, from the names and shapes alone, so a
checkpoint of the wrong model size fails before any tensor is read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Mapping, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.errors import UserError
from bert_jax.models.bert import BertModel
from bert_jax.models.config import BertConfig

Row = tuple[str, tuple, Any]  # (source name, our path, kind: formats.Kind / Fused)


class ConversionError(UserError, ValueError):
    """A checkpoint that does not fit the config (missing tensors, wrong shapes, ...)."""


@dataclasses.dataclass
class ImportReport:
    heads: list            # our head names that were imported ("mlm", "nsp", ...)
    missing_heads: list    # pre-training heads ("mlm", "nsp") absent from the source
    unexpected: list       # source tensors that map to nothing of ours (not imported)
    skipped: list          # optimizer state, counters, tied copies: deliberately not imported
    cast: list             # (name, dtype) of tensors converted to the config's param_dtype
    param_dtype: str = "float32"

    def summary(self) -> str:
        lines = [f"heads imported: {', '.join(self.heads) or 'none'}"]
        if self.missing_heads:
            lines.append(f"heads not in the source (left out): {', '.join(self.missing_heads)}")
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} optimizer-state / derived tensors "
                         f"(e.g. {', '.join(self.skipped[:3])})")
        if self.unexpected:
            lines.append(f"{len(self.unexpected)} unexpected tensors, not imported: "
                         f"{', '.join(self.unexpected[:10])}"
                         f"{' ...' if len(self.unexpected) > 10 else ''}")
        if self.cast:
            dtypes = sorted({d for _, d in self.cast})
            lines.append(f"cast {len(self.cast)} tensors from {', '.join(dtypes)} to "
                         f"{self.param_dtype}")
        return "\n".join(lines)


def our_shapes(config: BertConfig) -> dict[tuple, tuple]:
    """Flat {path: shape} of the encoder ("bert", ...) and of the fixed-size heads.
    The classifier heads have a free number of labels: their paths are absent here."""
    flat = flax.traverse_util.flatten_dict(encoder_shapes(config))
    shapes = {("bert",) + k: tuple(v.shape) for k, v in flat.items()}
    h, v = config.hidden_size, config.vocab_size
    shapes.update({
        ("mlm", "transform", "kernel"): (h, h), ("mlm", "transform", "bias"): (h,),
        ("mlm", "transform_norm", "scale"): (h,), ("mlm", "transform_norm", "bias"): (h,),
        ("mlm", "output_bias"): (v,),
        ("nsp", "dense", "kernel"): (h, 2), ("nsp", "dense", "bias"): (2,),
        ("qa_outputs", "dense", "kernel"): (h, 2), ("qa_outputs", "dense", "bias"): (2,),
    })
    return shapes


def plan_import(encoder: Sequence[Row], heads: Sequence[Row], available: Mapping[str, tuple],
                config: BertConfig, source: str,
                is_skipped: Callable[[str], bool] = lambda name: False):
    """Decides what to read, from names and shapes only.

    available: {source name: shape}. Returns (rows to read, ImportReport). Raises
    ConversionError listing every missing encoder tensor, every shape mismatch (name, the
    source shape and the shape the config implies) and every partially present head.
    """
    ours = our_shapes(config)
    errors, missing, rows = [], [], []

    def check(name, path, kind):
        got = tuple(available[name])
        if path in ours:
            want = kind.source_shape(ours[path], config)
        else:  # a classifier: any number of labels, but the hidden size must match
            want = None
            if path[-1] == "kernel" and config.hidden_size not in got:
                want = f"(num_labels, {config.hidden_size}) or ({config.hidden_size}, num_labels)"
        if want is not None and got != want:
            errors.append(f"{name}: shape {got} in the checkpoint, {want} expected from the "
                          f"config")

    for name, path, kind in encoder:
        if name not in available:
            missing.append(name)
        else:
            check(name, path, kind)
            rows.append((name, path, kind))
    if missing:
        raise ConversionError(
            f"{source}: {len(missing)} encoder tensor(s) missing: {missing[:10]}"
            f"{' ...' if len(missing) > 10 else ''}. Is this a BERT checkpoint of the shape "
            f"the config describes (num_hidden_layers={config.num_hidden_layers})?")
    by_head: dict[str, list] = {}
    for row in heads:
        by_head.setdefault(row[1][0], []).append(row)
    imported = []
    for head, head_rows in by_head.items():
        present = [r for r in head_rows if r[0] in available]
        if not present:
            continue
        absent = [r[0] for r in head_rows if r[0] not in available]
        if absent:
            errors.append(f"head {head!r} is incomplete: {absent} missing")
            continue
        for row in present:
            check(*row)
        rows.extend(present)
        imported.append(head)
    if errors:
        raise ConversionError(f"{source}: the checkpoint does not match the config:\n  "
                              + "\n  ".join(errors))
    used = {r[0] for r in rows}
    skipped = sorted(n for n in available if n not in used and is_skipped(n))
    unexpected = sorted(n for n in available if n not in used and not is_skipped(n))
    report = ImportReport(heads=sorted(imported),
                          missing_heads=[h for h in ("mlm", "nsp") if h not in imported],
                          unexpected=unexpected, skipped=skipped, cast=[])
    return rows, report


def read_params(rows: Iterable[Row], load: Callable[[str], np.ndarray], config: BertConfig,
                report: ImportReport, progress: bool = False) -> dict:
    """Reads every planned tensor with `load(name)` and returns our (nested) tree,
    in the config's param_dtype. Float16/bfloat16 sources are cast (and reported)."""
    rows = list(rows)
    if progress:
        from tqdm import tqdm

        rows = tqdm(rows, desc="tensors", unit="t", leave=False)
    flat = {}
    target = np.dtype(jax.numpy.dtype(config.param_dtype))  # bfloat16 through ml_dtypes
    for name, path, kind in rows:
        x = np.asarray(load(name))
        if not np.issubdtype(x.dtype, np.floating) and x.dtype.name != "bfloat16":
            raise ConversionError(f"{name}: dtype {x.dtype} is not a float tensor")
        if x.dtype != target:
            report.cast.append((name, x.dtype.name))
            report.param_dtype = target.name
            x = x.astype(target)
        flat[path] = np.ascontiguousarray(kind.to_ours(x, config))
    return flax.traverse_util.unflatten_dict(flat)


def write_params(params: Mapping, layout: Iterable[Row],
                 config: BertConfig) -> dict[str, np.ndarray]:
    """Our tree -> {source name: array} for every row whose head is in `params`; the rows
    of one name (the slices of a fused tensor) are joined along its first axis, in order."""
    flat = flax.traverse_util.flatten_dict(dict(params))
    pieces: dict[str, list] = {}
    for name, path, kind in layout:
        if path[0] not in params:
            continue
        if path not in flat:
            raise ConversionError(f"parameter {'/'.join(path)} is missing from the tree")
        pieces.setdefault(name, []).append(kind.to_source(np.asarray(flat[path]), config))
    return {name: np.ascontiguousarray(p[0] if len(p) == 1 else np.concatenate(p, axis=0))
            for name, p in pieces.items()}


def unmapped(params: Mapping, layout: Iterable[Row]) -> list[str]:
    """Our parameters that a layout does not cover (e.g. a pre-LN final_norm)."""
    covered = {path for _, path, _ in layout}
    return sorted("/".join(p) for p in flax.traverse_util.flatten_dict(dict(params))
                  if p not in covered)


def encoder_shapes(config: BertConfig) -> dict:
    """Unboxed ShapeDtypeStructs of BertModel's params (unscanned layout)."""
    model = BertModel(config.replace(scan_layers=False))
    ids = jnp.zeros((1, 2), jnp.int32)
    tree = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids))["params"]
    return flax.linen.meta.unbox(tree)
