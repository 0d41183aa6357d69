"""What a checkpoint format is: the reshape kinds (each written once) and `Format`, the
object a reader or writer picks once and asks everything else.

A format lists every tensor as a row `(source name, our path, kind)`: `our path` starts at
the root of our tree ("bert", "mlm", "nsp", "classifier", "qa_outputs"), and `kind` says
how the source's layout of the tensor differs from ours. The formats themselves:

    tf.TF1                    Google's TF1 checkpoints (bert/encoder/layer_N/...)
    hf.BERT                   transformers' BERT (bert.encoder.layer.N....)
    hf_modernbert.MODERNBERT  transformers' ModernBERT (fused Wqkv / Wi)

`tensors.py` moves the rows' tensors in and out of our tree, the same for every format.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from bert_jax.convert import tensors
from bert_jax.convert.tensors import ConversionError, Row
from bert_jax.models.config import BertConfig

Shape = Callable[[BertConfig], tuple]


@dataclasses.dataclass(frozen=True)
class Kind:
    """One tensor's layout in a source against ours: `transpose` when the source stores it
    [out, in] (torch's Linear, TF1's hand-made output layers [labels, hidden]); `ours` and
    `flat`, our shape and the source's (before any transpose) as functions of the config,
    for a tensor reshaped on the way (None: the same shape)."""

    name: str
    transpose: bool = False
    ours: Optional[Shape] = None
    flat: Optional[Shape] = None

    def to_ours(self, x, config: BertConfig):
        """The source's tensor `x` in our layout (a view where numpy can give one)."""
        if self.transpose:
            x = x.T
        return x if self.ours is None else x.reshape(self.ours(config))

    def to_source(self, x, config: BertConfig):
        """Our tensor `x` in the source's layout."""
        if self.flat is not None:
            x = x.reshape(self.flat(config))
        return x.T if self.transpose else x

    def source_shape(self, our_shape: tuple, config: BertConfig) -> tuple:
        """The source's shape of a tensor whose shape is `our_shape` here."""
        shape = tuple(our_shape) if self.flat is None else tuple(self.flat(config))
        return shape[::-1] if self.transpose else shape

    def transposed(self) -> "Kind":
        """The same reshape of a tensor stored [out, in] (torch's Linear)."""
        return dataclasses.replace(self, name=f"{self.name}.T", transpose=not self.transpose)


@dataclasses.dataclass(frozen=True)
class Fused:
    """Slice `index` of `count` equal slices along the first axis of one source tensor
    (ModernBERT's Wqkv: query, key, value; Wi: input, gate), each slice a `base` kind.
    A writer joins the slices of one name in row order."""

    base: Kind
    index: int
    count: int

    @property
    def name(self) -> str:
        return f"{self.base.name}[{self.index}/{self.count}]"

    def to_ours(self, x, config: BertConfig):
        size = x.shape[0] // self.count
        return self.base.to_ours(x[self.index * size:(self.index + 1) * size], config)

    def to_source(self, x, config: BertConfig):
        """Our tensor as its slice of the fused tensor."""
        return self.base.to_source(x, config)

    def source_shape(self, our_shape: tuple, config: BertConfig) -> tuple:
        """The whole fused tensor's shape (what a checkpoint's index holds)."""
        piece = self.base.source_shape(our_shape, config)
        return (piece[0] * self.count,) + piece[1:]


def _in_heads(c: BertConfig) -> tuple:
    return c.hidden_size, c.num_attention_heads, c.head_dim


def _heads(c: BertConfig) -> tuple:
    return c.num_attention_heads, c.head_dim


def _heads_out(c: BertConfig) -> tuple:
    return c.num_attention_heads, c.head_dim, c.hidden_size


def _square(c: BertConfig) -> tuple:
    return c.hidden_size, c.hidden_size


def _hidden(c: BertConfig) -> tuple:
    return (c.hidden_size,)


# The kinds. COPY and the reshapes are of tensors stored [in, out] as ours (TF1's Dense);
# TRANSPOSE and `.transposed()` of tensors stored [out, in].
COPY = Kind("copy")
TRANSPOSE = Kind("transpose", transpose=True)
# Q, K, V projections: [hidden, hidden] <-> our [embed, heads, kv]; biases [hidden] <->
# [heads, kv]; the attention output [hidden, hidden] <-> [heads, kv, embed].
QKV = Kind("qkv", ours=_in_heads, flat=_square)
QKV_BIAS = Kind("qkv_bias", ours=_heads, flat=_hidden)
ATTN_OUT = Kind("attn_out", ours=_heads_out, flat=_square)
# transformers' (torch's Linear) kernels are [out, in]: the same reshapes, transposed.
QKV_T, ATTN_OUT_T = QKV.transposed(), ATTN_OUT.transposed()


class Format:
    """One checkpoint format: its name table (`encoder_rows`, `head_rows`), the tensors it
    derives from others, its config file's dict both ways and what it cannot hold.
    Subclasses fill these in; the readers and writers ask only this object."""

    title = ""            # how messages name the format ("TF", "Hugging Face")
    prefix = ""           # the encoder names' prefix, which a source may leave out
    derived: tuple = ()   # endings of names derived from others: never imported

    def encoder_rows(self, config: BertConfig, prefix: str) -> Iterable[Row]:
        """Every encoder tensor's row, names under `prefix`, in checkpoint order."""
        raise NotImplementedError

    def head_rows(self, config: BertConfig) -> Sequence[Row]:
        """The heads' rows (their paths start at the head's name)."""
        raise NotImplementedError

    def config_from(self, d: Mapping, source: str) -> BertConfig:
        """Our BertConfig of the format's config dict (`source` names it in errors)."""
        raise NotImplementedError

    def config_to(self, config: BertConfig, params: Mapping,
                  task: Optional[Mapping] = None) -> dict:
        """The format's config dict of `config`, for the heads in `params` and the task
        they were trained for (model_dir.task_record)."""
        raise NotImplementedError

    def rows(self, config: BertConfig, prefix: Optional[str] = None) -> list[Row]:
        prefix = self.prefix if prefix is None else prefix
        return list(self.encoder_rows(config, prefix)) + list(self.head_rows(config))

    def encoder_prefix(self, names: Iterable[str]) -> str:
        """The prefix a source's names use: `prefix` if any name has it, else none."""
        return self.prefix if any(n.startswith(self.prefix) for n in names) else ""

    def export_prefix(self, params: Mapping) -> str:
        """The prefix a writer gives the encoder's names for a tree with these heads."""
        return self.prefix

    def source_name(self, name: str) -> str:
        """A source's tensor name as the name table spells it."""
        return name

    def is_skipped(self, name: str) -> bool:
        """A source tensor never imported (derived from others, training state)."""
        return any(name.endswith(d) for d in self.derived)

    def tied(self, state: Mapping[str, np.ndarray], prefix: str) -> dict:
        """The derived tensors a writer adds to the `state` of a tree with an MLM head
        (its decoder, tied to the word embeddings)."""
        return {}

    def check_exportable(self, config: BertConfig) -> None:
        """Raises ConversionError where the format cannot hold `config`'s model."""

    def plan(self, available: Mapping[str, tuple], config: BertConfig, source: str):
        """(rows to read, ImportReport) of a source's {name: shape}, before any read."""
        encoder = list(self.encoder_rows(config, self.encoder_prefix(available)))
        return tensors.plan_import(encoder, self.head_rows(config), available, config,
                                   source, is_skipped=self.is_skipped)

    def check_writable(self, params: Mapping, config: BertConfig) -> None:
        """Raises ConversionError, before anything is written, where `params` has no form
        in this format: the config's model, or a parameter with no name here."""
        self.check_exportable(config)
        left = tensors.unmapped(params, self.rows(config))
        if left:
            raise ConversionError(f"parameters with no {self.title} name: {left[:10]}")

    def arrays(self, params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
        """Our tree -> {source name: array} of the heads it holds, tied copies included."""
        prefix = self.export_prefix(params)
        state = tensors.write_params(params, self.rows(config, prefix), config)
        state.update(self.tied(state, prefix) if "mlm" in params else {})
        return {k: np.ascontiguousarray(v) for k, v in state.items()}
