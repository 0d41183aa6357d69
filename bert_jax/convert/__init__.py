"""The checkpoint bridge: Google's TF1 BERT checkpoints and Hugging Face weights <-> our
model directories, both ways, bit-exact, plus feature extraction.

    tensors.py       format-independent: plan an import from names + shapes, read, write
    tf.py            TF1 names (bert/encoder/layer_N/...), read/write checkpoints
    hf.py            Hugging Face names (the table), config.json
    hf_files.py      HF directories on disk: safetensors (sharded too) / pytorch_model.bin
    model_dir.py     our portable model directory (bert_config.json + orbax params + vocab)
    tf_reference.py  an independent TF forward pass over original names (for `verify`)
    verify.py        ours vs a reference on sample text: max abs differences
    extract.py       feature extraction (launch/extract_features.py)
    __main__.py      `python -m bert_jax.convert from-tf|from-hf|to-hf|to-tf|verify`
"""
