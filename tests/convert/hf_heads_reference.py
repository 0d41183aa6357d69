"""The transformers side of tests/convert/test_hf_heads.py, in its own process (torch and
TensorFlow cannot share one, see bert_jax/convert/hf_reference.py):

    python tests/convert/hf_heads_reference.py HF_DIR KIND OUT.npz '[["text a", "text b"]]'

Loads HF_DIR with AutoTokenizer and the AutoModelFor* of KIND (pairs, regression, ner,
squad, choice), tokenizes the pairs and writes the inputs, the logits and, for ner (and
squad where transformers still has the pipeline), the pipeline's output as JSON.
"""

import json
import sys

import numpy as np


def main(directory: str, kind: str, out_path: str, texts: str) -> None:
    import torch
    import transformers as t
    from transformers.pipelines import SUPPORTED_TASKS

    pairs = [tuple(x) for x in json.loads(texts)]
    tok = t.AutoTokenizer.from_pretrained(directory)
    auto = {"pairs": t.AutoModelForSequenceClassification,
            "regression": t.AutoModelForSequenceClassification,
            "ner": t.AutoModelForTokenClassification,
            "squad": t.AutoModelForQuestionAnswering,
            "choice": t.AutoModelForMultipleChoice}[kind]
    model = auto.from_pretrained(directory, attn_implementation="eager").eval()
    assert type(model).__name__ == json.load(open(f"{directory}/config.json"))[
        "architectures"][0], type(model).__name__
    seconds = None if kind == "ner" else [b for _, b in pairs]  # NER: single sentences
    enc = tok([a for a, _ in pairs], seconds, padding="max_length", max_length=48,
              return_tensors="np", return_offsets_mapping=True)
    out = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    if kind == "choice":  # one question, the pairs as its choices
        out = {k: v[None] for k, v in out.items()}
    with torch.no_grad():
        res = model(**{k: torch.tensor(v.astype(np.int64)) for k, v in out.items()})
    if kind == "squad":
        out["start_logits"] = res.start_logits.numpy()
        out["end_logits"] = res.end_logits.numpy()
        out["offsets"] = enc["offset_mapping"]
        seq = np.array([[s == 1 for s in enc.sequence_ids(i)] for i in range(len(pairs))])
        out["context_mask"] = seq & (enc["offset_mapping"][..., 1] > 0)
        if "question-answering" in SUPPORTED_TASKS:
            pipe = t.pipeline("question-answering", model=model, tokenizer=tok)
            ans = pipe(question=pairs[0][0], context=pairs[0][1], align_to_words=False)
            out["pipeline"] = json.dumps({k: ans[k] for k in ("start", "end", "answer")})
    else:
        out["logits"] = res.logits.numpy()
    if kind == "ner":
        pipe = t.pipeline("token-classification", model=model, tokenizer=tok,
                          ignore_labels=[])
        found = pipe(pairs[0][0])
        out["pipeline"] = json.dumps([{"entity": x["entity"], "index": int(x["index"]),
                                       "word": x["word"]} for x in found])
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:5])
