"""BERT-Large (L=24, H=1024, A=16, 340M params), the paper's recipe.

Same schedule as configs/bert_base.py (phase 1: 900k steps at length 128; `:phase2`: the
last 100k at 512 from phase 1's state). Layers are scanned (compile time independent of
depth) and parameters + optimizer state are sharded over every device (FSDP); on a pod
with fast links, `--config.mesh.data=-1 --config.mesh.fsdp=8` trades memory for less
all-gather traffic. `--config.model.dtype=bfloat16` (float32 params and optimizer state)
is the TPU setting.
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
        raise ValueError(f"configs/bert_large.py: unknown argument {arg!r}; use phase1 or phase2")
    config = ml_collections.ConfigDict()
    config.model = model_config(
        vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, scan_layers=True)
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
        mesh=dict(data=1, fsdp=-1, tensor=1),
        checkpoint=dict(every=5_000, keep=3, keep_period=100_000))
    return config
