"""Hugging Face model directories on disk: config.json + model.safetensors (or sharded
safetensors, or pytorch_model.bin), read into / written from our parameter tree.

The name <-> path table is `hf.py`'s (one table for both directions); this module adds the
files, the check of names and shapes before any tensor is read, and the reports.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Callable, Mapping, Optional

import numpy as np

from bert_jax import paths
from bert_jax.convert import hf, hf_modernbert, model_dir, tensors
from bert_jax.convert.tensors import ConversionError
from bert_jax.models.config import BertConfig

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
TORCH_MISSING = ("needs PyTorch to read pytorch_model.bin, and torch is not installed here. "
                 "Install it (pip install torch), or convert the weights to model.safetensors "
                 "where torch is available")


def _hf_name(name: str) -> str:
    # Old checkpoints (and TF-converted ones) name LayerNorm params gamma / beta.
    return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
        "LayerNorm.beta", "LayerNorm.bias")


def _transforms(config: BertConfig):
    if hf_modernbert.is_modernbert(config):
        m = hf_modernbert
        to_ours = {k: functools.partial(lambda x, k: m.to_ours(x, k, config), k=k)
                   for k in m.KINDS}
        # The whole (fused) tensor's shape, for the importer's checks.
        to_hf = {k: functools.partial(lambda x, k: m.to_hf_shape(x, k, config), k=k)
                 for k in m.KINDS}
        return to_ours, to_hf
    kinds = ("copy", "linear", "qkv", "qkv_bias", "attn_out")
    to_ours = {k: functools.partial(lambda x, k: hf._to_ours(x, k, config), k=k) for k in kinds}
    to_hf = {k: functools.partial(lambda x, k: hf._to_hf(x, k, config), k=k) for k in kinds}
    return to_ours, to_hf


def _layouts(config: BertConfig, names) -> tuple[list, list, Callable[[str], bool]]:
    """(encoder rows with paths from the root, head rows, is_derived) of the HF format of
    `config` (BERT or ModernBERT), the encoder's prefix found from `names`."""
    if hf_modernbert.is_modernbert(config):
        m = hf_modernbert
        prefix = "model." if any(k.startswith("model.") for k in names) else ""
        encoder = [(n, ("bert",) + p, k) for n, p, k in m.layout(config, prefix)]
        return encoder, m.head_layout(config), lambda n: any(n.endswith(d) for d in m.DERIVED)
    prefix = "bert." if any(k.startswith("bert.") for k in names) else ""
    # hf's encoder paths are relative to "bert"; its head paths start at the root.
    encoder = [(n, ("bert",) + p, k) for n, p, k in hf._layout(config, prefix)]
    return encoder, list(hf.HEAD_LAYOUT), lambda n: any(n.endswith(d) for d in hf._DERIVED)


def _open_weights(directory: str) -> tuple[dict[str, tuple], Callable[[str], np.ndarray], str]:
    """({name: shape}, load(name), description) without reading any tensor data where the
    format allows it (safetensors: header only)."""
    from safetensors import safe_open

    def from_safetensors(files: list[str]):
        shapes, where = {}, {}
        for path in files:
            with safe_open(path, framework="numpy") as f:
                for k in f.keys():
                    shapes[k] = tuple(f.get_slice(k).get_shape())
                    where[k] = path

        def load(name):
            with safe_open(where[name], framework="numpy") as f:
                return f.get_tensor(name)

        return shapes, load

    index = os.path.join(directory, SAFETENSORS_INDEX)
    single = os.path.join(directory, SAFETENSORS)
    if os.path.isfile(single):
        shapes, load = from_safetensors([single])
        return shapes, load, single
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        shapes, load = from_safetensors([os.path.join(directory, n) for n in files])
        return shapes, load, index
    bins = [p for p in (TORCH_BIN, TORCH_BIN_INDEX) if os.path.isfile(os.path.join(directory, p))]
    if bins:
        try:
            import torch
        except ImportError:
            raise ImportError(f"{os.path.join(directory, bins[0])}: {TORCH_MISSING}") from None
        files = [TORCH_BIN]
        if bins[0] == TORCH_BIN_INDEX:
            with open(os.path.join(directory, TORCH_BIN_INDEX), encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        state = {}
        for name in files:
            path = os.path.join(directory, name)
            try:  # memory-mapped: only the tensors we read are paged in
                part = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # the pre-1.6 (non-zip) format cannot be memory-mapped
                part = torch.load(path, map_location="cpu", weights_only=True)
            state.update(part)

        def load(name):
            t = state[name]
            return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()

        return ({k: tuple(v.shape) for k, v in state.items()}, load,
                os.path.join(directory, bins[0]))
    present = sorted(os.listdir(directory))
    raise FileNotFoundError(
        f"{directory}: no weights found; expected {SAFETENSORS}, {SAFETENSORS_INDEX} or "
        f"{TORCH_BIN} (TF .h5 and Flax .msgpack files are not read: convert them with "
        f"transformers first). The directory holds: {present[:20]}")


def read_hf_config(directory: str) -> BertConfig:
    """The BertConfig of a Hugging Face directory's config.json (no weight is read)."""
    if paths.is_uri(directory):
        raise ValueError(
            f"{directory}: a Hugging Face directory is read from local disk (its weight files "
            f"are memory-mapped); copy it to this machine first (gsutil -m cp -r), then "
            f"convert it there with `python -m bert_jax.convert from-hf --output=gs://...` "
            f"if a model directory in the bucket is what you need")
    config_path = os.path.join(directory, "config.json")
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"{config_path} not found: --input must be a Hugging Face "
                                f"model directory (config.json + model.safetensors)")
    with open(config_path, encoding="utf-8") as f:
        d = json.load(f)
    if isinstance(d, dict) and d.get("model_type") == hf_modernbert.MODEL_TYPE:
        return hf_modernbert.config_from_hf(d, source=config_path)
    return hf.config_from_hf(d, source=config_path)


def read_hf_dir(directory: str, progress: bool = False):
    """Returns (params, config, ImportReport, vocab file or None)."""
    config = read_hf_config(directory)
    shapes, load, source = _open_weights(directory)
    renamed = {_hf_name(k): k for k in shapes}
    available = {k: shapes[v] for k, v in renamed.items()}
    to_ours, to_hf = _transforms(config)
    encoder, heads, derived = _layouts(config, available)
    rows, report = tensors.plan_import(encoder, heads, available, to_hf, config, source,
                                       is_skipped=derived)
    params = tensors.read_params(rows, lambda n: load(renamed[n]), to_ours, config, report,
                                 progress)
    return params, config, report, hf_vocab(directory)


def hf_vocab(directory: str) -> Optional[str]:
    """DIR/vocab.txt of a Hugging Face directory, if there is one."""
    vocab = os.path.join(directory, "vocab.txt")
    return vocab if os.path.isfile(vocab) else None


# Our task kinds -> the transformers class of a model whose head is "classifier" or
# "qa_outputs" (both pre-training heads: BertForPreTraining; MLM alone: BertForMaskedLM).
ARCHITECTURES = {"glue": "BertForSequenceClassification",
                 "ner": "BertForTokenClassification",
                 "squad": "BertForQuestionAnswering",
                 "choice": "BertForMultipleChoice"}
KINDS = {v: k for k, v in ARCHITECTURES.items()}
KINDS.update(BertForPreTraining="pretraining", BertForMaskedLM="pretraining",
             ModernBertForMaskedLM="pretraining")
SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                  "cls_token": "[CLS]", "mask_token": "[MASK]"}
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"


def hf_head(params: Mapping, task: Optional[Mapping] = None,
            modernbert: bool = False) -> tuple[dict, Optional[str]]:
    """What transformers calls the model of `params`, from its heads and the task record
    (model_dir.task_record) of the model directory: ({"architecture", "labels" (class names
    or None), "problem_type" (or None)}, a warning or None). Without a record a
    "classifier" head cannot be told apart (sentence, token or choice): it is exported as
    a sequence classifier named LABEL_i, and the warning says so. `modernbert`: the
    encoder is ModernBERT-style (ModernBertModel, or ModernBertForMaskedLM with an MLM
    head; other heads are refused)."""
    kind = (task or {}).get("kind")
    labels = (task or {}).get("labels")
    head = {"architecture": "BertModel", "labels": None, "problem_type": None}
    if modernbert:
        if set(params) - {"bert", "mlm"}:
            raise ConversionError(
                f"a ModernBERT-style model is exported with its MLM head only; this one has "
                f"{sorted(set(params) - {'bert', 'mlm'})}")
        head["architecture"] = "ModernBertForMaskedLM" if "mlm" in params else "ModernBertModel"
        return head, None
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
        warning = (f"no task record ({kind or 'no task.json'}) says what the classifier was "
                   f"trained for: exported as BertForSequenceClassification with labels "
                   f"LABEL_0..LABEL_{n - 1}")
        kind, labels = "glue", None
    head["architecture"] = ARCHITECTURES[kind]
    if kind == "choice":
        if n != 1:
            raise ConversionError(f"a multiple-choice head has one output, this classifier "
                                  f"has {n}")
        return head, warning
    if labels is not None and len(labels) != n:
        raise ConversionError(f"the task record names {len(labels)} labels {list(labels)} "
                              f"but the classifier has {n} outputs")
    head["labels"] = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(n)]
    if kind == "glue":
        head["problem_type"] = ("regression" if n == 1 and labels is None
                                else "single_label_classification")
    return head, warning


def config_to_hf(config: BertConfig, params: Mapping, task: Optional[Mapping] = None) -> dict:
    """config.json for the heads present and the task they were trained for (`hf_head`):
    the architecture, and for classifiers num_labels, id2label / label2id and (sequence
    classification) problem_type."""
    if hf_modernbert.is_modernbert(config):
        head, _ = hf_head(params, task, modernbert=True)
        return hf_modernbert.config_to_hf(config, architectures=(head["architecture"],))
    if config.pre_ln:
        raise ConversionError("a pre-LN model has no transformers BERT equivalent (post-LN)")
    head, _ = hf_head(params, task)
    d = hf.config_to_hf(config, architectures=(head["architecture"],))
    if head["labels"] is not None:
        d["num_labels"] = len(head["labels"])
        d["id2label"] = {str(i): name for i, name in enumerate(head["labels"])}
        d["label2id"] = {name: i for i, name in enumerate(head["labels"])}
    if head["problem_type"]:
        d["problem_type"] = head["problem_type"]
    return d


def tokenizer_files(config: BertConfig, do_lower_case: bool) -> dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json of a WordPiece vocab.txt, for
    transformers' BertTokenizer (AutoTokenizer): the casing (uncased strips accents too,
    as our tokenizer does), the special tokens, the longest input the model takes."""
    tokenizer_config = dict(SPECIAL_TOKENS, tokenizer_class="BertTokenizer",
                            do_lower_case=bool(do_lower_case), strip_accents=None,
                            tokenize_chinese_chars=True, do_basic_tokenize=True,
                            model_max_length=int(config.max_position_embeddings),
                            clean_up_tokenization_spaces=True)
    return {TOKENIZER_CONFIG: tokenizer_config, SPECIAL_TOKENS_MAP: dict(SPECIAL_TOKENS)}


def vocab_is_uncased(vocab_file: str) -> bool:
    """Whether a vocab.txt holds no upper-case token (bracketed specials aside): Google's
    uncased vocabularies do not, cased ones hold thousands."""
    with paths.open_text(vocab_file) as f:
        for line in f:
            token = line.strip()
            if token and not (token.startswith("[") and token.endswith("]")) and \
                    token != token.lower():
                return False
    return True


def hf_task(directory: str) -> Optional[dict]:
    """The task record (model_dir.task_record) of a Hugging Face directory, from its
    config.json (architecture, id2label, problem_type) and tokenizer_config.json (casing);
    None for a bare encoder of unknown casing."""
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        d = json.load(f)
    lower = None
    tok = os.path.join(directory, TOKENIZER_CONFIG)
    if os.path.isfile(tok):
        with open(tok, encoding="utf-8") as f:
            lower = json.load(f).get("do_lower_case")
    kind = next((KINDS[a] for a in d.get("architectures") or () if a in KINDS), None)
    if kind is None:
        return None if lower is None else model_dir.task_record(
            "pretraining", do_lower_case=lower)
    labels = None
    if kind in ("glue", "ner") and d.get("id2label"):
        id2label = {int(k): v for k, v in d["id2label"].items()}
        labels = [id2label[i] for i in sorted(id2label)]
        if kind == "glue" and len(labels) == 1 and d.get("problem_type") in (
                None, "regression"):
            labels = None  # transformers' reading of one output: a regression
    return model_dir.task_record(kind, labels, lower)


def write_hf_dir(output: str, params: Mapping, config: BertConfig,
                 vocab_file: Optional[str] = None, task: Optional[Mapping] = None) -> str:
    """OUTPUT/model.safetensors + config.json (+ vocab.txt, tokenizer_config.json and
    special_tokens_map.json with a vocabulary), loadable by transformers' AutoModelFor* of
    the head (`hf_head`; the tied MLM decoder is written too, so loading reports no missing
    keys) and AutoTokenizer. `task`: the model directory's task record (labels, casing;
    without a recorded casing, the vocabulary's own tells it). Written to a temporary
    directory and renamed; OUTPUT may be a URI (gs://...). Returns OUTPUT."""
    from safetensors.numpy import save_file

    output = paths.resolve(output)
    if paths.exists(output):
        raise FileExistsError(f"{output} already exists; refusing to overwrite it")
    modern = hf_modernbert.is_modernbert(config)
    if modern:
        hf_modernbert.check_exportable(config)
        layout = ([(n, ("bert",) + p, k) for n, p, k in hf_modernbert.layout(config, "model.")]
                  + hf_modernbert.head_layout(config))
    else:
        layout = ([(n, ("bert",) + p, k) for n, p, k in hf._layout(config, "bert.")]
                  + list(hf.HEAD_LAYOUT))
    left = tensors.unmapped(params, layout)
    if left:
        raise ConversionError(f"parameters with no Hugging Face name: {left[:10]}")
    config_dict = config_to_hf(config, params, task)
    if modern:
        # ModernBertModel's own names have no "model." prefix.
        state = hf_modernbert.params_to_hf(params, config,
                                           prefix="model." if "mlm" in params else "")
    else:
        state = hf.params_to_hf(params, config)
    with paths.staged_dir(output) as tmp:
        # transformers refuses safetensors files without a "format" in the metadata.
        save_file(state, os.path.join(tmp, SAFETENSORS), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config_dict, f, indent=2, sort_keys=True)
            f.write("\n")
        if vocab_file:
            paths.copy_file(vocab_file, os.path.join(tmp, "vocab.txt"))
            lower = (task or {}).get("do_lower_case")
            if lower is None:
                lower = vocab_is_uncased(vocab_file)
            for name, content in tokenizer_files(config, lower).items():
                with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                    json.dump(content, f, indent=2, sort_keys=True)
                    f.write("\n")
    return output
