"""BERT-Base (L=12, H=768, A=12, 110M params), the paper's recipe.

Phase 1 (default): 900k steps at length 128 of a 1M-step schedule (batch 256, Adam lr 1e-4,
warmup 10k, linear decay). Phase 2 (`configs/bert_base.py:phase2`): the last 100k steps at
length 512, continuing phase 1's optimizer state, step and schedule:

    python launch/train.py --config=configs/bert_base.py --workdir=$W1 \
        --config.data.train_files=... --config.data.eval_files=...
    python launch/train.py --config=configs/bert_base.py:phase2 --workdir=$W2 \
        --config.train.init_checkpoint=$W1 --config.data.train_files=<512-token files>

The layers' params are stacked (`model.scan_layers`: the optimizer updates a few dozen
arrays, not two hundred); the layers run unrolled on GPU and CPU and as a loop on TPU
(`model.scan_unroll="auto"`). A workdir saved before Base stacked its layers resumes
with `--config.model.scan_layers=false`; model directories load into either layout.
"""

from bert_jax.models.config import model_config
from bert_jax.train.config import paper_pretraining_config


def get_config(arg=None):
    model = model_config(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, scan_layers=True, scan_unroll="auto")
    return paper_pretraining_config("bert_base", arg, model, mesh=dict(data=-1, fsdp=1, tensor=1))
