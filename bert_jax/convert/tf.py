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
from typing import Iterator, Mapping

import numpy as np

from bert_jax.convert import tensors
from bert_jax.convert.hf import HF_CONFIG_EXTRA_KEYS
from bert_jax.convert.tensors import ConversionError, Row
from bert_jax.models.config import ORIGINAL_KEYS, BertConfig
from bert_jax import paths

CKPT_NAME = "bert_model.ckpt"
CONFIG_NAME = "bert_config.json"
# The original TF code hard-codes this LayerNorm epsilon (it is not in bert_config.json).
ORIGINAL_LAYER_NORM_EPS = 1e-12


def encoder_layout(config: BertConfig) -> Iterator[Row]:
    """(TF name, our path, kind) for every tensor of the encoder, in checkpoint order."""
    for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        yield f"bert/embeddings/{table}", ("bert", "embeddings", table, "embedding"), "copy"
    yield "bert/embeddings/LayerNorm/gamma", ("bert", "embeddings", "LayerNorm", "scale"), "copy"
    yield "bert/embeddings/LayerNorm/beta", ("bert", "embeddings", "LayerNorm", "bias"), "copy"
    for i in range(config.num_hidden_layers):
        t, o = f"bert/encoder/layer_{i}/", ("bert", "encoder", f"layer_{i}")
        for proj in ("query", "key", "value"):
            yield f"{t}attention/self/{proj}/kernel", o + ("attention", proj, "kernel"), "qkv"
            yield f"{t}attention/self/{proj}/bias", o + ("attention", proj, "bias"), "qkv_bias"
        yield f"{t}attention/output/dense/kernel", o + ("attention", "output", "kernel"), "attn_out"
        yield f"{t}attention/output/dense/bias", o + ("attention", "output", "bias"), "copy"
        yield f"{t}attention/output/LayerNorm/gamma", o + ("attention_norm", "scale"), "copy"
        yield f"{t}attention/output/LayerNorm/beta", o + ("attention_norm", "bias"), "copy"
        yield f"{t}intermediate/dense/kernel", o + ("intermediate", "kernel"), "copy"
        yield f"{t}intermediate/dense/bias", o + ("intermediate", "bias"), "copy"
        yield f"{t}output/dense/kernel", o + ("output", "kernel"), "copy"
        yield f"{t}output/dense/bias", o + ("output", "bias"), "copy"
        yield f"{t}output/LayerNorm/gamma", o + ("output_norm", "scale"), "copy"
        yield f"{t}output/LayerNorm/beta", o + ("output_norm", "bias"), "copy"
    yield "bert/pooler/dense/kernel", ("bert", "pooler", "kernel"), "copy"
    yield "bert/pooler/dense/bias", ("bert", "pooler", "bias"), "copy"


HEAD_LAYOUT: tuple[Row, ...] = (
    # run_pretraining.py
    ("cls/predictions/transform/dense/kernel", ("mlm", "transform", "kernel"), "copy"),
    ("cls/predictions/transform/dense/bias", ("mlm", "transform", "bias"), "copy"),
    ("cls/predictions/transform/LayerNorm/gamma", ("mlm", "transform_norm", "scale"), "copy"),
    ("cls/predictions/transform/LayerNorm/beta", ("mlm", "transform_norm", "bias"), "copy"),
    ("cls/predictions/output_bias", ("mlm", "output_bias"), "copy"),
    ("cls/seq_relationship/output_weights", ("nsp", "dense", "kernel"), "transposed"),
    ("cls/seq_relationship/output_bias", ("nsp", "dense", "bias"), "copy"),
    # run_classifier.py (top-level names) and run_squad.py
    ("output_weights", ("classifier", "dense", "kernel"), "transposed"),
    ("output_bias", ("classifier", "dense", "bias"), "copy"),
    ("cls/squad/output_weights", ("qa_outputs", "dense", "kernel"), "transposed"),
    ("cls/squad/output_bias", ("qa_outputs", "dense", "bias"), "copy"),
)


def layout(config: BertConfig) -> list[Row]:
    return list(encoder_layout(config)) + list(HEAD_LAYOUT)


def _transforms(c: BertConfig):
    h, n, d = c.hidden_size, c.num_attention_heads, c.head_dim
    to_ours = {
        "copy": lambda x: x,
        "transposed": lambda x: x.T,
        "qkv": lambda x: x.reshape(h, n, d),
        "qkv_bias": lambda x: x.reshape(n, d),
        "attn_out": lambda x: x.reshape(n, d, h),
    }
    to_tf = {
        "copy": lambda x: x,
        "transposed": lambda x: x.T,
        "qkv": lambda x: x.reshape(h, h),
        "qkv_bias": lambda x: x.reshape(h),
        "attn_out": lambda x: x.reshape(h, h),
    }
    return to_ours, to_tf


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
    return BertConfig.from_dict(d, ignore=HF_CONFIG_EXTRA_KEYS, source=path)


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
    available = list_checkpoint(prefix)
    to_ours, to_tf = _transforms(config)
    rows, report = tensors.plan_import(
        list(encoder_layout(config)), HEAD_LAYOUT, available, to_tf, config, source=prefix,
        is_skipped=is_training_state)
    reader = tf.train.load_checkpoint(prefix)
    params = tensors.read_params(rows, reader.get_tensor, to_ours, config, report, progress)
    return params, report


def params_to_tf(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
    """Our tree (encoder under "bert", heads beside it) -> {original TF name: array}."""
    if config.pre_ln:
        raise ConversionError("pre-LN models have no original TF layout")
    rows = layout(config)
    left = tensors.unmapped(params, rows)
    if left:
        raise ConversionError(f"parameters with no TF name: {left[:10]}")
    _, to_tf = _transforms(config)
    return tensors.write_params(params, rows, to_tf)


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
