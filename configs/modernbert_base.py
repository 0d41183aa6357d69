"""ModernBERT-base-style encoder (L=22, H=768, A=12, 149M params), masked LM only.

GeGLU 1,152, vocab 50,368, rotary positions, a global layer every third with a 128-token
window on the others, 8,192-token context; 30% of the tokens masked on the fly. Two phases,
as ModernBERT: length 1,024 (batch 4,608, lr 8e-4), then `:long`, length 8,192 from phase
1's params (batch 576, lr 3e-4, 64k steps, the global layers' RoPE base 160,000):

    python launch/train.py --config=configs/modernbert_base.py --workdir=$W1 \
        --config.data.train_files=... --config.data.vocab_file=...
    python launch/train.py --config=configs/modernbert_base.py:long --workdir=$W2 \
        --config.train.init_checkpoint=$W1 --config.data.train_files=... \
        --config.data.vocab_file=...
    python launch/train.py --config=configs/modernbert_base.py:tiny --workdir=/tmp/mb_tiny

`:tiny` keeps the architecture at 4 layers of width 128 and trains on the sample corpus
like configs/bert_tiny.py. ModernBERT's own vocabulary is a 50,368-token BPE; give its
vocabulary with data.vocab_file (a WordPiece vocab.txt or a SentencePiece .model).

Every value this config sets, ModernBERT's recipe (bert_jax/tasks/pretraining/recipes.py,
`modernbert_model` and `modernbert`) and this file's sizes; tests/tasks/test_recipes.py holds
it to the resolved config. An empty cell is the column before's.

    config                              default     :long       :tiny
    model.vocab_size                    50368                   30522
    model.hidden_size                   768                     128
    model.num_hidden_layers             22                      4
    model.num_attention_heads           12                      2
    model.intermediate_size             1152                    192
    model.max_position_embeddings       8192                    512
    model.type_vocab_size               0
    model.hidden_act                    gelu
    model.ffn_type                      geglu
    model.position_embedding            rotary
    model.rope_theta                    10_000.0    160_000.0
    model.local_rope_theta              10_000.0
    model.use_bias                      False
    model.norm_bias                     False
    model.pre_ln                        True
    model.layer0_attention_norm         False
    model.pooler                        False
    model.global_attn_every_n_layers    3
    model.local_attention               128                     32
    model.layer_norm_eps                1e-5
    model.hidden_dropout_prob           0.0
    model.attention_probs_dropout_prob  0.0
    model.init_scheme                   modernbert
    model.nsp                           False
    data.max_seq_length                 1024        8192        128
    data.max_predictions_per_seq        308         2458        40
    data.dynamic_masking                True
    data.masked_lm_prob                 0.3
    data.shuffle_buffer                 10_000                  2000
    data.num_parallel_reads             16                      4
    optimizer.b1                        0.9
    optimizer.b2                        0.98
    optimizer.eps                       1e-6
    optimizer.weight_decay              1e-5                    0.01
    schedule.lr                         8e-4        3e-4        1.5e-3
    schedule.warmup_steps               3000        1000        100
    schedule.decay                      linear
    train.batch_size                    4608        576         8
    train.eval_batch_size               0                       64
    train.steps                         360_000     64_000      2400
    train.log_every                     100                     50
    train.eval_every                    10_000                  0
    train.eval_steps                    100                     -1
    train.init_state                    params
    train.deterministic                 False                   True
    checkpoint.every                    5000                    800
    checkpoint.keep                     3                       2
    checkpoint.keep_period              100_000                 0
    mesh.data                           -1
    mesh.fsdp                           1
    mesh.tensor                         1
"""

from bert_jax.tasks.pretraining import recipes


def get_config(arg=None):
    model = recipes.modernbert_model(hidden_size=768, num_hidden_layers=22,
                                     num_attention_heads=12, intermediate_size=1152)
    # ModernBERT-base's batch: 4,608 sequences of 1,024 tokens; about 1.7 T tokens at 8e-4.
    return recipes.modernbert("modernbert_base", arg, model, batch_size=4608, steps=360_000,
                              lr=8e-4)
