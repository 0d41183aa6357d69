"""Hugging Face `transformers` BERT: the format (`BERT`: names, layouts, heads, config.json
both ways) and a state dict in memory -> our parameter tree (`hf_to_params`).

One table (`BertFormat.encoder_rows`, `HEAD_ROWS`) lists every tensor once with how its
layout differs from ours (formats.Kind), so the two directions cannot drift apart. HF
Linear weights are [out, in]; ours are [in, out], and attention projections are split into
[embed, heads, kv] / [heads, kv, embed]. Directories on disk: hf_files.py.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Optional

import flax
import numpy as np

from bert_jax.convert.formats import ATTN_OUT_T, COPY, QKV_BIAS, QKV_T, TRANSPOSE, Format
from bert_jax.convert.tensors import ConversionError, Row, encoder_shapes
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


def hf_name(name: str) -> str:
    """A transformers tensor name as our tables spell it: old checkpoints (and TF-converted
    ones) name LayerNorm params gamma / beta."""
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
        "LayerNorm.beta", "LayerNorm.bias")


class HfFormat(Format):
    """What transformers' formats share: torch names, old LayerNorm names read as new."""

    title = "Hugging Face"
    model_type = ""
    # {transformers class in config.json's "architectures": our task kind}
    task_kinds: Mapping[str, str] = {}

    def source_name(self, name: str) -> str:
        return hf_name(name)

    def head(self, params: Mapping, task: Optional[Mapping] = None
             ) -> tuple[dict, Optional[str]]:
        """What transformers calls the model of `params`, from its heads and the task
        record (model_dir.task_record) of the model directory: ({"architecture", "labels"
        (class names or None), "problem_type" (or None)}, a warning or None)."""
        raise NotImplementedError


# Our task kinds -> the transformers class of a model whose head is "classifier" or
# "qa_outputs" (both pre-training heads: BertForPreTraining; MLM alone: BertForMaskedLM).
ARCHITECTURES = {"glue": "BertForSequenceClassification",
                 "ner": "BertForTokenClassification",
                 "squad": "BertForQuestionAnswering",
                 "choice": "BertForMultipleChoice"}


class BertFormat(HfFormat):
    """transformers' BERT (BertModel / BertFor*): Linear weights [out, in] where ours are
    [in, out], attention projections split into [embed, heads, kv] / [heads, kv, embed];
    the encoder under "bert." (BertFor*) or at the root (BertModel)."""

    prefix = "bert."
    model_type = "bert"
    # HF tensors that are derived from others (tied or buffers): never imported.
    derived = ("embeddings.position_ids", "cls.predictions.decoder.weight",
               "cls.predictions.decoder.bias")
    task_kinds = {**{v: k for k, v in ARCHITECTURES.items()},
                  "BertForPreTraining": "pretraining", "BertForMaskedLM": "pretraining"}

    def encoder_rows(self, config: BertConfig, prefix: str) -> Iterator[Row]:
        e, b = prefix, ("bert",)
        for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
            yield f"{e}embeddings.{table}.weight", b + ("embeddings", table, "embedding"), COPY
        yield f"{e}embeddings.LayerNorm.weight", b + ("embeddings", "LayerNorm", "scale"), COPY
        yield f"{e}embeddings.LayerNorm.bias", b + ("embeddings", "LayerNorm", "bias"), COPY
        for i in range(config.num_hidden_layers):
            h, o = f"{e}encoder.layer.{i}.", b + ("encoder", f"layer_{i}")
            for proj in ("query", "key", "value"):
                yield (f"{h}attention.self.{proj}.weight", o + ("attention", proj, "kernel"),
                       QKV_T)
                yield f"{h}attention.self.{proj}.bias", o + ("attention", proj, "bias"), QKV_BIAS
            yield (f"{h}attention.output.dense.weight", o + ("attention", "output", "kernel"),
                   ATTN_OUT_T)
            yield f"{h}attention.output.dense.bias", o + ("attention", "output", "bias"), COPY
            yield f"{h}attention.output.LayerNorm.weight", o + ("attention_norm", "scale"), COPY
            yield f"{h}attention.output.LayerNorm.bias", o + ("attention_norm", "bias"), COPY
            yield f"{h}intermediate.dense.weight", o + ("intermediate", "kernel"), TRANSPOSE
            yield f"{h}intermediate.dense.bias", o + ("intermediate", "bias"), COPY
            yield f"{h}output.dense.weight", o + ("output", "kernel"), TRANSPOSE
            yield f"{h}output.dense.bias", o + ("output", "bias"), COPY
            yield f"{h}output.LayerNorm.weight", o + ("output_norm", "scale"), COPY
            yield f"{h}output.LayerNorm.bias", o + ("output_norm", "bias"), COPY
        yield f"{e}pooler.dense.weight", b + ("pooler", "kernel"), TRANSPOSE
        yield f"{e}pooler.dense.bias", b + ("pooler", "bias"), COPY

    def head_rows(self, config: BertConfig) -> tuple[Row, ...]:
        return HEAD_ROWS

    def tied(self, state: Mapping[str, np.ndarray], prefix: str) -> dict:
        return {"cls.predictions.decoder.weight":
                state[f"{prefix}embeddings.word_embeddings.weight"],
                "cls.predictions.decoder.bias": state["cls.predictions.bias"]}

    def config_from(self, d: Mapping, source: str) -> BertConfig:
        return config_from_hf(d, source)

    def config_to(self, config: BertConfig, params: Mapping,
                  task: Optional[Mapping] = None) -> dict:
        """config.json for the heads present and the task they were trained for (`head`):
        the architecture, and for classifiers num_labels, id2label / label2id and
        (sequence classification) problem_type."""
        if config.pre_ln:
            raise ConversionError("a pre-LN model has no transformers BERT equivalent "
                                  "(post-LN)")
        head, _ = self.head(params, task)
        d = config.to_dict(original_only=True)
        d.update(layer_norm_eps=config.layer_norm_eps, model_type="bert", pad_token_id=0,
                 position_embedding_type="absolute", architectures=[head["architecture"]])
        if head["labels"] is not None:
            d["num_labels"] = len(head["labels"])
            d["id2label"] = {str(i): name for i, name in enumerate(head["labels"])}
            d["label2id"] = {name: i for i, name in enumerate(head["labels"])}
        if head["problem_type"]:
            d["problem_type"] = head["problem_type"]
        return d

    def head(self, params: Mapping, task: Optional[Mapping] = None
             ) -> tuple[dict, Optional[str]]:
        """Without a task record a "classifier" head cannot be told apart (sentence, token
        or choice): it is exported as a sequence classifier named LABEL_i, and the warning
        says so."""
        kind = (task or {}).get("kind")
        labels = (task or {}).get("labels")
        head = {"architecture": "BertModel", "labels": None, "problem_type": None}
        if "mlm" in params:
            head["architecture"] = "BertForPreTraining" if "nsp" in params else "BertForMaskedLM"
            return head, None
        if "qa_outputs" in params:
            head["architecture"] = "BertForQuestionAnswering"
            return head, None
        if "classifier" not in params:
            return head, None
        n = int(np.shape(params["classifier"]["dense"]["bias"])[0])
        warning = None
        if kind not in ("glue", "ner", "choice"):
            warning = (f"no task record ({kind or 'no task.json'}) says what the classifier "
                       f"was trained for: exported as BertForSequenceClassification with "
                       f"labels LABEL_0..LABEL_{n - 1}")
            kind, labels = "glue", None
        head["architecture"] = ARCHITECTURES[kind]
        if kind == "choice":
            if n != 1:
                raise ConversionError(f"a multiple-choice head has one output, this "
                                      f"classifier has {n}")
            return head, warning
        if labels is not None and len(labels) != n:
            raise ConversionError(f"the task record names {len(labels)} labels "
                                  f"{list(labels)} but the classifier has {n} outputs")
        head["labels"] = (list(labels) if labels is not None
                          else [f"LABEL_{i}" for i in range(n)])
        if kind == "glue":
            head["problem_type"] = ("regression" if n == 1 and labels is None
                                    else "single_label_classification")
        return head, warning


HEAD_ROWS: tuple[Row, ...] = (
    ("cls.predictions.transform.dense.weight", ("mlm", "transform", "kernel"), TRANSPOSE),
    ("cls.predictions.transform.dense.bias", ("mlm", "transform", "bias"), COPY),
    ("cls.predictions.transform.LayerNorm.weight", ("mlm", "transform_norm", "scale"), COPY),
    ("cls.predictions.transform.LayerNorm.bias", ("mlm", "transform_norm", "bias"), COPY),
    ("cls.predictions.bias", ("mlm", "output_bias"), COPY),
    ("cls.seq_relationship.weight", ("nsp", "dense", "kernel"), TRANSPOSE),
    ("cls.seq_relationship.bias", ("nsp", "dense", "bias"), COPY),
    ("classifier.weight", ("classifier", "dense", "kernel"), TRANSPOSE),
    ("classifier.bias", ("classifier", "dense", "bias"), COPY),
    ("qa_outputs.weight", ("qa_outputs", "dense", "kernel"), TRANSPOSE),
    ("qa_outputs.bias", ("qa_outputs", "dense", "bias"), COPY),
)
BERT = BertFormat()


def hf_to_params(state: Mapping[str, np.ndarray], config: BertConfig,
                 source: str = "state dict") -> tuple[dict, dict]:
    """Converts a HF state dict in memory (BertModel or BertFor* keys) to our tree; a
    directory on disk is hf_files.read_hf_dir's (names and shapes checked before a read).

    Returns (params, report). params has the encoder under "bert" and any heads found
    ("mlm", "nsp", "classifier", "qa_outputs") beside it; report lists
    {"heads": [...], "missing_heads": [...], "unexpected": [...]}. A missing encoder tensor
    or a shape mismatch raises, naming the tensor and both shapes.
    """
    state = {hf_name(k): np.asarray(v) for k, v in state.items()}
    flat, used, missing = {}, set(), []
    for name, path, kind in BERT.encoder_rows(config, BERT.encoder_prefix(state)):
        if name not in state:
            missing.append(name)
            continue
        flat[path] = kind.to_ours(state[name], config)
        used.add(name)
    if missing:
        raise ConversionError(f"{source}: missing encoder tensors {missing[:8]}"
                              f"{' ...' if len(missing) > 8 else ''} ({len(missing)} in all)")
    present = set()
    for name, path, kind in BERT.head_rows(config):
        if name in state:
            flat[path] = kind.to_ours(state[name], config)
            used.add(name)
            present.add(path[0])
    params = flax.traverse_util.unflatten_dict(flat)
    unexpected = sorted(k for k in state if k not in used and not BERT.is_skipped(k))
    check_shapes(params, config, source)
    return params, {"heads": sorted(present),
                    "missing_heads": [h for h in ("mlm", "nsp") if h not in present],
                    "unexpected": unexpected}


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
