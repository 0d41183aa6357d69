"""How far the pre-training gradient under bfloat16 compute is from the float32 one, per
parameter tensor: the same float32 params and batch, dropout off.

    python benchmarks/bf16_grads.py --layers=2 --hidden=256 --batch=128 --seq=128

Prints one row per tensor, relative error = |g_bf16 - g_f32| / |g_f32| (Frobenius norms),
grouped as weight matrices, biases, LayerNorm and embeddings, then each group's median
and worst against the weight matrices' median (the figure the bf16 gradient test bounds:
tests/models/test_bf16_grads.py). The attention key bias is listed but not counted: its
float32 gradient is zero up to rounding (softmax is shift-invariant per query).
"""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from bert_jax.data.synthetic import synthetic_batch
from bert_jax.models import BertConfig, BertForPreTraining
from bert_jax.tasks.pretraining.loss import pretraining_loss

_LAYERS = flags.DEFINE_integer("layers", 2, "Encoder layers.")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "Hidden size (heads = hidden / 64, FFN 4x).")
_VOCAB = flags.DEFINE_integer("vocab", 30522, "Vocabulary size.")
_BATCH = flags.DEFINE_integer("batch", 128, "Sequences.")
_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length.")
_PREDS = flags.DEFINE_integer("predictions", 20, "MLM slots per sequence.")
_SEED = flags.DEFINE_integer("seed", 0, "Params and batch seed.")


def group(path: str) -> str:
    """'weight', 'bias', 'layernorm', 'embedding' or 'symmetric' (left out of the bound)."""
    if "embeddings" in path and "LayerNorm" not in path:
        return "embedding"
    if "norm" in path.lower():
        return "layernorm"
    if path.endswith("key/bias"):
        return "symmetric"
    if path.endswith("bias"):
        return "bias"
    return "weight"


def relative_errors(config: BertConfig, batch: dict, seed: int = 0) -> dict[str, float]:
    """{param path: relative error of the bfloat16-compute gradient} for `config` (whose
    dtype is ignored), float32 params."""
    model32 = BertForPreTraining(config.replace(dtype="float32"))
    params = jax.jit(lambda: model32.init(
        jax.random.PRNGKey(seed), batch["input_ids"][:1],
        masked_lm_positions=batch["masked_lm_positions"][:1]))()["params"]

    def grads(dtype):
        model = BertForPreTraining(config.replace(dtype=dtype))

        def loss(p):
            mlm, nsp = model.apply({"params": p}, batch["input_ids"], batch["input_mask"],
                                   batch["segment_ids"],
                                   masked_lm_positions=batch["masked_lm_positions"])
            return pretraining_loss(mlm, nsp, batch)[0]

        return jax.jit(jax.grad(loss))(params)

    g32, g16 = grads("float32"), grads("bfloat16")
    out = {}
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(g32),
                                 jax.tree_util.tree_leaves_with_path(g16)):
        name = "/".join(str(getattr(k, "key", k)) for k in path if str(k) != ".value")
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        out[name] = float(np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-30))
    return out


def main(argv):
    del argv
    h = _HIDDEN.value
    config = BertConfig(vocab_size=_VOCAB.value, hidden_size=h, num_hidden_layers=_LAYERS.value,
                        num_attention_heads=max(1, h // 64), intermediate_size=4 * h,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    batch = synthetic_batch(np.random.default_rng(_SEED.value), _BATCH.value, _SEQ.value,
                            _PREDS.value, vocab_size=config.vocab_size, cls_id=101,
                            sep_id=102, mask_id=103)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    errors = relative_errors(config, batch, _SEED.value)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; {_LAYERS.value} layers, "
          f"H={h}, vocab {config.vocab_size}, batch {_BATCH.value} x {_SEQ.value}, "
          f"{_PREDS.value} MLM slots, dropout off")
    print(f"{'tensor':60s} {'group':10s} rel. error")
    for name, err in errors.items():
        print(f"{name:60s} {group(name):10s} {100 * err:8.3f}%")
    by_group: dict[str, list[float]] = {}
    for name, err in errors.items():
        by_group.setdefault(group(name), []).append(err)
    ref = statistics.median(by_group["weight"])
    for g in ("weight", "bias", "layernorm", "embedding"):
        errs = by_group.get(g, [])
        if errs:
            print(f"{g:10s} median {100 * statistics.median(errs):7.3f}%  worst "
                  f"{100 * max(errs):7.3f}% = {max(errs) / ref:5.2f} x the weights' median")


if __name__ == "__main__":
    app.run(main)
