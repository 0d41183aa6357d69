"""A TensorFlow forward pass of BERT that reads a TF1 checkpoint by its original variable
names: the reference side of `python -m bert_jax.convert verify --reference=tf:CKPT`.

Written by hand (about 60 lines of TF ops) because no maintained library runs the original
TF1 checkpoints in TF2 eager without the google-research/bert `modeling.py` (TF1 graph
code). It shares nothing with our Flax model or our name table, so it is an independent
check of both. It follows the original code: additive -10000 attention mask, LayerNorm
epsilon 1e-12 (or the config's), dense kernels [in, out].

Note on GELU: google-research/bert's `modeling.py` computes its "gelu" with the tanh
approximation; transformers and we compute "gelu" exactly (erf) and "gelu_new" with tanh.
This reference follows the config's name with our meaning, so that the comparison tests
the weights; the two GELUs differ by ~1e-3 in hidden states.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

import numpy as np

from bert_jax.models.config import BertConfig


def forward(get: Callable[[str], np.ndarray], config: BertConfig, input_ids: np.ndarray,
            token_type_ids: np.ndarray, attention_mask: np.ndarray,
            heads: tuple[str, ...] = ()) -> Mapping[str, np.ndarray]:
    """get(name) -> the checkpoint tensor. Inputs <int32>[batch, length]. Returns
    sequence_output [batch, length, hidden], pooled_output [batch, hidden], and
    mlm_logits [batch, length, vocab] / nsp_logits [batch, 2] for the heads asked for."""
    import tensorflow as tf

    c = config
    w = lambda name: tf.constant(get(name), tf.float32)  # noqa: E731
    eps = c.layer_norm_eps

    def act(x):
        if c.hidden_act == "gelu":
            return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))
        if c.hidden_act in ("gelu_new", "gelu_tanh"):
            return 0.5 * x * (1.0 + tf.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        return {"relu": tf.nn.relu, "tanh": tf.tanh, "silu": tf.nn.silu}[c.hidden_act](x)

    def norm(x, scope):
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + eps) * w(f"{scope}/gamma") + w(f"{scope}/beta")

    def dense(x, scope):
        return tf.matmul(x, w(f"{scope}/kernel")) + w(f"{scope}/bias")

    batch, length = input_ids.shape
    heads_n, size = c.num_attention_heads, c.hidden_size // c.num_attention_heads
    x = (tf.gather(w("bert/embeddings/word_embeddings"), input_ids)
         + w("bert/embeddings/position_embeddings")[:length][None]
         + tf.gather(w("bert/embeddings/token_type_embeddings"), token_type_ids))
    x = norm(x, "bert/embeddings/LayerNorm")
    # The original's additive mask: 0 for real keys, -10000 for padding.
    bias = (1.0 - tf.cast(attention_mask, tf.float32))[:, None, None, :] * -10000.0

    def split(t):  # [batch, length, hidden] -> [batch, heads, length, size]
        return tf.transpose(tf.reshape(t, [batch, length, heads_n, size]), [0, 2, 1, 3])

    for i in range(c.num_hidden_layers):
        s = f"bert/encoder/layer_{i}"
        q = split(dense(x, f"{s}/attention/self/query"))
        k = split(dense(x, f"{s}/attention/self/key"))
        v = split(dense(x, f"{s}/attention/self/value"))
        probs = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / math.sqrt(size) + bias)
        ctx = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [batch, length, -1])
        x = norm(dense(ctx, f"{s}/attention/output/dense") + x, f"{s}/attention/output/LayerNorm")
        h = act(dense(x, f"{s}/intermediate/dense"))
        x = norm(dense(h, f"{s}/output/dense") + x, f"{s}/output/LayerNorm")
    out = {"sequence_output": x.numpy(),
           "pooled_output": tf.tanh(dense(x[:, 0], "bert/pooler/dense")).numpy()}
    if "mlm" in heads:
        h = norm(act(dense(x, "cls/predictions/transform/dense")),
                 "cls/predictions/transform/LayerNorm")
        logits = tf.matmul(h, w("bert/embeddings/word_embeddings"), transpose_b=True)
        out["mlm_logits"] = (logits + w("cls/predictions/output_bias")).numpy()
    if "nsp" in heads:
        pooled = tf.constant(out["pooled_output"])
        out["nsp_logits"] = (tf.matmul(pooled, w("cls/seq_relationship/output_weights"),
                                       transpose_b=True)
                             + w("cls/seq_relationship/output_bias")).numpy()
    return out
