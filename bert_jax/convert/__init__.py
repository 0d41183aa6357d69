"""The checkpoint bridge: Google's TF1 BERT checkpoints and Hugging Face weights <-> our
model directories, both ways, bit-exact, plus feature extraction and serving exports.

One format object per source knows its names, layouts, heads and config; the readers and
writers pick it once and ask it the rest:

    formats.py       the reshape kinds (each once) and `Format`, what a format knows
    tensors.py       format-independent: plan an import from names + shapes, read, write
    tf.py            `TF1`: Google's names (bert/encoder/layer_N/...), read/write checkpoints
    hf.py            `BERT`: transformers' BERT names and config.json; a state dict in memory
    hf_modernbert.py `MODERNBERT`: transformers' ModernBERT (fused Wqkv / Wi), config.json
    hf_files.py      HF directories on disk (safetensors, pytorch_model.bin); picks the format
    model_dir.py     our portable model directory (bert_config.json + orbax params + vocab)
    sources.py       any checkpoint opened without reading a tensor (init_checkpoint, runs)
    tf_reference.py  an independent TF forward pass over original names (for `verify`)
    hf_reference.py  transformers in a child process (for `verify`)
    verify.py        ours vs a reference on sample text: max abs differences
    extract.py       feature extraction (launch/extract_features.py)
    savedmodel.py    a TF SavedModel for TF Serving, through jax2tf
    __main__.py      `python -m bert_jax.convert from-tf|from-hf|from-workdir|to-hf|to-tf|...`
"""
