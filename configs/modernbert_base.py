"""ModernBERT-base-style encoder (L=22, H=768, A=12, 149M params), masked LM only.

GeGLU 1,152, vocab 50,368, rotary positions, a global layer every third with a 128-token
window on the others, 8,192-token context; 30% of the tokens masked on the fly. Two phases,
as ModernBERT: length 1,024 (batch 4,608, lr 8e-4), then `:long`, length 8,192 from phase
1's params (batch 576, lr 3e-4, 64k steps, the global layers' RoPE base 160,000):

    python launch/train.py --config=configs/modernbert_base.py --workdir=$W1 \
        --config.data.train_files=... --config.data.vocab_file=...
    python launch/train.py --config=configs/modernbert_base.py:long --workdir=$W2 \
        --config.train.init_checkpoint=$W1 --config.data.train_files=... \
        --config.data.vocab_file=...
    python launch/train.py --config=configs/modernbert_base.py:tiny --workdir=/tmp/mb_tiny

`:tiny` keeps the architecture at 4 layers of width 128 and trains on the sample corpus
like configs/bert_tiny.py. ModernBERT's own vocabulary is a 50,368-token BPE; give its
vocabulary with data.vocab_file (a WordPiece vocab.txt or a SentencePiece .model).
"""

from bert_jax.train.config import modernbert_model, modernbert_pretraining_config


def get_config(arg=None):
    model = modernbert_model(hidden_size=768, num_hidden_layers=22, num_attention_heads=12,
                             intermediate_size=1152)
    # ModernBERT-base's batch: 4,608 sequences of 1,024 tokens; about 1.7 T tokens at 8e-4.
    return modernbert_pretraining_config("modernbert_base", arg, model, batch_size=4608,
                                         steps=360_000, lr=8e-4)
