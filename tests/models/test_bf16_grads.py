"""Under bfloat16 compute with float32 params, gradients accumulate in float32: the bias,
LayerNorm and embedding gradients are as close to the float32-compute ones as the weight
matrices' are (what bfloat16 activations cost), not several times further
(benchmarks/bf16_grads.py prints the table; its gradients are the ones tested here)."""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.data.synthetic import synthetic_batch
from bert_jax.models import BertConfig
from tests.conftest import load_script

bf16_grads = load_script("benchmarks/bf16_grads.py")

# Large enough a batch (64 x 128) that a bfloat16 sum over batch x length shows.
CONFIG = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=512,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
BATCH, SEQ, PREDS = 64, 128, 20


def _paths(tree):
    return [bf16_grads.param_path(path) for path, _ in jax.tree_util.tree_leaves_with_path(tree)]


@pytest.fixture(scope="module", params=[False, True], ids=["qkv", "fused_qkv"])
def gradients(request):
    config = CONFIG.replace(fused_qkv=request.param)
    batch = synthetic_batch(np.random.default_rng(0), BATCH, SEQ, PREDS,
                            vocab_size=config.vocab_size, cls_id=101, sep_id=102, mask_id=103)
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    params, grad_fn = bf16_grads.gradient_fns(config, batch)
    bf16 = grad_fn("bfloat16")
    return (jax.jit(grad_fn("float32"))(params), jax.jit(bf16)(params),
            str(jax.make_jaxpr(bf16)(params)))


def test_bias_layernorm_and_embedding_gradients_are_as_close_as_the_weights(gradients):
    g32, g16, _ = gradients
    errors = {}
    for name, a, b in zip(_paths(g32), jax.tree.leaves(g32), jax.tree.leaves(g16)):
        assert b.dtype == jnp.float32, name
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        errors[name] = np.linalg.norm(b - a) / np.linalg.norm(a)
    # The key bias's float32 gradient is zero up to rounding (softmax is shift-invariant).
    errors = {k: v for k, v in errors.items() if not k.endswith("key/bias")}
    weights = [v for k, v in errors.items()
               if k.endswith("kernel") and "embeddings" not in k]
    others = {k: v for k, v in errors.items() if not k.endswith("kernel")}
    assert len(weights) == 15 and len(others) == 29
    reference = statistics.median(weights)
    assert 1e-3 < reference < 0.05  # bfloat16 activations' cost: the comparison means something
    worse = {k: f"{v / reference:.2f}x" for k, v in others.items() if v > 1.5 * reference}
    assert not worse, (f"weights' median {reference:.4f}", worse)


def test_embedding_gradients_are_float32_and_the_token_types_not_scattered(gradients):
    _, _, jaxpr = gradients
    # What each scatter-add of the gradient writes, e.g. "f32[1000,128]".
    scatters = [line.split("=")[0].split(":")[-1].strip() for line in jaxpr.splitlines()
                if "= scatter-add[" in line]
    h, v = CONFIG.hidden_size, CONFIG.vocab_size
    # The word table's gradient is a float32 scatter-add (nn.Embed's is a bfloat16 one).
    assert f"f32[{v},{h}]" in scatters and f"bf16[{v},{h}]" not in scatters, scatters
    # The token-type table's gradient is masked sums: no scatter into its two rows.
    t = CONFIG.type_vocab_size
    assert not {f"f32[{t},{h}]", f"bf16[{t},{h}]"} & set(scatters), scatters
