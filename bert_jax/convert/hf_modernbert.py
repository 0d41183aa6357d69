"""Hugging Face `transformers` ModernBERT (ModernBertModel / ModernBertForMaskedLM): the
format (`MODERNBERT`: names, layouts, the MLM head, config.json both ways).

ModernBERT is our encoder with rotary positions, a gated FFN, pre-LN with no attention
LayerNorm in layer 0, a final LayerNorm, no token types, no pooler and (usually) no biases;
its local layers attend within `local_attention // 2` tokens. Two of its tensors are fused
where ours are not: `attn.Wqkv` ([3 * hidden, hidden]: Q, K, V stacked) and `mlp.Wi`
([2 * intermediate, hidden]: the input half, then the gate half). A row names one of our
tensors and its slice of the HF tensor (formats.Fused); a writer joins the rows of one HF
name in order.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Optional

from bert_jax.convert.formats import ATTN_OUT_T, COPY, QKV_BIAS, QKV_T, TRANSPOSE, Fused
from bert_jax.convert.hf import HfFormat
from bert_jax.convert.tensors import ConversionError, Row
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


QKV_PARTS, FFN_PARTS = ("query", "key", "value"), ("input", "gate")
# Our tensors' slices of Wqkv (its weight and bias) and of Wi.
QKV_SLICES = {p: Fused(QKV_T, i, 3) for i, p in enumerate(QKV_PARTS)}
QKV_BIAS_SLICES = {p: Fused(QKV_BIAS, i, 3) for i, p in enumerate(QKV_PARTS)}
FFN_SLICES = {p: Fused(TRANSPOSE, i, 2) for i, p in enumerate(FFN_PARTS)}
FFN_BIAS_SLICES = {p: Fused(COPY, i, 2) for i, p in enumerate(FFN_PARTS)}


class ModernBertFormat(HfFormat):
    """transformers' ModernBERT: the encoder under "model." (ModernBertForMaskedLM) or at
    the root (ModernBertModel); the MLM head its only head."""

    prefix = "model."
    model_type = MODEL_TYPE
    # HF tensors derived from others (the tied decoder, rotary buffers): never imported.
    derived = ("decoder.weight", "inv_freq")
    task_kinds = {"ModernBertForMaskedLM": "pretraining"}

    def encoder_rows(self, config: BertConfig, prefix: str) -> Iterator[Row]:
        """Rows of one fused HF tensor come in their order within it."""
        c, p, b = config, prefix, ("bert",)
        yield (f"{p}embeddings.tok_embeddings.weight",
               b + ("embeddings", "word_embeddings", "embedding"), COPY)
        yield from _norm(c, f"{p}embeddings.norm", b + ("embeddings", "LayerNorm"))
        for i in range(c.num_hidden_layers):
            h, o = f"{p}layers.{i}.", b + ("encoder", f"layer_{i}")
            if i > 0 or c.layer0_attention_norm:
                yield from _norm(c, f"{h}attn_norm", o + ("attention_norm",))
            for part in QKV_PARTS:
                yield f"{h}attn.Wqkv.weight", o + ("attention", part, "kernel"), QKV_SLICES[part]
            if c.use_bias:
                for part in QKV_PARTS:
                    yield (f"{h}attn.Wqkv.bias", o + ("attention", part, "bias"),
                           QKV_BIAS_SLICES[part])
            yield f"{h}attn.Wo.weight", o + ("attention", "output", "kernel"), ATTN_OUT_T
            if c.use_bias:
                yield f"{h}attn.Wo.bias", o + ("attention", "output", "bias"), COPY
            yield from _norm(c, f"{h}mlp_norm", o + ("output_norm",))
            yield f"{h}mlp.Wi.weight", o + ("intermediate", "kernel"), FFN_SLICES["input"]
            yield f"{h}mlp.Wi.weight", o + ("gate", "kernel"), FFN_SLICES["gate"]
            if c.use_bias:
                yield f"{h}mlp.Wi.bias", o + ("intermediate", "bias"), FFN_BIAS_SLICES["input"]
                yield f"{h}mlp.Wi.bias", o + ("gate", "bias"), FFN_BIAS_SLICES["gate"]
            yield f"{h}mlp.Wo.weight", o + ("output", "kernel"), TRANSPOSE
            if c.use_bias:
                yield f"{h}mlp.Wo.bias", o + ("output", "bias"), COPY
        yield from _norm(c, f"{p}final_norm", b + ("encoder", "final_norm"))

    def head_rows(self, config: BertConfig) -> list[Row]:
        """The MLM head's rows (ModernBertForMaskedLM; the decoder weight is the tied
        table)."""
        rows = [("head.dense.weight", ("mlm", "transform", "kernel"), TRANSPOSE)]
        if config.use_bias:
            rows.append(("head.dense.bias", ("mlm", "transform", "bias"), COPY))
        rows.extend(_norm(config, "head.norm", ("mlm", "transform_norm")))
        rows.append(("decoder.bias", ("mlm", "output_bias"), COPY))
        return rows

    def export_prefix(self, params: Mapping) -> str:
        # ModernBertModel's own names have no "model." prefix.
        return self.prefix if "mlm" in params else ""

    def tied(self, state, prefix: str) -> dict:
        return {"decoder.weight": state[f"{prefix}embeddings.tok_embeddings.weight"]}

    def check_exportable(self, config: BertConfig) -> None:
        check_exportable(config)

    def config_from(self, d: Mapping, source: str) -> BertConfig:
        return config_from_hf(d, source)

    def head(self, params: Mapping, task: Optional[Mapping] = None
             ) -> tuple[dict, Optional[str]]:
        """ModernBertModel, or ModernBertForMaskedLM with an MLM head; other heads are
        refused."""
        if set(params) - {"bert", "mlm"}:
            raise ConversionError(
                f"a ModernBERT-style model is exported with its MLM head only; this one has "
                f"{sorted(set(params) - {'bert', 'mlm'})}")
        architecture = "ModernBertForMaskedLM" if "mlm" in params else "ModernBertModel"
        return {"architecture": architecture, "labels": None, "problem_type": None}, None

    def config_to(self, config: BertConfig, params: Mapping,
                  task: Optional[Mapping] = None) -> dict:
        """transformers' config.json of our ModernBERT-style config, for the heads in
        `params`."""
        head, _ = self.head(params, task)
        check_exportable(config)
        c = config
        types = [LOCAL if c.layer_window(i) else GLOBAL for i in range(c.num_hidden_layers)]
        d = dict(
            model_type=MODEL_TYPE, architectures=[head["architecture"]],
            vocab_size=c.vocab_size, hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size, num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=c.num_attention_heads, hidden_activation=c.hidden_act,
            classifier_activation=c.hidden_act,
            max_position_embeddings=c.max_position_embeddings,
            initializer_range=c.initializer_range, norm_eps=c.layer_norm_eps,
            norm_bias=c.norm_bias, attention_bias=c.use_bias, mlp_bias=c.use_bias,
            classifier_bias=c.use_bias, decoder_bias=True, tie_word_embeddings=True,
            attention_dropout=c.attention_probs_dropout_prob,
            mlp_dropout=c.hidden_dropout_prob, embedding_dropout=c.hidden_dropout_prob,
            layer_types=types, global_attn_every_n_layers=max(1, c.global_attn_every_n_layers),
            local_attention=c.local_attention or 2 * c.max_position_embeddings,
            rope_parameters={GLOBAL: {"rope_type": "default",
                                      "rope_theta": float(c.rope_theta)},
                             LOCAL: {"rope_type": "default",
                                     "rope_theta": float(c.local_rope_theta)}})
        # ModernBERT's own token ids where the vocabulary has them (its tokenizer's); a
        # smaller vocabulary is not ModernBERT's, and its ids are unknown here.
        for key, token in (("pad_token_id", 50283), ("bos_token_id", 50281),
                           ("eos_token_id", 50282), ("cls_token_id", 50281),
                           ("sep_token_id", 50282)):
            d[key] = token if token < c.vocab_size else None
        return d


MODERNBERT = ModernBertFormat()


def _norm(c: BertConfig, name: str, path: tuple):
    yield f"{name}.weight", path + ("scale",), COPY
    if c.norm_bias:
        yield f"{name}.bias", path + ("bias",), COPY
