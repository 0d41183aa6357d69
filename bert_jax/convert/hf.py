"""Hugging Face `transformers` BERT state dicts <-> our parameter trees (numpy, both ways).

One table (`_layout`) lists every tensor once with how its layout differs from ours, so the
two directions cannot drift apart. HF Linear weights are [out, in]; ours are [in, out], and
attention projections are split into [embed, heads, kv] / [heads, kv, embed].
"""

from __future__ import annotations

from typing import Iterator, Mapping

import flax
import numpy as np

from bert_jax.convert.tensors import ConversionError, encoder_shapes
from bert_jax.models.config import BertConfig

# Keys of transformers' config.json that are not BERT hyper-parameters of ours.
HF_CONFIG_EXTRA_KEYS = (
    "_name_or_path", "architectures", "model_type", "pad_token_id", "bos_token_id",
    "eos_token_id", "position_embedding_type", "use_cache", "classifier_dropout",
    "gradient_checkpointing", "transformers_version", "torch_dtype", "dtype", "id2label",
    "label2id", "num_labels", "problem_type", "directionality", "pooler_fc_size",
    "pooler_num_attention_heads",
    "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type", "output_past",
    "tie_word_embeddings", "is_decoder", "add_cross_attention", "chunk_size_feed_forward",
)


def config_from_hf(d: Mapping, source: str = "config.json") -> BertConfig:
    if d.get("model_type", "bert") != "bert":
        raise ValueError(f"{source}: model_type={d.get('model_type')!r}, expected 'bert'")
    if d.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{source}: position_embedding_type="
                         f"{d['position_embedding_type']!r} is not supported (absolute only)")
    d = {k: v for k, v in d.items() if not (k == "dtype" and v not in ("float32", "bfloat16"))}
    return BertConfig.from_dict({k: v for k, v in d.items() if k not in ("dtype",)},
                                ignore=HF_CONFIG_EXTRA_KEYS, source=source)


def config_to_hf(config: BertConfig, architectures=("BertForPreTraining",)) -> dict:
    d = config.to_dict(original_only=True)
    d.update(layer_norm_eps=config.layer_norm_eps, model_type="bert", pad_token_id=0,
             position_embedding_type="absolute", architectures=list(architectures))
    return d


def _layout(config: BertConfig, encoder_prefix: str) -> Iterator[tuple[str, tuple, str]]:
    """Yields (hf_name, our_path, kind) for every tensor of the encoder and the heads."""
    e = encoder_prefix
    for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        yield f"{e}embeddings.{table}.weight", ("embeddings", table, "embedding"), "copy"
    yield f"{e}embeddings.LayerNorm.weight", ("embeddings", "LayerNorm", "scale"), "copy"
    yield f"{e}embeddings.LayerNorm.bias", ("embeddings", "LayerNorm", "bias"), "copy"
    for i in range(config.num_hidden_layers):
        h, o = f"{e}encoder.layer.{i}.", ("encoder", f"layer_{i}")
        for proj in ("query", "key", "value"):
            yield f"{h}attention.self.{proj}.weight", o + ("attention", proj, "kernel"), "qkv"
            yield f"{h}attention.self.{proj}.bias", o + ("attention", proj, "bias"), "qkv_bias"
        yield f"{h}attention.output.dense.weight", o + ("attention", "output", "kernel"), "attn_out"
        yield f"{h}attention.output.dense.bias", o + ("attention", "output", "bias"), "copy"
        yield f"{h}attention.output.LayerNorm.weight", o + ("attention_norm", "scale"), "copy"
        yield f"{h}attention.output.LayerNorm.bias", o + ("attention_norm", "bias"), "copy"
        yield f"{h}intermediate.dense.weight", o + ("intermediate", "kernel"), "linear"
        yield f"{h}intermediate.dense.bias", o + ("intermediate", "bias"), "copy"
        yield f"{h}output.dense.weight", o + ("output", "kernel"), "linear"
        yield f"{h}output.dense.bias", o + ("output", "bias"), "copy"
        yield f"{h}output.LayerNorm.weight", o + ("output_norm", "scale"), "copy"
        yield f"{h}output.LayerNorm.bias", o + ("output_norm", "bias"), "copy"
    yield f"{e}pooler.dense.weight", ("pooler", "kernel"), "linear"
    yield f"{e}pooler.dense.bias", ("pooler", "bias"), "copy"


HEAD_LAYOUT = (
    ("cls.predictions.transform.dense.weight", ("mlm", "transform", "kernel"), "linear"),
    ("cls.predictions.transform.dense.bias", ("mlm", "transform", "bias"), "copy"),
    ("cls.predictions.transform.LayerNorm.weight", ("mlm", "transform_norm", "scale"), "copy"),
    ("cls.predictions.transform.LayerNorm.bias", ("mlm", "transform_norm", "bias"), "copy"),
    ("cls.predictions.bias", ("mlm", "output_bias"), "copy"),
    ("cls.seq_relationship.weight", ("nsp", "dense", "kernel"), "linear"),
    ("cls.seq_relationship.bias", ("nsp", "dense", "bias"), "copy"),
    ("classifier.weight", ("classifier", "dense", "kernel"), "linear"),
    ("classifier.bias", ("classifier", "dense", "bias"), "copy"),
    ("qa_outputs.weight", ("qa_outputs", "dense", "kernel"), "linear"),
    ("qa_outputs.bias", ("qa_outputs", "dense", "bias"), "copy"),
)

# HF tensors that are derived from others (tied or buffers): never imported.
_DERIVED = ("embeddings.position_ids", "cls.predictions.decoder.weight",
            "cls.predictions.decoder.bias")


def _to_ours(x: np.ndarray, kind: str, c: BertConfig) -> np.ndarray:
    if kind == "copy":
        return x
    if kind == "linear":
        return x.T
    if kind == "qkv":
        return x.T.reshape(c.hidden_size, c.num_attention_heads, c.head_dim)
    if kind == "qkv_bias":
        return x.reshape(c.num_attention_heads, c.head_dim)
    if kind == "attn_out":
        return x.T.reshape(c.num_attention_heads, c.head_dim, c.hidden_size)
    raise ValueError(kind)


def _to_hf(x: np.ndarray, kind: str, c: BertConfig) -> np.ndarray:
    if kind == "copy":
        return x
    if kind == "linear":
        return x.T
    if kind == "qkv":
        return x.reshape(c.hidden_size, c.hidden_size).T
    if kind == "qkv_bias":
        return x.reshape(c.hidden_size)
    if kind == "attn_out":
        return x.reshape(c.hidden_size, c.hidden_size).T
    raise ValueError(kind)


def _normalise_names(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Old checkpoints name LayerNorm params gamma / beta."""
    out = {}
    for k, v in state.items():
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[k] = np.asarray(v)
    return out


# One error type for every format (defined with the format-independent machinery).


def hf_to_params(state: Mapping[str, np.ndarray], config: BertConfig,
                 source: str = "state dict") -> tuple[dict, dict]:
    """Converts a HF state dict (BertModel or BertFor* keys) to our tree.

    Returns (params, report). params has the encoder under "bert" and any heads found
    ("mlm", "nsp", "classifier", "qa_outputs") beside it; report lists
    {"heads": [...], "missing_heads": [...], "unexpected": [...]}. A missing encoder tensor
    or a shape mismatch raises, naming the tensor and both shapes.
    """
    state = _normalise_names(state)
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    params: dict = {}
    used = set()

    def put(path, value):
        node = params
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = value

    missing = []
    for hf_name, path, kind in _layout(config, prefix):
        if hf_name not in state:
            missing.append(hf_name)
            continue
        put(("bert",) + path, _to_ours(state[hf_name], kind, config))
        used.add(hf_name)
    if missing:
        raise ConversionError(f"{source}: missing encoder tensors {missing[:8]}"
                              f"{' ...' if len(missing) > 8 else ''} ({len(missing)} in all)")
    heads, present = [], set()
    for hf_name, path, kind in HEAD_LAYOUT:
        if hf_name in state:
            put(path, _to_ours(state[hf_name], kind, config))
            used.add(hf_name)
            present.add(path[0])
    heads = sorted(present)
    missing_heads = [h for h in ("mlm", "nsp") if h not in present]
    unexpected = sorted(k for k in state if k not in used
                        and not any(k.endswith(d) for d in _DERIVED))
    check_shapes(params, config, source)
    return params, {"heads": heads, "missing_heads": missing_heads, "unexpected": unexpected}


def params_to_hf(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
    """Our tree (encoder under "bert", heads beside it) -> HF BertForPreTraining keys."""
    state = {}

    def get(path):
        node = params
        for p in path:
            node = node[p]
        return np.asarray(node)

    for hf_name, path, kind in _layout(config, "bert."):
        state[hf_name] = _to_hf(get(("bert",) + path), kind, config)
    for hf_name, path, kind in HEAD_LAYOUT:
        if path[0] in params:
            state[hf_name] = _to_hf(get(path), kind, config)
    if "mlm" in params:
        state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
        state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    return {k: np.ascontiguousarray(v) for k, v in state.items()}


def check_shapes(params: Mapping, config: BertConfig, source: str) -> None:
    """Every converted encoder tensor must have the shape our model (built from `config`,
    through jax.eval_shape: nothing allocated) expects; errors name the tensor."""
    expected = flax.traverse_util.flatten_dict(encoder_shapes(config))
    got = flax.traverse_util.flatten_dict(params["bert"])
    for path, want in expected.items():
        if path not in got:
            raise ConversionError(f"{source}: bert/{'/'.join(path)} is missing")
        if tuple(got[path].shape) != tuple(want.shape):
            raise ConversionError(
                f"{source}: bert/{'/'.join(path)} has shape {tuple(got[path].shape)}, "
                f"the config expects {tuple(want.shape)}")
