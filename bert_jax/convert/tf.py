"""Google's original TF1 BERT checkpoints <-> our parameter trees (both ways).

The original `modeling.py` names every variable by its tf.variable_scope path:
`bert/embeddings/word_embeddings`, `bert/encoder/layer_3/attention/self/query/kernel`,
`cls/predictions/output_bias`, ... Dense kernels are stored [in, out] like ours (no
transpose, unlike torch); only the attention projections need a reshape to our
[embed, heads, kv] / [heads, kv, embed] split, and the hand-made output layers
(`cls/seq_relationship/output_weights`, run_classifier's `output_weights`, run_squad's
`cls/squad/output_weights`) are stored [num_labels, hidden], i.e. transposed.

Reading uses `tf.train.list_variables` (names and shapes from the .index file, nothing
loaded) and `tf.train.load_checkpoint`; writing uses the SaveV2 op directly, which names
each tensor exactly as given -- `tf.train.Checkpoint` would store object-graph paths
(`model/.../.ATTRIBUTES/VARIABLE_VALUE`) that the original code cannot read.
"""

from __future__ import annotations

import json
import os
from typing import Iterator, Mapping, Optional

import numpy as np

from bert_jax import paths
from bert_jax.convert import tensors
from bert_jax.convert.formats import ATTN_OUT, COPY, QKV, QKV_BIAS, TRANSPOSE, Format
from bert_jax.convert.hf import HF_CONFIG_EXTRA_KEYS
from bert_jax.convert.tensors import ConversionError, Row
from bert_jax.models.config import ORIGINAL_KEYS, BertConfig

CKPT_NAME = "bert_model.ckpt"
CONFIG_NAME = "bert_config.json"
# The original TF code hard-codes this LayerNorm epsilon (it is not in bert_config.json).
ORIGINAL_LAYER_NORM_EPS = 1e-12


class Tf1Format(Format):
    """Google's TF1 names: every encoder name under `bert/` (no prefix to find), the heads
    of run_pretraining / run_classifier / run_squad, training state skipped."""

    title = "TF"

    def encoder_rows(self, config: BertConfig, prefix: str = "") -> Iterator[Row]:
        """(TF name, our path, kind) of every encoder tensor, in checkpoint order. Dense
        kernels are [in, out] as ours: only the attention's are reshaped."""
        for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
            yield f"bert/embeddings/{table}", ("bert", "embeddings", table, "embedding"), COPY
        yield "bert/embeddings/LayerNorm/gamma", ("bert", "embeddings", "LayerNorm", "scale"), COPY
        yield "bert/embeddings/LayerNorm/beta", ("bert", "embeddings", "LayerNorm", "bias"), COPY
        for i in range(config.num_hidden_layers):
            t, o = f"bert/encoder/layer_{i}/", ("bert", "encoder", f"layer_{i}")
            for proj in ("query", "key", "value"):
                yield f"{t}attention/self/{proj}/kernel", o + ("attention", proj, "kernel"), QKV
                yield (f"{t}attention/self/{proj}/bias", o + ("attention", proj, "bias"),
                       QKV_BIAS)
            yield (f"{t}attention/output/dense/kernel", o + ("attention", "output", "kernel"),
                   ATTN_OUT)
            yield f"{t}attention/output/dense/bias", o + ("attention", "output", "bias"), COPY
            yield f"{t}attention/output/LayerNorm/gamma", o + ("attention_norm", "scale"), COPY
            yield f"{t}attention/output/LayerNorm/beta", o + ("attention_norm", "bias"), COPY
            yield f"{t}intermediate/dense/kernel", o + ("intermediate", "kernel"), COPY
            yield f"{t}intermediate/dense/bias", o + ("intermediate", "bias"), COPY
            yield f"{t}output/dense/kernel", o + ("output", "kernel"), COPY
            yield f"{t}output/dense/bias", o + ("output", "bias"), COPY
            yield f"{t}output/LayerNorm/gamma", o + ("output_norm", "scale"), COPY
            yield f"{t}output/LayerNorm/beta", o + ("output_norm", "bias"), COPY
        yield "bert/pooler/dense/kernel", ("bert", "pooler", "kernel"), COPY
        yield "bert/pooler/dense/bias", ("bert", "pooler", "bias"), COPY

    def head_rows(self, config: BertConfig) -> tuple[Row, ...]:
        return HEAD_ROWS

    def is_skipped(self, name: str) -> bool:
        return is_training_state(name)

    def check_exportable(self, config: BertConfig) -> None:
        if config.pre_ln:
            raise ConversionError("pre-LN models have no original TF layout")

    def config_from(self, d: Mapping, source: str) -> BertConfig:
        """A bert_config.json's dict (original keys; a layer_norm_eps of ours is honoured)."""
        return BertConfig.from_dict(d, ignore=HF_CONFIG_EXTRA_KEYS, source=source)

    def config_to(self, config: BertConfig, params: Optional[Mapping] = None,
                  task: Optional[Mapping] = None) -> dict:
        return config_to_tf(config)


HEAD_ROWS: tuple[Row, ...] = (
    # run_pretraining.py
    ("cls/predictions/transform/dense/kernel", ("mlm", "transform", "kernel"), COPY),
    ("cls/predictions/transform/dense/bias", ("mlm", "transform", "bias"), COPY),
    ("cls/predictions/transform/LayerNorm/gamma", ("mlm", "transform_norm", "scale"), COPY),
    ("cls/predictions/transform/LayerNorm/beta", ("mlm", "transform_norm", "bias"), COPY),
    ("cls/predictions/output_bias", ("mlm", "output_bias"), COPY),
    ("cls/seq_relationship/output_weights", ("nsp", "dense", "kernel"), TRANSPOSE),
    ("cls/seq_relationship/output_bias", ("nsp", "dense", "bias"), COPY),
    # run_classifier.py (top-level names) and run_squad.py
    ("output_weights", ("classifier", "dense", "kernel"), TRANSPOSE),
    ("output_bias", ("classifier", "dense", "bias"), COPY),
    ("cls/squad/output_weights", ("qa_outputs", "dense", "kernel"), TRANSPOSE),
    ("cls/squad/output_bias", ("qa_outputs", "dense", "bias"), COPY),
)
TF1 = Tf1Format()


def layout(config: BertConfig) -> list[Row]:
    """Every TF1 row: the encoder's, then the heads'."""
    return TF1.rows(config)


def is_training_state(name: str) -> bool:
    """Optimizer slots and counters of the original run_pretraining (and NVIDIA's AMP
    loss-scale bookkeeping): present in training checkpoints, never imported."""
    base = name.rsplit("/", 1)[-1]
    return (base in ("adam_m", "adam_v", "global_step", "good_steps", "loss_scale",
                     "current_loss_scale", "bad_steps")
            or name.endswith(("/adam_m", "/adam_v", "/Momentum", "/Adam", "/Adam_1")))


def read_config(path: str) -> BertConfig:
    """A bert_config.json (original keys; a layer_norm_eps of ours is honoured). Read
    through tf.io.gfile, so gs:// paths of the published checkpoints work too."""
    import tensorflow as tf

    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path} not found; pass --config=…/bert_config.json")
    with tf.io.gfile.GFile(path, "r") as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from e
    return TF1.config_from(d, path)


def config_to_tf(config: BertConfig) -> dict:
    """The original bert_config.json keys (+ layer_norm_eps when it is not the original's;
    the original code ignores keys it does not use)."""
    if config.pre_ln:
        raise ConversionError("a pre-LN model has no equivalent in the original BERT code "
                              "(it is post-LN); refusing to write a TF checkpoint")
    d = {k: getattr(config, k) for k in ORIGINAL_KEYS}
    if config.layer_norm_eps != ORIGINAL_LAYER_NORM_EPS:
        d["layer_norm_eps"] = config.layer_norm_eps
    return d


def checkpoint_prefix(path: str) -> str:
    """Accepts a checkpoint prefix (…/bert_model.ckpt), one of its files, or a directory
    holding one; returns the prefix. Errors name what was looked for."""
    import tensorflow as tf

    gfile = tf.io.gfile  # local paths and gs:// alike
    if gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return latest
        candidates = sorted(f[:-len(".index")] for f in gfile.listdir(path) if f.endswith(".index"))
        if len(candidates) == 1:
            return os.path.join(path, candidates[0])
        raise FileNotFoundError(f"{path}: no TF checkpoint found (expected a *.index file "
                                f"or a 'checkpoint' state file)")
    for suffix in (".index", ".meta", ".data-00000-of-00001"):
        if path.endswith(suffix):
            path = path[:-len(suffix)]
    if not gfile.exists(path + ".index"):
        raise FileNotFoundError(f"{path}.index not found: --checkpoint must be a TF checkpoint "
                                f"prefix such as …/bert_model.ckpt")
    return path


def list_checkpoint(prefix: str) -> dict[str, tuple]:
    """{variable name: shape}, read from the index only."""
    import tensorflow as tf

    return {name: tuple(shape) for name, shape in tf.train.list_variables(prefix)}


def read_checkpoint(prefix: str, config: BertConfig, progress: bool = False):
    """TF1 checkpoint -> (params, ImportReport). Names and shapes are checked against the
    config before any tensor is read."""
    import tensorflow as tf

    prefix = checkpoint_prefix(prefix)
    rows, report = TF1.plan(list_checkpoint(prefix), config, prefix)
    reader = tf.train.load_checkpoint(prefix)
    params = tensors.read_params(rows, reader.get_tensor, config, report, progress)
    return params, report


def params_to_tf(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
    """Our tree (encoder under "bert", heads beside it) -> {original TF name: array}."""
    TF1.check_writable(params, config)
    return TF1.arrays(params, config)


def write_checkpoint(prefix: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Writes a TF (V2 format) checkpoint whose tensors carry exactly the given names,
    plus the `checkpoint` state file so that tf.train.latest_checkpoint(dir) finds it."""
    import tensorflow as tf

    names = sorted(arrays)
    with tf.device("/cpu:0"):
        tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=[tf.constant(arrays[n]) for n in names])
    # A relative path, so the directory can be moved (the text format of CheckpointState).
    base = os.path.basename(prefix)
    with open(os.path.join(os.path.dirname(prefix), "checkpoint"), "w") as f:
        f.write(f'model_checkpoint_path: "{base}"\nall_model_checkpoint_paths: "{base}"\n')


def save_tf_dir(output: str, params: Mapping, config: BertConfig,
                vocab_file: str | None = None) -> str:
    """OUTPUT/bert_model.ckpt.{index,data-*} + checkpoint + bert_config.json (+ vocab.txt),
    written to a temporary directory and renamed; OUTPUT may be a URI (gs://...). Returns the
    checkpoint prefix."""
    output = paths.resolve(output)
    if paths.exists(output):
        raise FileExistsError(f"{output} already exists; refusing to overwrite it")
    arrays = params_to_tf(params, config)  # validates before anything is written
    config_dict = config_to_tf(config)
    with paths.staged_dir(output) as tmp:
        write_checkpoint(os.path.join(tmp, CKPT_NAME), arrays)
        with open(os.path.join(tmp, CONFIG_NAME), "w", encoding="utf-8") as f:
            json.dump(config_dict, f, indent=2, sort_keys=True)
            f.write("\n")
        if vocab_file:
            paths.copy_file(vocab_file, os.path.join(tmp, "vocab.txt"))
    return os.path.join(output, CKPT_NAME)
