"""BERT-Tiny (L=2, H=128, A=2): the quick start and the tests, on CPU in minutes.

    python launch/train.py --config=configs/bert_tiny.py --workdir=/tmp/bert_tiny

With no --config.data.train_files it builds TFRecords from data_prep/sample_corpus once
(cached in the workdir, 1 document in 20 held out for eval) and pre-trains for a few minutes
on CPU; eval MLM accuracy ends well above the most-frequent-token baseline it prints.
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
    config.data = data_config(max_seq_length=128, max_predictions_per_seq=20, batch_size=32,
                              eval_batch_size=64, shuffle_buffer=2000, num_parallel_reads=4)
    # A small model learns fast with a large learning rate; short warmup for a short run.
    add_training_sections(
        config,
        schedule=dict(lr=2e-3, warmup_steps=50, decay="linear"),
        train=dict(steps=400, log_every=20, eval_every=0, eval_steps=-1),
        checkpoint=dict(every=200, keep=2))
    return config
