"""Hugging Face `transformers` ModernBERT (ModernBertModel / ModernBertForMaskedLM) config
and state dicts <-> our BertConfig and parameter trees (numpy, both ways).

ModernBERT is our encoder with rotary positions, a gated FFN, pre-LN with no attention
LayerNorm in layer 0, a final LayerNorm, no token types, no pooler and (usually) no biases;
its local layers attend within `local_attention // 2` tokens. Two of its tensors are fused
where ours are not: `attn.Wqkv` ([3 * hidden, hidden]: Q, K, V stacked) and `mlp.Wi`
([2 * intermediate, hidden]: the input half, then the gate half). A layout row names one
of our tensors and the slice of the HF tensor it is (`kind`); rows of one HF name are
concatenated in order on export.
"""

from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np

from bert_jax.convert.tensors import ConversionError
from bert_jax.models.config import BertConfig

MODEL_TYPE = "modernbert"
GLOBAL, LOCAL = "full_attention", "sliding_attention"

# Keys of transformers' ModernBertConfig that set nothing of ours (token ids, dropouts we
# fold, flash-attention and classifier options; each checked below where it matters).
HF_IGNORED = (
    "_name_or_path", "architectures", "model_type", "pad_token_id", "bos_token_id",
    "eos_token_id", "cls_token_id", "sep_token_id", "transformers_version", "torch_dtype",
    "dtype", "id2label", "label2id", "num_labels", "problem_type", "initializer_cutoff_factor",
    "embedding_dropout", "classifier_dropout", "classifier_pooling", "deterministic_flash_attn",
    "sparse_prediction", "sparse_pred_ignore_index", "reference_compile", "repad_logits_with_grad",
    "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
    "is_encoder_decoder", "tie_word_embeddings", "use_cache", "decoder_bias",
)

# Our fields a ModernBERT checkpoint fixes, and their values.
ARCHITECTURE = dict(position_embedding="rotary", pre_ln=True, layer0_attention_norm=False,
                    type_vocab_size=0, pooler=False)


def is_modernbert(config: BertConfig) -> bool:
    """Whether `config` is a ModernBERT-style encoder (exported as transformers' ModernBERT)."""
    return config.position_embedding == "rotary" or config.ffn_type != "dense"


def check_exportable(config: BertConfig) -> None:
    """Raises ConversionError naming every field that transformers' ModernBERT cannot hold."""
    wrong = [f"{k}={getattr(config, k)!r} (ModernBERT: {v!r})"
             for k, v in ARCHITECTURE.items() if getattr(config, k) != v]
    if config.ffn_type == "dense":
        wrong.append("ffn_type='dense' (ModernBERT: a gated FFN, 'geglu' or 'swiglu')")
    if wrong:
        raise ConversionError("this model has no transformers equivalent: a ModernBERT needs "
                              + "; ".join(wrong))


def _layer_pattern(d: Mapping, layers: int, source: str) -> int:
    """global_attn_every_n_layers of an HF config: from `layer_types` (newer transformers)
    or the key itself (older; default 3)."""
    types = d.get("layer_types")
    if types is None:
        return int(d.get("global_attn_every_n_layers", 3))
    types = list(types)
    if len(types) != layers or set(types) - {GLOBAL, LOCAL}:
        raise ConversionError(f"{source}: layer_types={types} is not {layers} entries of "
                              f"{GLOBAL!r} / {LOCAL!r}")
    if LOCAL not in types:
        return 1
    for n in range(2, layers + 1):
        if types == [GLOBAL if i % n == 0 else LOCAL for i in range(layers)]:
            return n
    raise ConversionError(f"{source}: layer_types={types}: only a global layer every N "
                          f"layers (layer i global when i % N == 0) is supported")


def _thetas(d: Mapping, source: str) -> tuple[float, float]:
    rope = d.get("rope_parameters") or {}
    out = []
    for kind, old, default in ((GLOBAL, "global_rope_theta", 160_000.0),
                               (LOCAL, "local_rope_theta", 10_000.0)):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise ConversionError(f"{source}: rope_type={params['rope_type']!r} for {kind} "
                                  f"layers; only the default rotary embedding is supported")
        out.append(float(params.get("rope_theta", d.get(old, default))))
    return out[0], out[1]


def config_from_hf(d: Mapping, source: str = "config.json") -> BertConfig:
    """Our BertConfig of a transformers ModernBertConfig dict (config.json)."""
    if d.get("model_type") != MODEL_TYPE:
        raise ConversionError(f"{source}: model_type={d.get('model_type')!r}, expected "
                              f"{MODEL_TYPE!r}")
    act = d.get("hidden_activation", "gelu")
    if d.get("classifier_activation", "gelu") != act:
        raise ConversionError(f"{source}: classifier_activation="
                              f"{d.get('classifier_activation')!r} differs from "
                              f"hidden_activation={act!r}; bert_jax uses one activation")
    biases = {k: bool(d.get(k, False)) for k in ("attention_bias", "mlp_bias",
                                                 "classifier_bias")}
    if len(set(biases.values())) > 1:
        raise ConversionError(f"{source}: {biases}: bert_jax has one use_bias for the "
                              f"attention, the FFN and the MLM transform")
    if not d.get("decoder_bias", True):
        raise ConversionError(f"{source}: decoder_bias=false; bert_jax's MLM head has an "
                              f"output bias")
    if not d.get("tie_word_embeddings", True):
        raise ConversionError(f"{source}: tie_word_embeddings=false; bert_jax ties the MLM "
                              f"decoder to the word embeddings")
    known = set(HF_IGNORED) | {
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "hidden_activation", "classifier_activation",
        "max_position_embeddings", "initializer_range", "norm_eps", "norm_bias",
        "attention_bias", "mlp_bias", "classifier_bias", "attention_dropout", "mlp_dropout",
        "layer_types", "global_attn_every_n_layers", "local_attention", "rope_parameters",
        "global_rope_theta", "local_rope_theta", "rope_scaling", "rope_theta", "head_dim"}
    unknown = sorted(k for k in d if k not in known)
    if unknown:
        raise ConversionError(f"{source}: ModernBERT config key(s) {unknown} are not "
                              f"understood by bert_jax")
    if d.get("rope_scaling"):
        raise ConversionError(f"{source}: rope_scaling is not supported")
    layers = int(d.get("num_hidden_layers", 22))
    hidden, heads = int(d.get("hidden_size", 768)), int(d.get("num_attention_heads", 12))
    if d.get("head_dim") not in (None, hidden // heads):
        raise ConversionError(f"{source}: head_dim={d['head_dim']} differs from hidden_size "
                              f"/ num_attention_heads")
    n = _layer_pattern(d, layers, source)
    local = n > 1 and layers > 1
    theta, local_theta = _thetas(d, source)
    return BertConfig(
        vocab_size=int(d.get("vocab_size", 50368)), hidden_size=hidden,
        num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=int(d.get("intermediate_size", 1152)), hidden_act=act,
        hidden_dropout_prob=float(d.get("mlp_dropout", 0.0)),
        attention_probs_dropout_prob=float(d.get("attention_dropout", 0.0)),
        max_position_embeddings=int(d.get("max_position_embeddings", 8192)),
        initializer_range=float(d.get("initializer_range", 0.02)),
        layer_norm_eps=float(d.get("norm_eps", 1e-5)),
        ffn_type="swiglu" if act == "silu" else "geglu",
        use_bias=biases["attention_bias"], norm_bias=bool(d.get("norm_bias", False)),
        rope_theta=theta, local_rope_theta=local_theta,
        global_attn_every_n_layers=n if local else 0,
        local_attention=int(d.get("local_attention", 128)) if local else 0,
        init_scheme="modernbert", **ARCHITECTURE)


def config_to_hf(config: BertConfig, architectures=("ModernBertForMaskedLM",)) -> dict:
    """transformers' config.json of our ModernBERT-style config."""
    check_exportable(config)
    c = config
    types = [LOCAL if c.layer_window(i) else GLOBAL for i in range(c.num_hidden_layers)]
    d = dict(
        model_type=MODEL_TYPE, architectures=list(architectures), vocab_size=c.vocab_size,
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        hidden_activation=c.hidden_act, classifier_activation=c.hidden_act,
        max_position_embeddings=c.max_position_embeddings,
        initializer_range=c.initializer_range, norm_eps=c.layer_norm_eps,
        norm_bias=c.norm_bias, attention_bias=c.use_bias, mlp_bias=c.use_bias,
        classifier_bias=c.use_bias, decoder_bias=True, tie_word_embeddings=True,
        attention_dropout=c.attention_probs_dropout_prob, mlp_dropout=c.hidden_dropout_prob,
        embedding_dropout=c.hidden_dropout_prob, layer_types=types,
        global_attn_every_n_layers=max(1, c.global_attn_every_n_layers),
        local_attention=c.local_attention or 2 * c.max_position_embeddings,
        rope_parameters={GLOBAL: {"rope_type": "default", "rope_theta": float(c.rope_theta)},
                         LOCAL: {"rope_type": "default",
                                 "rope_theta": float(c.local_rope_theta)}})
    # ModernBERT's own token ids where the vocabulary has them (its tokenizer's); a
    # smaller vocabulary is not ModernBERT's, and its ids are unknown here.
    for key, token in (("pad_token_id", 50283), ("bos_token_id", 50281),
                       ("eos_token_id", 50282), ("cls_token_id", 50281),
                       ("sep_token_id", 50282)):
        d[key] = token if token < c.vocab_size else None
    return d


def layout(config: BertConfig, prefix: str) -> Iterator[tuple[str, tuple, str]]:
    """(hf_name, our_path, kind) of every encoder tensor; `prefix` "model." (MaskedLM) or
    "" (ModernBertModel). Rows of one fused HF tensor come in their order within it."""
    c, p = config, prefix
    yield f"{p}embeddings.tok_embeddings.weight", ("embeddings", "word_embeddings",
                                                   "embedding"), "copy"
    yield from _norm(c, f"{p}embeddings.norm", ("embeddings", "LayerNorm"))
    for i in range(c.num_hidden_layers):
        h, o = f"{p}layers.{i}.", ("encoder", f"layer_{i}")
        if i > 0 or c.layer0_attention_norm:
            yield from _norm(c, f"{h}attn_norm", o + ("attention_norm",))
        for part in ("query", "key", "value"):
            yield f"{h}attn.Wqkv.weight", o + ("attention", part, "kernel"), f"qkv_{part}"
        if c.use_bias:
            for part in ("query", "key", "value"):
                yield f"{h}attn.Wqkv.bias", o + ("attention", part, "bias"), f"qkvb_{part}"
        yield f"{h}attn.Wo.weight", o + ("attention", "output", "kernel"), "attn_out"
        if c.use_bias:
            yield f"{h}attn.Wo.bias", o + ("attention", "output", "bias"), "copy"
        yield from _norm(c, f"{h}mlp_norm", o + ("output_norm",))
        yield f"{h}mlp.Wi.weight", o + ("intermediate", "kernel"), "wi_input"
        yield f"{h}mlp.Wi.weight", o + ("gate", "kernel"), "wi_gate"
        if c.use_bias:
            yield f"{h}mlp.Wi.bias", o + ("intermediate", "bias"), "wib_input"
            yield f"{h}mlp.Wi.bias", o + ("gate", "bias"), "wib_gate"
        yield f"{h}mlp.Wo.weight", o + ("output", "kernel"), "linear"
        if c.use_bias:
            yield f"{h}mlp.Wo.bias", o + ("output", "bias"), "copy"
    yield from _norm(c, f"{p}final_norm", ("encoder", "final_norm"))


def head_layout(config: BertConfig) -> list[tuple[str, tuple, str]]:
    """The MLM head's rows (ModernBertForMaskedLM; the decoder weight is the tied table)."""
    rows = [("head.dense.weight", ("mlm", "transform", "kernel"), "linear")]
    if config.use_bias:
        rows.append(("head.dense.bias", ("mlm", "transform", "bias"), "copy"))
    rows.extend((n, ("mlm",) + p[1:], k) for n, p, k in
                _norm(config, "head.norm", ("", "transform_norm")))
    rows.append(("decoder.bias", ("mlm", "output_bias"), "copy"))
    return rows


# HF tensors derived from others (the tied decoder, rotary buffers): never imported.
DERIVED = ("decoder.weight", "inv_freq")
KINDS = ("copy", "linear", "attn_out", "qkv_query", "qkv_key", "qkv_value", "qkvb_query",
         "qkvb_key", "qkvb_value", "wi_input", "wi_gate", "wib_input", "wib_gate")


def _norm(c: BertConfig, name: str, path: tuple):
    yield f"{name}.weight", path + ("scale",), "copy"
    if c.norm_bias:
        yield f"{name}.bias", path + ("bias",), "copy"


def _piece(kind: str) -> tuple[int, int]:
    """(index, count) of a fused tensor's slice along its first axis."""
    fused, _, part = kind.partition("_")
    order = ("query", "key", "value") if fused.startswith("qkv") else ("input", "gate")
    return order.index(part), len(order)


def to_ours(x: np.ndarray, kind: str, c: BertConfig) -> np.ndarray:
    if kind == "copy":
        return x
    if kind == "linear":
        return x.T
    if kind == "attn_out":
        return x.T.reshape(c.num_attention_heads, c.head_dim, c.hidden_size)
    i, n = _piece(kind)
    size = x.shape[0] // n
    x = x[i * size:(i + 1) * size]
    if kind.startswith("qkvb"):
        return x.reshape(c.num_attention_heads, c.head_dim)
    if kind.startswith("qkv"):
        return x.T.reshape(c.hidden_size, c.num_attention_heads, c.head_dim)
    return x.T if kind.startswith("wi_") else x


def piece_to_hf(x, kind: str, c: BertConfig):
    """Our tensor in HF layout: a whole tensor, or its slice of a fused one."""
    if kind == "copy":
        return x
    if kind in ("linear", "wi_input", "wi_gate"):
        return x.T
    if kind == "attn_out":
        return x.reshape(c.hidden_size, c.hidden_size).T
    if kind.startswith("qkvb"):
        return x.reshape(c.hidden_size)
    if kind.startswith("qkv"):
        return x.reshape(c.hidden_size, c.hidden_size).T
    return x  # wib_*


def to_hf_shape(x, kind: str, c: BertConfig):
    """The whole HF tensor's shape from one row's (for the importer's shape checks):
    a fused slice repeated as many times as the tensor has slices."""
    y = piece_to_hf(x, kind, c)
    if kind in ("copy", "linear", "attn_out"):
        return y
    _, n = _piece(kind)
    import jax.numpy as jnp

    return jnp.concatenate([y] * n, axis=0)


def params_to_hf(params: Mapping, config: BertConfig, prefix: str = "model.") -> dict:
    """Our tree (encoder under "bert", optionally "mlm") -> ModernBertForMaskedLM keys
    (ModernBertModel's with prefix="" and no "mlm")."""
    def get(path):
        node = params
        for p in path:
            node = node[p]
        return np.asarray(node)

    rows = [(n, ("bert",) + p, k) for n, p, k in layout(config, prefix)]
    if "mlm" in params:
        rows += head_layout(config)
    pieces: dict[str, list] = {}
    for name, path, kind in rows:
        pieces.setdefault(name, []).append(piece_to_hf(get(path), kind, config))
    state = {n: (v[0] if len(v) == 1 else np.concatenate(v, axis=0)) for n, v in pieces.items()}
    if "mlm" in params:
        state["decoder.weight"] = state[f"{prefix}embeddings.tok_embeddings.weight"]
    return {k: np.ascontiguousarray(v) for k, v in state.items()}
