r"""The issue's reference point, measured on this machine: one float32 AdamW step of
Hugging Face PyTorch BertForPreTraining (BERT-Base, MLM + NSP) at batch 8 x 128.

    python benchmarks/anchor_torch.py [--steps=5]
    python benchmarks/anchor_torch.py --interleave --steps=9    # ratio to our step

Machines like the 2-core CI VM drift by 1.5x between hours, so a step time is only
comparable with one measured beside it. With --interleave this process also builds
bert_jax's BERT-Base pre-training step exactly as `benchmarks/train_step.py` does
(configs/bert_base.py, float32 AdamW, MLM + NSP, dropout on, synthetic batch) and alternates
one torch step and one bert_jax step, so both see the same machine; it prints both medians
and their ratio. Needs `torch` and `transformers` (not dependencies of bert_jax; the test
extra installs a CPU torch).
"""

from __future__ import annotations

import os
import sys


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from pretrain_step import anchor_args, run_anchor

    args = anchor_args()
    try:
        import torch
        from transformers import BertConfig, BertForPreTraining
    except ImportError as e:  # pragma: no cover - optional
        raise SystemExit(f"anchor_torch.py needs torch and transformers: {e}")

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig()).train()  # BERT-Base defaults, dropout 0.1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
                            weight_decay=0.01)
    g = torch.Generator().manual_seed(0)
    b, s = args.batch, args.seq
    ids = torch.randint(0, 30522, (b, s), generator=g)
    labels = torch.full((b, s), -100)
    pos = torch.rand((b, s), generator=g) < 0.15
    labels[pos] = ids[pos]
    batch = dict(input_ids=ids, attention_mask=torch.ones(b, s, dtype=torch.long),
                 token_type_ids=torch.zeros(b, s, dtype=torch.long), labels=labels,
                 next_sentence_label=torch.randint(0, 2, (b,), generator=g))

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    # 0.5 s pauses: torch's OpenMP threads stop spinning before our step starts.
    run_anchor("HF PyTorch",
               f"HF PyTorch {torch.__version__} BertForPreTraining, float32 AdamW, MLM+NSP, "
               f"batch {b} x {s}, {torch.get_num_threads()} threads; load average "
               f"{os.getloadavg()[0]:.2f}", step, args, pause=0.5)


if __name__ == "__main__":
    main()
