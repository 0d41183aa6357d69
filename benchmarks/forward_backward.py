"""Forward + backward throughput of the pre-training model (MLM + NSP), no optimizer.

    python benchmarks/forward_backward.py --config=configs/bert_base.py --batch=8 --seq=128

Prints the median step time over --steps timed steps (after a compile + warm-up step),
sequences/s, and achieved GFLOP/s from the model-FLOPs formula in
bert_jax.train.metrics.model_flops_per_example (matmul FLOPs, forward + backward = 3x).
"""

import statistics
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from bert_jax.models import BertForPreTraining, count_params
from bert_jax.models.config import from_config_dict
from bert_jax.tasks.pretraining.loss import pretraining_loss
from bert_jax.train.metrics import measure_matmul_flops, model_flops_per_example

_CONFIG = config_flags.DEFINE_config_file("config", "configs/bert_base.py", "Run config.")
_BATCH = flags.DEFINE_integer("batch", 8, "Sequences per step.")
_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length.")
_PREDS = flags.DEFINE_integer("predictions", None,
                              "MLM slots per sequence (default: 20 per 128 tokens, the paper's).")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps.")


def main(argv):
    del argv
    config = from_config_dict(_CONFIG.value.model)
    batch, seq = _BATCH.value, _SEQ.value
    preds = _PREDS.value or max(1, round(seq * 0.15 + 0.8))
    rng = np.random.default_rng(0)
    data = {
        "input_ids": rng.integers(5, config.vocab_size, (batch, seq), dtype=np.int32),
        "input_mask": np.ones((batch, seq), np.int32),
        "segment_ids": (np.arange(seq)[None, :] >= seq // 2).repeat(batch, 0).astype(np.int32),
        "masked_lm_positions": np.sort(rng.choice(np.arange(1, seq), (batch, preds)), axis=1
                                       ).astype(np.int32),
        "masked_lm_ids": rng.integers(5, config.vocab_size, (batch, preds), dtype=np.int32),
        "masked_lm_weights": np.ones((batch, preds), np.float32),
        "next_sentence_labels": rng.integers(0, 2, (batch,), dtype=np.int32),
    }
    model = BertForPreTraining(config)
    params = jax.jit(lambda: model.init(jax.random.PRNGKey(0), data["input_ids"][:1],
                                        masked_lm_positions=data["masked_lm_positions"][:1])
                     )()["params"]

    def loss_fn(p, b, rng):
        mlm, nsp = model.apply({"params": p}, b["input_ids"], b["input_mask"], b["segment_ids"],
                               masked_lm_positions=b["masked_lm_positions"],
                               deterministic=False, rngs={"dropout": rng})
        return pretraining_loss(mlm, nsp, b)[0]

    step = jax.jit(jax.value_and_grad(loss_fn))
    t = time.perf_counter()
    jax.block_until_ready(step(params, data, jax.random.PRNGKey(0)))
    compile_s = time.perf_counter() - t
    times = []
    for i in range(_STEPS.value):
        t = time.perf_counter()
        jax.block_until_ready(step(params, data, jax.random.PRNGKey(i)))
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    flops = model_flops_per_example(config, seq, preds) * batch
    ceiling = measure_matmul_flops()
    print(f"model: {config.num_hidden_layers} layers, H={config.hidden_size}, "
          f"{count_params(params) / 1e6:.1f}M params, dtype={config.dtype}")
    print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}")
    print(f"batch={batch} seq={seq} masked_positions={preds}")
    print(f"compile + first step: {compile_s:.2f} s")
    print(f"forward+backward step: median {median:.3f} s over {len(times)} "
          f"(min {min(times):.3f}, max {max(times):.3f})")
    print(f"sequences/s: {batch / median:.2f}")
    print(f"model FLOPs/step: {flops / 1e9:.1f} GFLOP; achieved {flops / median / 1e9:.1f} GFLOP/s "
          f"({flops / median / ceiling:.1%} of this machine's measured float32 matmul ceiling, "
          f"{ceiling / 1e9:.1f} GFLOP/s)")


if __name__ == "__main__":
    app.run(main)
