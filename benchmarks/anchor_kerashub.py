r"""A JAX reference point on a CPU: one float32 AdamW step of KerasHub's BertMaskedLM
(BERT-Base, MLM only, dropout 0.1) on the JAX backend at batch 8 x 128.

    python benchmarks/anchor_kerashub.py [--steps=5]
    python benchmarks/anchor_kerashub.py --interleave --steps=9    # ratio to our step

KerasHub runs on the same XLA:CPU as bert_jax, so this anchor separates what the framework
does from what the compiler's kernels do. The step is Keras's own compiled `train_on_batch`
(AdamW with weight decay 0.01, eps 1e-6, global-norm clipping 1.0, sparse cross-entropy on
the masked positions weighted by the MLM weights). With --interleave this process also
builds bert_jax's configs/bert_base.py step (MLM + NSP, as `benchmarks/train_step.py` builds
it) and alternates one KerasHub step and one bert_jax step, so both see the same machine.
Needs `keras-hub` (not a dependency of bert_jax: `pip install keras-hub`).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pretrain_step import anchor_args, run_anchor

    args = anchor_args()
    if os.environ["KERAS_BACKEND"] != "jax":
        raise SystemExit(f"anchor_kerashub.py measures Keras on JAX; KERAS_BACKEND is "
                         f"{os.environ['KERAS_BACKEND']!r}")
    try:
        import keras
        import keras_hub
    except ImportError as e:  # pragma: no cover - optional
        raise SystemExit(f"anchor_kerashub.py needs keras-hub: {e}")
    import numpy as np

    b, s = args.batch, args.seq
    preds = max(1, int(round(0.15 * s)))
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=30522, num_layers=12, num_heads=12, hidden_dim=768,
        intermediate_dim=3072, dropout=0.1, max_sequence_length=512)
    model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.AdamW(learning_rate=1e-4, weight_decay=0.01, beta_1=0.9,
                                         beta_2=0.999, epsilon=1e-6, global_clipnorm=1.0),
        weighted_metrics=[], jit_compile=True)
    g = np.random.default_rng(0)
    x = dict(token_ids=g.integers(0, 30522, (b, s)).astype("int32"),
             segment_ids=np.zeros((b, s), "int32"), padding_mask=np.ones((b, s), bool),
             mask_positions=np.sort(g.choice(s, (b, preds)), axis=1).astype("int32"))
    y = g.integers(0, 30522, (b, preds)).astype("int32")
    w = np.ones((b, preds), "float32")
    run_anchor("KerasHub",
               f"KerasHub {keras_hub.__version__} (Keras {keras.__version__}, JAX backend) "
               f"BertMaskedLM, float32 AdamW, MLM only, batch {b} x {s}, {preds} "
               f"predictions; load average {os.getloadavg()[0]:.2f}",
               lambda: float(model.train_on_batch(x, y, sample_weight=w)), args)


if __name__ == "__main__":
    main()
