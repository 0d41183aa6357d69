r"""The reference point on a CPU: one float32 AdamW step of Hugging Face PyTorch
BertForPreTraining (BERT-Base, MLM + NSP) at batch 8 x 128, the step of
benchmarks/torch_reference.py (the one gpu_suite.py times on a GPU).

    python benchmarks/anchor_torch.py [--steps=5]
    python benchmarks/anchor_torch.py --interleave --steps=9    # ratio to our step

Shared CPU machines drift by 1.5x between hours, so a step time is only comparable with
one measured beside it. With --interleave this process also builds bert_jax's BERT-Base
pre-training step exactly as `benchmarks/train_step.py` does (configs/bert_base.py, float32
AdamW, MLM + NSP, dropout on, synthetic batch) and alternates one torch step and one
bert_jax step, so both see the same machine; it prints both medians and their ratio. Both
steps see batches of the same layout, round(0.15 * seq) MLM predictions per row. Needs
`torch` and `transformers` (not dependencies of bert_jax; the test extra installs a CPU
torch).
"""

from __future__ import annotations

import itertools
import os
import sys


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pretrain_step import anchor_args, anchor_preds, run_anchor

    args = anchor_args()
    try:
        import torch
        import transformers  # noqa: F401 - the reference step's model
        from torch_reference import Reference, synthetic_batches
    except ImportError as e:  # pragma: no cover - optional
        raise SystemExit(f"anchor_torch.py needs torch and transformers: {e}")

    ref = Reference()  # BERT-Base defaults, dropout 0.1, float32 AdamW on the CPU
    b, s = args.batch, args.seq
    batches = itertools.cycle(synthetic_batches(b, s, anchor_preds(s),
                                                ref.model.config.vocab_size))

    def step() -> float:
        return ref.step(next(batches)).item()

    # 0.5 s pauses: torch's OpenMP threads stop spinning before our step starts.
    run_anchor("HF PyTorch",
               f"HF PyTorch {torch.__version__} BertForPreTraining, float32 AdamW, MLM+NSP, "
               f"batch {b} x {s}, {torch.get_num_threads()} threads; load average "
               f"{os.getloadavg()[0]:.2f}", step, args, pause=0.5)


if __name__ == "__main__":
    main()
