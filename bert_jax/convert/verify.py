"""`verify`: run our model and a reference implementation on the same sample text and
report the largest absolute difference of every output.

References: `hf:DIR` (transformers + torch, BertModel / BertForPreTraining from a Hugging
Face directory, or ModernBertModel / ModernBertForMaskedLM for model_type "modernbert") or
`tf:CKPT` (a TF1 checkpoint run by `tf_reference.py`). Differences are taken at real
(non-padding) tokens only.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

import numpy as np

from bert_jax import paths
from bert_jax.convert import sources, tf_reference
from bert_jax.convert import tf as tfc
from bert_jax.convert.extract import Example, encode_example
from bert_jax.convert.hf_files import open_weights
from bert_jax.models.bert import BertForPreTraining, BertModel
from bert_jax.models.config import BertConfig
from bert_jax.tokenization import load_tokenizer

# Sample text: singles and pairs of different lengths, so that padding is exercised.
SAMPLES = [
    ("The quick brown fox jumps over the lazy dog.", None),
    ("To be, or not to be, that is the question.", "Whether 'tis nobler in the mind to suffer "
     "the slings and arrows of outrageous fortune."),
    ("BERT reads text in both directions at once.", None),
    ("Where is the station?", "Two streets down, on the left."),
]
REF_MISSING = {
    "hf": "verify --reference=hf:DIR needs PyTorch and transformers, which are not installed "
          "here (pip install torch transformers), or compare against a TF checkpoint with "
          "--reference=tf:CKPT",
    "tf": "verify --reference=tf:CKPT needs TensorFlow (pip install tensorflow-cpu)",
}


def sample_batch(config: BertConfig, tokenizer=None, length: int = 64) -> dict[str, np.ndarray]:
    """<int32>[4, length] input_ids / token_type_ids / attention_mask. Without a
    tokenizer (no vocab.txt anywhere) the ids are random (seeded), lengths as the text's."""
    length = min(length, config.max_position_embeddings)
    b = len(SAMPLES)
    ids = np.zeros((b, length), np.int32)
    types = np.zeros((b, length), np.int32)
    mask = np.zeros((b, length), np.int32)
    rng = np.random.default_rng(0)
    for i, (a, bb) in enumerate(SAMPLES):
        if tokenizer is not None:
            enc = encode_example(Example(i, a, bb), tokenizer, length)
            row, seg = enc.input_ids, enc.token_type_ids
        else:
            n = min(length, 8 + 12 * i)
            row = rng.integers(0, config.vocab_size, n).tolist()
            seg = [0] * (n // 2) + [1] * (n - n // 2)
        ids[i, :len(row)], types[i, :len(row)], mask[i, :len(row)] = row, seg, 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def run_ours(params: Mapping, config: BertConfig, batch: Mapping) -> dict[str, np.ndarray]:
    """sequence_output, pooled_output, and mlm_logits (every position) / nsp_logits when
    the heads are in `params`."""
    import jax

    # Held to the reference at float32 tolerances on any host: auto computes float32.
    config = config.replace(scan_layers=False, remat="none", dtype=config.dtype_for("cpu"),
                            fp8=False)
    args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    seq, pooled = jax.jit(BertModel(config).apply)({"params": params["bert"]}, *args)
    out = {"sequence_output": np.asarray(seq)}
    if config.pooler:  # else the [CLS] row of sequence_output, compared already
        out["pooled_output"] = np.asarray(pooled)
    if "mlm" in params:
        nsp = "nsp" in params
        tree = {k: params[k] for k in ("bert", "mlm", "nsp") if k in params}
        mlm, nsp_logits = jax.jit(BertForPreTraining(config, nsp=nsp).apply)(
            {"params": tree}, *args)
        out["mlm_logits"] = np.asarray(mlm)
        if nsp:
            out["nsp_logits"] = np.asarray(nsp_logits)
    return out


def run_hf(directory: str, batch: Mapping, heads: tuple[str, ...]) -> dict[str, np.ndarray]:
    """transformers' BertModel / BertForPreTraining on `batch`, in a child process (see
    hf_reference.py: torch and TensorFlow cannot share one)."""
    import importlib.util
    import subprocess
    import sys
    import tempfile

    if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")):
        raise ImportError(REF_MISSING["hf"])
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = os.path.join(tmp, "batch.npz"), os.path.join(tmp, "out.npz")
        np.savez(inp, **batch)
        r = subprocess.run([sys.executable, "-m", "bert_jax.convert.hf_reference", directory,
                            inp, out, ",".join(heads)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"the transformers reference failed on {directory}:\n"
                               f"{r.stderr[-3000:]}")
        with np.load(out) as f:
            return {k: f[k] for k in f.files}


def run_tf(prefix: str, config: BertConfig, batch: Mapping, heads: tuple[str, ...]):
    try:
        import tensorflow as tf
    except ImportError:
        raise ImportError(REF_MISSING["tf"]) from None

    reader = tf.train.load_checkpoint(prefix)
    return tf_reference.forward(reader.get_tensor, config, batch["input_ids"],
                                batch["token_type_ids"], batch["attention_mask"], heads)


def max_abs_diffs(ours: Mapping, ref: Mapping, mask: np.ndarray) -> dict[str, float]:
    """Largest |ours - ref| per output present in both, over real tokens only."""
    out = {}
    real = mask.astype(bool)
    for k in ours:
        if k not in ref:
            continue
        a, b = np.asarray(ours[k], np.float64), np.asarray(ref[k], np.float64)
        if a.shape != b.shape:
            raise ValueError(f"{k}: our shape {a.shape} != reference shape {b.shape}")
        if a.ndim == 3:  # per token
            a, b = a[real], b[real]
        out[k] = float(np.max(np.abs(a - b)))
    return out


def verify(checkpoint: str, reference: str, tokenizer=None, length: int = 64,
           do_lower_case: bool = True) -> dict[str, float]:
    """Returns {output: max abs diff}. reference: "hf:DIR" or "tf:CKPT"."""
    kind, _, path = reference.partition(":")
    if kind not in ("hf", "tf") or not path:
        raise ValueError(f"--reference={reference!r}: expected hf:DIR or tf:CKPT")
    params, config, vocab = sources.load_model(checkpoint)
    heads = tuple(h for h in ("mlm", "nsp") if h in params)
    if tokenizer is None:
        tokenizer = _tokenizer_for(vocab, path, config, do_lower_case)
    batch = sample_batch(config, tokenizer, length)
    if kind == "hf":
        names, _, _ = open_weights(path)
        ref_heads = tuple(h for h, n in (("mlm", "cls.predictions.bias"),
                                         ("mlm", "decoder.bias"),
                                         ("nsp", "cls.seq_relationship.weight")) if n in names)
        heads = tuple(h for h in heads if h in ref_heads)
        if "nsp" in heads and "mlm" not in heads:
            heads = ()
        ref = run_hf(path, batch, heads)
    else:
        prefix = tfc.checkpoint_prefix(path)
        names = tfc.list_checkpoint(prefix)
        heads = tuple(h for h, n in (("mlm", "cls/predictions/output_bias"),
                                     ("nsp", "cls/seq_relationship/output_bias"))
                      if h in heads and n in names)
        ref = run_tf(prefix, config, batch, heads)
    ours = run_ours({k: params[k] for k in ("bert",) + heads}, config, batch)
    return max_abs_diffs(ours, ref, batch["attention_mask"])


def _tokenizer_for(vocab_file: Optional[str], reference_path: str, config: BertConfig,
                   do_lower_case: bool) -> Optional[object]:
    """The checkpoint's vocabulary, else the reference's vocab.txt, if its size fits."""
    ref_dir = reference_path if paths.is_dir(reference_path) else os.path.dirname(reference_path)
    for vocab in (vocab_file, os.path.join(ref_dir, "vocab.txt")):
        if vocab and paths.is_file(vocab):
            tok = load_tokenizer(vocab_file=vocab, do_lower_case=do_lower_case)
            if tok.vocab_size == config.vocab_size:
                return tok
    return None
