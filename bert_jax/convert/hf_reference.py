"""The reference side of `verify --reference=hf:DIR`: transformers' PyTorch BERT (or
ModernBERT, by config.json's model_type) on a batch,
run as its own process:

    python -m bert_jax.convert.hf_reference HF_DIR batch.npz out.npz mlm,nsp

Its own process because transformers (through torch) and TensorFlow each carry an LLVM; in
one interpreter the second aborts with "Option ... registered more than once".
batch.npz holds input_ids / token_type_ids / attention_mask <int>[batch, length]; out.npz
gets sequence_output, pooled_output and, for the heads named, mlm_logits / nsp_logits.
"""

import sys

import numpy as np


def main(directory: str, batch_path: str, out_path: str, heads: str) -> None:
    import json
    import os

    import torch
    import transformers

    heads = tuple(h for h in heads.split(",") if h)
    batch = np.load(batch_path)
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        if json.load(f).get("model_type") == "modernbert":
            return modernbert(directory, batch, out_path, heads)
    t = {k: torch.tensor(np.asarray(batch[k], np.int64))
         for k in ("input_ids", "token_type_ids", "attention_mask")}
    load = dict(attn_implementation="eager")
    with torch.no_grad():
        if "mlm" in heads:
            cls = (transformers.BertForPreTraining if "nsp" in heads
                   else transformers.BertForMaskedLM)
            model = cls.from_pretrained(directory, **load).eval()
            res = model(**t)
            bert = model.bert
        else:
            bert = transformers.BertModel.from_pretrained(directory, **load).eval()
        enc = bert(**t)
        out = {"sequence_output": enc.last_hidden_state.numpy(),
               "pooled_output": enc.pooler_output.numpy()}
        if "mlm" in heads:
            out["mlm_logits"] = (res.prediction_logits if "nsp" in heads else res.logits).numpy()
        if "nsp" in heads:
            out["nsp_logits"] = res.seq_relationship_logits.numpy()
    np.savez(out_path, **out)


def modernbert(directory: str, batch, out_path: str, heads: tuple) -> None:
    """ModernBertModel / ModernBertForMaskedLM (no token types, no pooler): sequence_output
    and, with the "mlm" head, mlm_logits."""
    import torch
    import transformers

    t = {k: torch.tensor(np.asarray(batch[k], np.int64)) for k in ("input_ids",
                                                                   "attention_mask")}
    load = dict(attn_implementation="eager")
    with torch.no_grad():
        if "mlm" in heads:
            model = transformers.ModernBertForMaskedLM.from_pretrained(directory, **load).eval()
            out = {"mlm_logits": model(**t).logits.numpy()}
            encoder = model.model
        else:
            out, encoder = {}, transformers.ModernBertModel.from_pretrained(
                directory, **load).eval()
        out["sequence_output"] = encoder(**t).last_hidden_state.numpy()
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:5])
