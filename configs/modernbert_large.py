"""ModernBERT-large-style encoder (L=28, H=1024, A=16, 395M params), masked LM only.

GeGLU 2,624, vocab 50,368, rotary positions, a global layer every third with a 128-token
window on the others, 8,192-token context. Phases and arguments as configs/modernbert_base.py
(phase 1: batch 4,928, lr 5e-4; `:long`: batch 616, lr 3e-4, 59k steps):

    python launch/train.py --config=configs/modernbert_large.py --workdir=$W1 \
        --config.data.train_files=... --config.data.vocab_file=...
    python launch/train.py --config=configs/modernbert_large.py:long --workdir=$W2 \
        --config.train.init_checkpoint=$W1 --config.data.train_files=... \
        --config.data.vocab_file=...
    python launch/train.py --config=configs/modernbert_large.py:tiny --workdir=/tmp/mbl_tiny

What this config sets apart from the table in configs/modernbert_base.py
(tests/tasks/test_recipes.py holds both to the resolved config; an empty cell is the column
before's):

    config                              default     :long       :tiny
    model.hidden_size                   1024                    128
    model.num_hidden_layers             28                      4
    model.num_attention_heads           16                      2
    model.intermediate_size             2624                    192
    schedule.lr                         5e-4        3e-4        1.5e-3
    train.batch_size                    4928        616         8
    train.steps                         340_000     59_000      2400

Every other value is configs/modernbert_base.py's table.
"""

from bert_jax.tasks.pretraining import recipes


def get_config(arg=None):
    model = recipes.modernbert_model(hidden_size=1024, num_hidden_layers=28,
                                     num_attention_heads=16, intermediate_size=2624)
    # ModernBERT-large's batch: 4,928 sequences of 1,024 tokens; about 1.7 T tokens at 5e-4.
    return recipes.modernbert("modernbert_large", arg, model, batch_size=4928, steps=340_000,
                              lr=5e-4)
