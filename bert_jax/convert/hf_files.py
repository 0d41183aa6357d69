"""Hugging Face model directories on disk: config.json + model.safetensors (or sharded
safetensors, or pytorch_model.bin), read into / written from our parameter tree.

The format (transformers' BERT or ModernBERT: hf.BERT, hf_modernbert.MODERNBERT) is picked
once, from config.json's model_type on the way in (`hf_format_of`) and from our config on
the way out (`hf_format`); it knows the names, layouts, heads and config. This module adds
the files, the check of names and shapes before any tensor is read, and the reports.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Mapping, Optional

import numpy as np

from bert_jax import paths
from bert_jax.convert import hf, hf_modernbert, model_dir, tensors
from bert_jax.convert.hf import HfFormat
from bert_jax.models.config import BertConfig

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
TORCH_MISSING = ("needs PyTorch to read pytorch_model.bin, and torch is not installed here. "
                 "Install it (pip install torch), or convert the weights to model.safetensors "
                 "where torch is available")


HF_FORMATS = {f.model_type: f for f in (hf.BERT, hf_modernbert.MODERNBERT)}
# config.json's "architectures" -> our task kind, for every format.
TASK_KINDS = {a: k for f in HF_FORMATS.values() for a, k in f.task_kinds.items()}


def hf_format(config: BertConfig) -> HfFormat:
    """The transformers format of our `config`: ModernBERT for a ModernBERT-style encoder
    (rotary positions or a gated FFN), BERT otherwise."""
    return hf_modernbert.MODERNBERT if hf_modernbert.is_modernbert(config) else hf.BERT


def hf_format_of(d) -> HfFormat:
    """The format of a config.json's dict, by its model_type (BERT when absent; BERT's
    config reader names any other model_type)."""
    model_type = d.get("model_type") if isinstance(d, dict) else None
    return HF_FORMATS.get(model_type, hf.BERT)


def open_weights(directory: str) -> tuple[dict[str, tuple], Callable[[str], np.ndarray], str]:
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
    return hf_dir_format(directory)[1]


def hf_dir_format(directory: str) -> tuple[HfFormat, BertConfig]:
    """(the format, our config) of a Hugging Face directory, from its config.json."""
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
    fmt = hf_format_of(d)
    return fmt, fmt.config_from(d, config_path)


def read_hf_dir(directory: str, progress: bool = False):
    """Returns (params, config, ImportReport, vocab file or None). Names and shapes are
    checked against the config before any tensor is read."""
    fmt, config = hf_dir_format(directory)
    shapes, load, source = open_weights(directory)
    renamed = {fmt.source_name(k): k for k in shapes}
    available = {k: shapes[v] for k, v in renamed.items()}
    rows, report = fmt.plan(available, config, source)
    params = tensors.read_params(rows, lambda n: load(renamed[n]), config, report, progress)
    return params, config, report, hf_vocab(directory)


def open_hf_dir(directory: str) -> model_dir.Opened:
    """Hugging Face directory `directory` (config.json + weights) from its small files:
    config.json (our config, its task record) and tokenizer_config.json, vocab.txt."""
    config = hf_dir_format(directory)[1]  # first: its errors name what to do
    return model_dir.Opened(config, hf_vocab(directory), hf_task(directory),
                            lambda: read_hf_dir(directory)[0])


def hf_vocab(directory: str) -> Optional[str]:
    """DIR/vocab.txt of a Hugging Face directory, if there is one."""
    vocab = os.path.join(directory, "vocab.txt")
    return vocab if os.path.isfile(vocab) else None


SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                  "cls_token": "[CLS]", "mask_token": "[MASK]"}
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"


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
    kind = next((TASK_KINDS[a] for a in d.get("architectures") or () if a in TASK_KINDS),
                None)
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
    the head (HfFormat.head; the tied MLM decoder is written too, so loading reports no missing
    keys) and AutoTokenizer. `task`: the model directory's task record (labels, casing;
    without a recorded casing, the vocabulary's own tells it). Written to a temporary
    directory and renamed; OUTPUT may be a URI (gs://...). Returns OUTPUT."""
    from safetensors.numpy import save_file

    output = paths.resolve(output)
    if paths.exists(output):
        raise FileExistsError(f"{output} already exists; refusing to overwrite it")
    fmt = hf_format(config)
    fmt.check_writable(params, config)
    config_dict = fmt.config_to(config, params, task)
    state = fmt.arrays(params, config)
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
