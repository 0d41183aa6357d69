"""benchmarks/gpu_suite.py's parts (run the script, not this package):

  suite.py         the flags, cases, variants and the order of the measurements; main.
  children.py      one process per measurement: the parent's spawn and the child's entry.
  jax_child.py     bert_jax's step, timed and traced.
  torch_child.py   HF PyTorch's step (benchmarks/torch_reference.py), timed.
  kernel_check.py  the fused attention paths against the XLA one, before any timing.
  report.py        the header, the table (its columns documented there) and the files.
  profile.py       the trace's top kernels.
  common.py        the cases and helpers both sides share.
"""
