"""The pre-training recipes: full run configs for a model of the caller's sizes.

    model = paper_model(hidden_size=768, num_hidden_layers=12, ...)   # configs/bert_base.py
    config = paper("bert_base", arg, model, mesh=dict(data=-1, fsdp=1, tensor=1))

`paper` and `paper_model` are BERT's (Devlin et al., 2019, section 3.1 and appendix A.2);
`modernbert` and `modernbert_model` ModernBERT's (Warner et al., 2024). The config files
call them with their model's sizes and show, in their docstrings, every value the recipe
sets (tests/tasks/test_recipes.py holds each table to the config it describes). The
sections and their defaults are bert_jax/train/config.py's, which also loads and checks a
config; fine-tuning's recipe is bert_jax/tasks/registry.py's `base_config`.
"""

from __future__ import annotations

import math

import ml_collections

from bert_jax.data.pretrain import data_config
from bert_jax.models.config import model_config
from bert_jax.train.config import add_training_sections

# The paper's pre-training schedule: 1M steps, 90% at length 128, the last 10% at 512.
PAPER_TOTAL_STEPS = 1_000_000
PAPER_PHASE1_STEPS = 900_000
PAPER_ARGS = (None, "", "phase1", "phase2")


def paper_model(**shapes) -> ml_collections.ConfigDict:
    """The `model` section of the paper's encoder of the given shapes (vocab_size,
    hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, and the run's
    layout options): GELU, post-LN, dropout 0.1 on the hidden states and on the attention
    probabilities, 512 learned positions, 2 segment types."""
    return model_config(**dict(
        dict(hidden_act="gelu", pre_ln=False, hidden_dropout_prob=0.1,
             attention_probs_dropout_prob=0.1, max_position_embeddings=512,
             position_embedding="learned", type_vocab_size=2),
        **shapes))


def paper(name: str, arg, model: ml_collections.ConfigDict,
          mesh: dict) -> ml_collections.ConfigDict:
    """A full run config with the paper's pre-training recipe for `model`: masked LM + NSP,
    Adam (b1 0.9, b2 0.999, L2 weight decay 0.01, not on LayerNorm or biases), lr 1e-4
    with 10k warmup steps and a linear decay over 1M steps, batch 256. `arg` picks the
    phase: None / "phase1" = the first 900k steps at length 128 (20 MLM slots); "phase2" =
    the last 100k at length 512 (80 slots), continuing phase 1's optimizer state, step and
    schedule (train.init_state="full")."""
    if arg not in PAPER_ARGS:
        raise ValueError(f"configs/{name}.py: unknown argument {arg!r}; use phase1 or phase2")
    phase2 = arg == "phase2"
    config = ml_collections.ConfigDict()
    config.model = model
    config.model.nsp = True
    # 15% of the WordPiece positions are masked (data_prep: 80% [MASK], 10% a random token,
    # 10% unchanged); the slots hold 15% of the length.
    config.data = data_config(
        max_seq_length=512 if phase2 else 128, max_predictions_per_seq=80 if phase2 else 20,
        masked_lm_prob=0.15)
    return add_training_sections(
        config,
        # eps and the gradient clipping are google-research/bert's
        optimizer=dict(name="adamw", b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                       clip_norm=1.0),
        schedule=dict(lr=1e-4, warmup_steps=10_000, decay="linear", end_lr=0.0,
                      total_steps=PAPER_TOTAL_STEPS),
        train=dict(batch_size=256,
                   steps=PAPER_TOTAL_STEPS if phase2 else PAPER_PHASE1_STEPS, log_every=100,
                   eval_every=10_000, eval_steps=100,
                   init_state="full" if phase2 else "params"),
        mesh=mesh,
        checkpoint=dict(every=5_000, keep=3, keep_period=100_000))


MODERNBERT_ARGS = (None, "", "long", "tiny")
# ModernBERT's context extension (Warner et al., 2024, section 2.2.3): 300B tokens at length
# 8,192 (250B at a constant 3e-4, then 50B decaying), the global layers' RoPE base raised
# from 10,000 to 160,000.
MODERNBERT_LONG_TOKENS = 300e9
MODERNBERT_LONG_LR = 3e-4


def modernbert(name: str, arg, model: ml_collections.ConfigDict, batch_size: int, steps: int,
               lr: float = 8e-4) -> ml_collections.ConfigDict:
    """A ModernBERT-style pre-training run for `model`: masked LM only (no NSP), 30% of the
    tokens masked on the fly (dynamic masking), AdamW at ModernBERT's betas. `arg`:

    None: phase 1, `steps` at length 1,024, batch `batch_size`, peak rate `lr`, RoPE base
    10,000 on every layer (ModernBERT's first phase).
    "long": its context extension at length 8,192, continuing phase 1 (point
    train.init_checkpoint at phase 1's workdir): the global layers' RoPE base 160,000, a
    batch of batch_size / 8 rows (the same tokens per step), 300B tokens, 3e-4. It takes
    phase 1's params only (train.init_state="params": a fresh optimizer and step count),
    as its rate, batch and length are its own. Rotary models have no position table, so
    the two phases' tensors are the same; no train.init_extend_positions.
    "tiny": `model` cut to 4 layers of width 128 at length 128, trained like
    configs/bert_tiny.py on the sample corpus in minutes on a CPU.

    The optimizer is AdamW with a warmup and a linear decay, not ModernBERT's StableAdamW
    and warmup-stable-decay schedule; the warmups are ours."""
    if arg not in MODERNBERT_ARGS:
        raise ValueError(f"configs/{name}.py: unknown argument {arg!r}; use long or tiny")
    config = ml_collections.ConfigDict()
    config.model = model
    config.model.nsp = False
    if arg == "tiny":
        # Layer 0 and 3 global, 1 and 2 local with a window (16 each side) shorter than
        # the rows, so both kinds of layer are exercised.
        config.model.update(vocab_size=30522, hidden_size=128, num_hidden_layers=4,
                            num_attention_heads=2, intermediate_size=192,
                            max_position_embeddings=512, local_attention=32)
        config.data = data_config(max_seq_length=128, max_predictions_per_seq=40,
                                  dynamic_masking=True, masked_lm_prob=0.3,
                                  shuffle_buffer=2000, num_parallel_reads=4)
        return add_training_sections(
            config, optimizer=dict(b2=0.98),
            schedule=dict(lr=1.5e-3, warmup_steps=100, decay="linear"),
            train=dict(batch_size=8, eval_batch_size=64, steps=2400, log_every=50,
                       eval_every=0, eval_steps=-1, deterministic=True),
            checkpoint=dict(every=800, keep=2))
    long = arg == "long"
    length = 8192 if long else 1024
    if long:
        batch_size = max(1, batch_size // 8)
        steps = int(round(MODERNBERT_LONG_TOKENS / (batch_size * length), -3))
        lr = MODERNBERT_LONG_LR
    else:
        config.model.rope_theta = 10_000.0   # phase 1's base; "long" raises it to 160,000
    config.data = data_config(max_seq_length=length,
                              max_predictions_per_seq=int(math.ceil(0.3 * length)),
                              dynamic_masking=True, masked_lm_prob=0.3)
    return add_training_sections(
        config, optimizer=dict(b1=0.9, b2=0.98, eps=1e-6, weight_decay=1e-5),
        schedule=dict(lr=lr, warmup_steps=1_000 if long else 3_000, decay="linear"),
        train=dict(batch_size=batch_size, steps=steps, log_every=100, eval_every=10_000,
                   eval_steps=100, init_state="params"),
        mesh=dict(data=-1, fsdp=1, tensor=1),
        checkpoint=dict(every=5_000, keep=3, keep_period=100_000))


def modernbert_model(**shapes) -> ml_collections.ConfigDict:
    """The `model` section of a ModernBERT-style encoder of the given shapes: rotary
    positions (base 160,000 on global layers, 10,000 on local ones), GeGLU, no biases,
    pre-LN without layer 0's attention LayerNorm, a final LayerNorm, no token types, no
    pooler, a global layer every third with a 128-token window on the others, no dropout,
    LayerNorm epsilon 1e-5, ModernBERT's init (scaled output projections)."""
    return model_config(**dict(
        dict(vocab_size=50368, max_position_embeddings=8192, type_vocab_size=0,
             hidden_act="gelu", ffn_type="geglu", position_embedding="rotary",
             rope_theta=160_000.0, local_rope_theta=10_000.0, use_bias=False,
             norm_bias=False, pre_ln=True, layer0_attention_norm=False, pooler=False,
             global_attn_every_n_layers=3, local_attention=128, layer_norm_eps=1e-5,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
             init_scheme="modernbert"), **shapes))
