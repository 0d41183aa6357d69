"""Feature extraction: the original `extract_features.py`, batched and jitted.

Reads sentences (one per line, or `text_a ||| text_b` pairs), tokenizes them as BERT
(`[CLS] a [SEP] (b [SEP])`, segment 1 for b), runs the encoder of a model directory and
returns the hidden states of the requested layers per token (`pooling="none"`), at
[CLS] (`"cls"`) or averaged over the real tokens, [CLS] and [SEP] included (`"mean"`,
the sentence-transformers recipe).

Examples are sorted by length and padded to a power-of-two length bucket, so a file of
short sentences does not pay for 512 positions and the number of compilations stays
logarithmic in max_seq_length.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import paths
from bert_jax.models.bert import BertModel
from bert_jax.models.config import BertConfig
from bert_jax.models.encoder import BertLayer

POOLINGS = ("none", "cls", "mean")
_PAIR = re.compile(r"^(.*?) \|\|\| (.*)$")  # the original's separator: " ||| "


@dataclasses.dataclass
class Example:
    line_index: int        # 0-based line of the input file
    text_a: str
    text_b: Optional[str]


@dataclasses.dataclass
class Encoded:
    input_ids: list[int]
    token_type_ids: list[int]
    truncated: bool


def read_examples(path: str) -> list[Example]:
    """One example per non-blank line; `A ||| B` is a pair. Blank lines are skipped."""
    examples = []
    with paths.open_text(path) as f:  # local or gs://
        for i, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            m = _PAIR.match(line)
            examples.append(Example(i, m.group(1), m.group(2)) if m else Example(i, line, None))
    if not examples:
        raise ValueError(f"{path}: no sentences (the file is empty or blank)")
    return examples


def encode_example(ex: Example, tokenizer, max_seq_length: int) -> Encoded:
    """[CLS] a [SEP] (b [SEP]); a pair is trimmed longest-first, one token at a time
    (the original _truncate_seq_pair), so both sides keep as much as possible."""
    a = list(tokenizer.encode(ex.text_a))
    b = list(tokenizer.encode(ex.text_b)) if ex.text_b is not None else None
    budget = max_seq_length - (3 if b is not None else 2)
    truncated = False
    if b is None:
        if len(a) > budget:
            a, truncated = a[:budget], True
    else:
        while len(a) + len(b) > budget:
            truncated = True
            (a if len(a) > len(b) else b).pop()
    ids = [tokenizer.cls_id] + a + [tokenizer.sep_id]
    types = [0] * len(ids)
    if b is not None:
        ids += b + [tokenizer.sep_id]
        types += [1] * (len(b) + 1)
    return Encoded(ids, types, truncated)


def parse_layers(spec: str | Sequence[int], num_layers: int) -> list[int]:
    """"-1,-2" -> [-1, -2]: indices into the outputs of the encoder layers (-1 = last),
    as the original --layers flag. Errors name the bad index and the valid range."""
    if isinstance(spec, str):
        try:
            spec = [int(s) for s in spec.split(",") if s.strip()]
        except ValueError:
            raise ValueError(f"--layers={spec!r}: expected comma-separated integers like -1,-2")
    if not spec:
        raise ValueError("--layers is empty")
    for i in spec:
        if not -num_layers <= i < num_layers:
            raise ValueError(f"--layers: layer {i} does not exist; the model has {num_layers} "
                             f"layers (valid: {-num_layers}..{num_layers - 1})")
    return list(spec)


def _bucket(length: int, max_seq_length: int) -> int:
    return min(max_seq_length, max(16, 1 << (length - 1).bit_length()))


class FeatureExtractor:
    """Runs the encoder of (params, config) and returns per-layer features.

    __call__(input_ids, token_type_ids, attention_mask: <int32>[batch, length]) ->
      pooling "none": <float32>[batch, length, n_layers, embed]
      pooling "cls" / "mean": <float32>[batch, n_layers, embed]
    """

    def __init__(self, params, config: BertConfig, layers: Sequence[int], pooling: str):
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r}; expected one of {POOLINGS}")
        # Features in float32 on any host (model.dtype=auto); an explicit dtype is kept.
        self.config = config.replace(scan_layers=False, remat="none",
                                     dtype=config.dtype_for("cpu"), fp8=False)
        self.layers = parse_layers(layers, config.num_hidden_layers)
        self.pooling = pooling
        self.params = jax.device_put(params)
        self._fn = jax.jit(self._forward)

    def _forward(self, params, input_ids, token_type_ids, attention_mask):
        c = self.config
        n = c.num_hidden_layers
        want = sorted({i % n for i in self.layers})
        # Capture the output of every BertLayer we need; the last one is the sequence
        # output itself (after the final LayerNorm of a pre-LN model).
        capture = (lambda m, method: isinstance(m, BertLayer) and method == "__call__"
                   and m.name in {f"layer_{i}" for i in want if i != n - 1})
        (seq, _), state = BertModel(c).apply(
            {"params": params}, input_ids, attention_mask, token_type_ids,
            capture_intermediates=capture, mutable=["intermediates"])
        inter = state.get("intermediates", {}).get("encoder", {})
        outs = [seq if i % n == n - 1 else inter[f"layer_{i % n}"]["__call__"][0]
                for i in self.layers]
        h = jnp.stack(outs, axis=2).astype(jnp.float32)  # [batch, length, n_layers, embed]
        if self.pooling == "none":
            return h
        if self.pooling == "cls":
            return h[:, 0]
        m = attention_mask.astype(jnp.float32)[:, :, None, None]
        # An all-padding filler row has no tokens: divide by 1, the row is dropped anyway.
        return (h * m).sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)

    def __call__(self, input_ids, token_type_ids, attention_mask):
        return np.asarray(self._fn(self.params, input_ids, token_type_ids, attention_mask))


def extract(examples: Sequence[Example], tokenizer, extractor: FeatureExtractor,
            max_seq_length: int, batch_size: int = 32, progress: bool = True):
    """Returns (features, encoded): features[i] is <float32>[n_layers, embed] (pooled) or
    [length_i, n_layers, embed] (pooling "none"), in the order of `examples`."""
    from tqdm import tqdm

    encoded = [encode_example(ex, tokenizer, max_seq_length) for ex in examples]
    truncated = [ex.line_index + 1 for ex, e in zip(examples, encoded) if e.truncated]
    if truncated:
        logging.warning("%d input(s) longer than max_seq_length=%d were truncated (lines %s%s)",
                        len(truncated), max_seq_length, truncated[:10],
                        " ..." if len(truncated) > 10 else "")
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].input_ids))
    features: list = [None] * len(encoded)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc="batches", unit="b", disable=not progress):
        length = _bucket(max(len(encoded[i].input_ids) for i in batch), max_seq_length)
        # Fixed batch size (filler rows) so that each length bucket compiles once.
        ids = np.full((batch_size, length), tokenizer.pad_id, np.int32)
        types = np.zeros((batch_size, length), np.int32)
        mask = np.zeros((batch_size, length), np.int32)
        for row, i in enumerate(batch):
            n = len(encoded[i].input_ids)
            ids[row, :n] = encoded[i].input_ids
            types[row, :n] = encoded[i].token_type_ids
            mask[row, :n] = 1
        out = extractor(ids, types, mask)
        for row, i in enumerate(batch):
            n = len(encoded[i].input_ids)
            features[i] = out[row, :n] if extractor.pooling == "none" else out[row]
    return features, encoded


def write_features(path: str, features, examples: Sequence[Example], encoded, tokenizer,
                   layers: Sequence[int], pooling: str) -> None:
    """.npy: <float32>[n, embed] (one layer) or [n, n_layers, embed], pooled only.
    .jsonl: the original extract_features format, one JSON object per input line.
    Written to a temporary file and renamed; `path` may be a URI (gs://...)."""
    check_output(path, pooling)
    if path.endswith(".npy"):
        arr = np.stack(features).astype(np.float32)
        if len(layers) == 1:
            arr = arr[:, 0]
        with paths.write_atomic(path, "wb") as f:
            np.save(f, arr)
    elif path.endswith(".jsonl"):
        with paths.write_atomic(path) as f:
            for ex, enc, feat in zip(examples, encoded, features):
                rec = {"linex_index": ex.line_index}
                if pooling == "none":
                    tokens = tokenizer.convert_ids_to_tokens(enc.input_ids)
                    rec["features"] = [
                        {"token": tok, "layers": [
                            {"index": li, "values": [round(float(v), 6) for v in feat[t, k]]}
                            for k, li in enumerate(layers)]}
                        for t, tok in enumerate(tokens)]
                else:
                    rec["pooling"] = pooling
                    rec["layers"] = [{"index": li, "values": [round(float(v), 6) for v in feat[k]]}
                                     for k, li in enumerate(layers)]
                f.write(json.dumps(rec) + "\n")


def check_output(path: str, pooling: str) -> None:
    """Refuses an output the format cannot hold, before any work is done."""
    if pooling not in POOLINGS:
        raise ValueError(f"--pooling={pooling!r}; expected one of {POOLINGS}")
    if not path.endswith((".npy", ".jsonl")):
        raise ValueError(f"--output_file={path}: expected a .npy or .jsonl file name")
    if path.endswith(".npy") and pooling == "none":
        raise ValueError(f"{path}: per-token features (--pooling=none) have a different "
                         f"length per sentence; write them to a .jsonl file, or pool")
    parent = os.path.dirname(paths.resolve(path))
    if not paths.is_dir(parent):
        raise FileNotFoundError(f"--output_file={path}: directory {parent} does not exist")


def check_vocab(tokenizer, config: BertConfig, vocab_file: str, checkpoint: str) -> None:
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(
            f"{vocab_file} has {tokenizer.vocab_size} tokens but the checkpoint {checkpoint} "
            f"was built for vocab_size={config.vocab_size}; use the vocabulary the model was "
            f"trained with")


__all__ = ["Example", "FeatureExtractor", "check_vocab", "encode_example", "extract",
           "check_output", "parse_layers", "read_examples", "write_features", "POOLINGS"]
