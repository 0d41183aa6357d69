"""Helpers of the checkpoint-bridge tests.

The TF1 checkpoints here are written by TensorFlow's own TF1 writer
(`tf.compat.v1.train.Saver` in a graph session), with variable names made by
`hf_name_to_tf`, a mapping written independently of `bert_jax.convert.tf` from the rules of
google-research/bert (scopes joined by "/", `layer_N`, LayerNorm gamma/beta, kernels
[in, out], `output_weights` [labels, hidden]). So an error in our table cannot cancel out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDENS = os.path.join(HERE, "..", "goldens")
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))


def hf_name_to_tf(name: str):
    """HF (torch) tensor name -> (original TF name, transpose?) or None for derived ones."""
    if name.endswith(("position_ids", "decoder.weight", "decoder.bias")):
        return None
    n = name[len("bert."):] if name.startswith("bert.") else name
    special = {
        "cls.predictions.bias": ("cls/predictions/output_bias", False),
        "cls.seq_relationship.weight": ("cls/seq_relationship/output_weights", False),
        "cls.seq_relationship.bias": ("cls/seq_relationship/output_bias", False),
    }
    if n in special:
        return special[n]
    n = re.sub(r"layer\.(\d+)\.", r"layer_\1.", n).replace(".", "/")
    n = n.replace("LayerNorm/weight", "LayerNorm/gamma").replace("LayerNorm/bias", "LayerNorm/beta")
    if n.endswith("_embeddings/weight"):
        return "bert/" + n[:-len("/weight")], False
    transpose = n.endswith("/weight")
    n = n[:-len("/weight")] + "/kernel" if transpose else n
    return (n if n.startswith("cls/") else "bert/" + n), transpose


def hf_state_to_tf(state) -> dict[str, np.ndarray]:
    out = {}
    for k, v in state.items():
        m = hf_name_to_tf(k)
        if m is not None:
            out[m[0]] = np.ascontiguousarray(np.asarray(v).T if m[1] else np.asarray(v))
    return out


def write_tf1_checkpoint(prefix: str, arrays: dict, optimizer_slots: bool = True) -> None:
    """TF's TF1 checkpoint writer, as run_pretraining.py saved: variables named exactly,
    plus (optionally) Adam slots and global_step that an importer must skip."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        var_list = {}
        for i, (name, value) in enumerate(sorted(arrays.items())):
            var_list[name] = tf.compat.v1.Variable(value, name=f"v{i}")
            if optimizer_slots and i < 3:
                var_list[name + "/adam_m"] = tf.compat.v1.Variable(np.zeros_like(value), name=f"m{i}")
                var_list[name + "/adam_v"] = tf.compat.v1.Variable(np.ones_like(value), name=f"s{i}")
        if optimizer_slots:
            var_list["global_step"] = tf.compat.v1.Variable(np.int64(1000), name="global_step")
        saver = tf.compat.v1.train.Saver(var_list=var_list)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            saver.save(sess, prefix, write_meta_graph=False)


def max_diff(a, b, mask=None):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if mask is not None:
        a, b = a[mask.astype(bool)], b[mask.astype(bool)]
    return float(np.max(np.abs(a - b)))


def run_encoder(params, config, batch):
    """Our BertModel on golden inputs -> (sequence_output, pooled_output) as numpy."""
    import jax

    from bert_jax.models.bert import BertModel

    fn = jax.jit(lambda p, i, m, t: BertModel(config).apply({"params": p}, i, m, t))
    seq, pooled = fn(params["bert"], batch["input_ids"], batch["attention_mask"],
                     batch["token_type_ids"])
    return np.asarray(seq), np.asarray(pooled)


def save_hf_dir(path, config: dict, state: dict) -> str:
    """A Hugging Face directory as transformers writes one: config.json + model.safetensors."""
    from safetensors.numpy import save_file

    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()},
              os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return str(path)


def run_extract_features(*args) -> subprocess.CompletedProcess:
    """launch/extract_features.py ARGS in a child process (this checkout's bert_jax)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, os.path.join(REPO, "launch", "extract_features.py"),
                           *args], capture_output=True, text=True, env=env, cwd=REPO)
