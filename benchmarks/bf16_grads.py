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

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The script's flags (defined only when it runs: the test imports its functions)."""
    flags.DEFINE_integer("layers", 2, "Encoder layers.")
    flags.DEFINE_integer("hidden", 256, "Hidden size (heads = hidden / 64, FFN 4x).")
    flags.DEFINE_integer("vocab", 30522, "Vocabulary size.")
    flags.DEFINE_integer("batch", 128, "Sequences.")
    flags.DEFINE_integer("seq", 128, "Sequence length.")
    flags.DEFINE_integer("predictions", 20, "MLM slots per sequence.")
    flags.DEFINE_integer("seed", 0, "Params and batch seed.")

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


def gradient_fns(config: BertConfig, batch: dict, seed: int = 0):
    """(float32 params, grad_fn): grad_fn(dtype) is jax.grad of the pre-training loss with
    `config`'s compute dtype set to `dtype` (params stay float32), dropout as in `config`."""
    model32 = BertForPreTraining(config.replace(dtype="float32"))
    params = jax.jit(lambda: model32.init(
        jax.random.PRNGKey(seed), batch["input_ids"][:1],
        masked_lm_positions=batch["masked_lm_positions"][:1]))()["params"]

    def grad_fn(dtype):
        model = BertForPreTraining(config.replace(dtype=dtype))

        def loss(p):
            mlm, nsp = model.apply({"params": p}, batch["input_ids"], batch["input_mask"],
                                   batch["segment_ids"],
                                   masked_lm_positions=batch["masked_lm_positions"])
            assert mlm.dtype == jnp.dtype(dtype)  # the logits stay in the compute dtype
            return pretraining_loss(mlm, nsp, batch)[0]

        return jax.grad(loss)

    return params, grad_fn


def param_path(path) -> str:
    """"bert/encoder/layer_0/attention/query/bias" of a tree path (flax's boxes skipped)."""
    return "/".join(str(getattr(k, "key", k)) for k in path if str(k) != ".value")


def relative_errors(config: BertConfig, batch: dict, seed: int = 0) -> dict[str, float]:
    """{param path: relative error of the bfloat16-compute gradient} for `config` (whose
    dtype is ignored), float32 params."""
    params, grad_fn = gradient_fns(config, batch, seed)
    g32, g16 = (jax.jit(grad_fn(d))(params) for d in ("float32", "bfloat16"))
    out = {}
    for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(g32),
                                 jax.tree_util.tree_leaves_with_path(g16)):
        name = param_path(path)
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        out[name] = float(np.linalg.norm(b - a) / max(np.linalg.norm(a), 1e-30))
    return out


def main(argv):
    del argv
    h = FLAGS.hidden
    config = BertConfig(vocab_size=FLAGS.vocab, hidden_size=h, num_hidden_layers=FLAGS.layers,
                        num_attention_heads=max(1, h // 64), intermediate_size=4 * h,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    batch = synthetic_batch(np.random.default_rng(FLAGS.seed), FLAGS.batch, FLAGS.seq,
                            FLAGS.predictions, vocab_size=config.vocab_size, cls_id=101,
                            sep_id=102, mask_id=103)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    errors = relative_errors(config, batch, FLAGS.seed)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; {FLAGS.layers} layers, "
          f"H={h}, vocab {config.vocab_size}, batch {FLAGS.batch} x {FLAGS.seq}, "
          f"{FLAGS.predictions} MLM slots, dropout off")
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
    define_flags()
    app.run(main)
