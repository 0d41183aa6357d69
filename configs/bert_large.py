"""BERT-Large (L=24, H=1024, A=16, 340M params), the paper's recipe.

Same schedule as configs/bert_base.py (phase 1: 900k steps at length 128; `:phase2`: the
last 100k at 512 from phase 1's state). What this config sets apart from the paper's table
in configs/bert_base.py (tests/tasks/test_recipes.py holds both to the resolved config):

    config                              default     :phase2
    model.hidden_size                   1024
    model.num_hidden_layers             24
    model.num_attention_heads           16
    model.intermediate_size             4096
    model.remat                         minimal_ffn
    mesh.data                           1
    mesh.fsdp                           -1

Every other value is configs/bert_base.py's table.

Layers are scanned (params stacked) and run as a loop on TPU (compile time independent of
depth) but unrolled on GPU and CPU (`model.scan_unroll="auto"`: no loop, fewer kernels and
bytes a step, a longer compile); parameters + optimizer state are sharded over every device
(FSDP); on a pod with fast links, `--config.mesh.data=-1 --config.mesh.fsdp=8` trades memory
for less all-gather traffic. Like every config it computes in bfloat16 on a GPU or TPU and in
float32 on a CPU (`model.dtype="auto"`; params and optimizer state float32).

What each layer keeps for the backward pass is `model.remat=minimal_ffn` (models/encoder.py):
Q, K, V, the attention context, the two LayerNorm inputs, the FFN's input and its first
product, in the compute dtype, and the LayerNorms' statistics; GELU, dropout masks and
attention probabilities are recomputed,
so batch 256 x 128 fits an 80 GB card with room to spare (`benchmarks/step_memory.py`; the
figures are in benchmarks/RESULTS.md).
"""

from bert_jax.tasks.pretraining import recipes


def get_config(arg=None):
    model = recipes.paper_model(
        vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, scan_layers=True, scan_unroll="auto",
        remat="minimal_ffn")
    return recipes.paper("bert_large", arg, model, mesh=dict(data=1, fsdp=-1, tensor=1))
