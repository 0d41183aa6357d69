"""BERT-Base (L=12, H=768, A=12, 110M params), the paper's recipe.

Phase 1 (default): 900k steps at length 128 of a 1M-step schedule (batch 256, Adam lr 1e-4,
warmup 10k, linear decay). Phase 2 (`configs/bert_base.py:phase2`): the last 100k steps at
length 512, continuing phase 1's optimizer state, step and schedule:

    python launch/train.py --config=configs/bert_base.py --workdir=$W1 \
        --config.data.train_files=... --config.data.eval_files=...
    python launch/train.py --config=configs/bert_base.py:phase2 --workdir=$W2 \
        --config.train.init_checkpoint=$W1 --config.data.train_files=<512-token files>
"""

import ml_collections

from bert_jax.data.pretrain import data_config
from bert_jax.models.config import model_config
from bert_jax.train.config import add_training_sections

TOTAL_STEPS = 1_000_000
PHASE1_STEPS = 900_000


def get_config(arg=None):
    phase2 = arg == "phase2"
    if arg not in (None, "", "phase1", "phase2"):
        raise ValueError(f"configs/bert_base.py: unknown argument {arg!r}; use phase1 or phase2")
    config = ml_collections.ConfigDict()
    config.model = model_config(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072)
    config.model.nsp = True
    config.data = data_config(
        max_seq_length=512 if phase2 else 128, max_predictions_per_seq=80 if phase2 else 20,
        batch_size=256)
    add_training_sections(
        config,
        schedule=dict(lr=1e-4, warmup_steps=10_000, decay="linear", total_steps=TOTAL_STEPS),
        train=dict(steps=TOTAL_STEPS if phase2 else PHASE1_STEPS, log_every=100,
                   eval_every=10_000, eval_steps=100,
                   init_state="full" if phase2 else "params"),
        mesh=dict(data=-1, fsdp=1, tensor=1),
        checkpoint=dict(every=5_000, keep=3, keep_period=100_000))
    return config
