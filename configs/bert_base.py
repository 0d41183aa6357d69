"""BERT-Base (L=12, H=768, A=12, 110M params), the paper's recipe.

Phase 1 (default): 900k steps at length 128 of a 1M-step schedule. Phase 2
(`configs/bert_base.py:phase2`): the last 100k steps at length 512, continuing phase 1's
optimizer state, step and schedule:

    python launch/train.py --config=configs/bert_base.py --workdir=$W1 \
        --config.data.train_files=... --config.data.eval_files=...
    python launch/train.py --config=configs/bert_base.py:phase2 --workdir=$W2 \
        --config.train.init_checkpoint=$W1 --config.data.train_files=<512-token files>

The paper's table (Devlin et al., 2019, section 3.1 and appendix A.2): every value this
config sets, the recipe's (bert_jax/tasks/pretraining/recipes.py, `paper_model` and `paper`)
and this file's; tests/tasks/test_recipes.py holds it to the resolved config. An empty cell
is the column before's.

    config                              default     :phase2
    model.vocab_size                    30522
    model.hidden_size                   768
    model.num_hidden_layers             12
    model.num_attention_heads           12
    model.intermediate_size             3072
    model.hidden_act                    gelu
    model.pre_ln                        False
    model.hidden_dropout_prob           0.1
    model.attention_probs_dropout_prob  0.1
    model.max_position_embeddings       512
    model.type_vocab_size               2
    model.nsp                           True
    data.max_seq_length                 128         512
    data.max_predictions_per_seq        20          80
    data.masked_lm_prob                 0.15
    optimizer.name                      adamw
    optimizer.b1                        0.9
    optimizer.b2                        0.999
    optimizer.eps                       1e-6
    optimizer.weight_decay              0.01
    optimizer.clip_norm                 1.0
    schedule.lr                         1e-4
    schedule.warmup_steps               10_000
    schedule.decay                      linear
    schedule.end_lr                     0.0
    schedule.total_steps                1_000_000
    train.batch_size                    256
    train.steps                         900_000     1_000_000
    train.init_state                    params      full
    train.log_every                     100
    train.eval_every                    10_000
    train.eval_steps                    100
    checkpoint.every                    5_000
    checkpoint.keep                     3
    checkpoint.keep_period              100_000
    model.scan_layers                   True
    model.scan_unroll                   auto
    mesh.data                           -1
    mesh.fsdp                           1
    mesh.tensor                         1

Weight decay skips LayerNorm parameters and biases (bert_jax/optim.py); of the masked
positions 80% become [MASK], 10% a random token, 10% stay (data_prep). The layers' params
are stacked (`model.scan_layers`: the optimizer updates a few dozen arrays, not two
hundred); the layers run unrolled on GPU and CPU and as a loop on TPU
(`model.scan_unroll="auto"`). A workdir saved before Base stacked its layers resumes
with `--config.model.scan_layers=false`; model directories load into either layout.
"""

from bert_jax.tasks.pretraining import recipes


def get_config(arg=None):
    model = recipes.paper_model(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, scan_layers=True, scan_unroll="auto")
    return recipes.paper("bert_base", arg, model, mesh=dict(data=-1, fsdp=1, tensor=1))
