"""Every custom kernel of the model, and the dispatch that picks it per config and platform.

A model module asks one function which path a call takes, then calls that path; XLA's
expression is the reference each kernel is tested against (on CPU, in Pallas' interpret
mode) and the path wherever a kernel cannot run.

    config key             module              picks the path      the kernels
    model.attention        attention/          resolve()           xla.py (the reference),
      model.pallas_*       (the dispatch)                          cudnn.py, pallas_flash/,
                                                                   splash_tpu.py
    model.gelu_backward    gelu.py             path()              bias_gelu, gelu_matmul
    model.residual_norm    residual_norm.py    path(), fits()      residual_norm

Shared by all of them: backend.py (the platform a trace compiles for, and the mesh axes a
kernel's shard_map splits its operands over: a custom kernel is opaque to XLA's sharding
propagation) and dropout_hash.py (the counter-based hash of the hash dropout, which the
Pallas attention and residual + LayerNorm kernels regenerate inside, bit for bit the mask
models/dropout.py draws). FP8 products (models/fp8.py) are flax's op, not a kernel of ours.

This package imports nothing itself: import the module you need (`from
bert_jax.models.kernels import attention`).
"""
