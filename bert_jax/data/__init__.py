"""Input: pre-training TFRecords -> host numpy batches -> global jax.Arrays.

  pretrain.py      the `config.data` section and the entry points the trainer calls:
                   train_iterator / eval_iterator / check_input (TF imported lazily)
  tfrecord.py      the tf.data pipeline over the original BERT TFRecords (packed ones
                   too), its exact state
  shards.py        globs, per-host file shares, corrupt / truncated shard scans
  masking.py       dynamic (RoBERTa) re-masking in TF ops
  synthetic.py     `data.source="synthetic"`: batches of the right shapes, no TensorFlow
  device.py        host batch -> global jax.Array on the mesh; device prefetch thread
  state.py         iterator state as a flat dict of numpy arrays; npz files
  checkpointing.py the iterator state as an orbax checkpoint item (one file per process)
  checks.py        records and batches against the config, naming file and values
  inspect.py       the data doctor: `python -m bert_jax.data.inspect --input=GLOB`
  features.py      the original pre-training feature format and the packed-row one
                   (data_prep --pack), shared with data_prep

Pre-training input only: the tokenizers are bert_jax/tokenization.py (every caller's), each
fine-tuning task's data is under bert_jax/tasks/.
"""
