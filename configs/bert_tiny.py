"""BERT-Tiny (L=2, H=128, A=2): the quick start and the tests, on CPU in minutes.

    python launch/train.py --config=configs/bert_tiny.py --workdir=/tmp/bert_tiny

With no --config.data.train_files it builds TFRecords from data_prep/sample_corpus once
(cached in the workdir, 1 document in 20 held out for eval) and pre-trains for a few
minutes on a CPU (timings: benchmarks/RESULTS.md); eval MLM accuracy ends at 0.14-0.15,
against the 0.073 of always predicting the most frequent masked token (the baseline it
prints).

Every value this file sets (tests/tasks/test_recipes.py holds the table to the resolved
config); every other value is its section's default (docs/configuration.md):

    config                              default
    model.vocab_size                    30522
    model.hidden_size                   128
    model.num_hidden_layers             2
    model.num_attention_heads           2
    model.intermediate_size             512
    model.max_position_embeddings       512
    model.nsp                           True
    data.max_seq_length                 64
    data.max_predictions_per_seq        10
    data.shuffle_buffer                 2000
    data.num_parallel_reads             4
    optimizer.b2                        0.98
    schedule.lr                         1.5e-3
    schedule.warmup_steps               100
    schedule.decay                      linear
    train.batch_size                    8
    train.eval_batch_size               64
    train.steps                         2400
    train.log_every                     50
    train.eval_every                    0
    train.eval_steps                    -1
    train.deterministic                 True
    checkpoint.every                    800
    checkpoint.keep                     2
"""

import ml_collections

from bert_jax.data.pretrain import data_config
from bert_jax.models.config import model_config
from bert_jax.train.config import add_training_sections


def get_config(arg=None):
    del arg
    config = ml_collections.ConfigDict()
    config.model = model_config(
        vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=512, max_position_embeddings=512)
    config.model.nsp = True
    config.data = data_config(max_seq_length=64, max_predictions_per_seq=10,
                              shuffle_buffer=2000, num_parallel_reads=4)
    # Tuned for a few minutes of CPU, where a step costs nearly only its compute per token:
    # more, smaller updates of shorter pairs learn more per CPU-second; a small model takes a
    # large learning rate with a warmup, Adam's b2=0.98 (RoBERTa's) adapts faster in a run
    # this short, and no dropout learns faster (the sweep: benchmarks/RESULTS.md).
    add_training_sections(
        config,
        optimizer=dict(b2=0.98),
        schedule=dict(lr=1.5e-3, warmup_steps=100, decay="linear"),
        train=dict(batch_size=8, eval_batch_size=64, steps=2400, log_every=50, eval_every=0,
                   eval_steps=-1, deterministic=True),
        checkpoint=dict(every=800, keep=2))
    return config
