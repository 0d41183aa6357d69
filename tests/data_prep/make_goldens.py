"""Goldens for tests/data_prep, from independent implementations. Run with the reference venv:

    HF_HUB_OFFLINE=1 /work/venv-ref/bin/python tests/data_prep/make_goldens.py

1. tokenizer_ids.json.gz: 2,000+ lines of the sample corpus (every non-ASCII line, the rest
   evenly spaced) plus hand-made edge cases, with the ids of transformers' slow
   `BertTokenizer` (the Python port of the original BERT FullTokenizer): uncased with the
   BERT uncased vocab, cased with a cased vocab trained on the sample corpus.
2. original_stats.json: statistics of the original create_pretraining_data algorithm, re-run
   here faithfully (Python `random`, global document list, token-by-token truncation, the
   original masking loop) on the sample corpus tokenized by `BertTokenizer`, to compare
   our tool's statistics with.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import random

from transformers import BertTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data_prep", "goldens")
CORPUS = sorted(glob.glob(os.path.join(ROOT, "data_prep", "sample_corpus", "*.txt")))
UNCASED = os.path.join(ROOT, "data_prep", "bert_uncased_vocab.txt")
CASED = os.path.join(OUT, "cased_vocab_8k.txt")

EDGE_CASES = [
    "Héllo Wörld! Ça va? Straße, naïve café, ÀÉÎÕÜ.",
    "中文字符和English混合, 日本語のテキスト, 한국어.",
    "tab\tseparated\ttext and  double  spaces",
    "control\x00chars\x07here\x1b and soft\u00adhyphen zero\u200bwidth",
    "x" * 120 + " short " + "y" * 100 + " " + "z" * 101,
    "punctuation: «quotes» “curly” ‘single’ — dash… ¿qué? ¡sí! #hash $100 50% a&b @me",
    "emoji 😀 and symbols ™ © ® ° ± ∞ √ ≠",
    "Greek αβγ ΔΕΖ and Cyrillic Привет мир",
    "ﬁ ligature, full-width ＡＢＣ１２３, superscript x² and ½",
    "",
    "   ",
]


def sample_lines() -> list[str]:
    lines = []
    for path in CORPUS:
        with open(path, encoding="utf-8") as f:
            lines.extend(l.strip() for l in f if l.strip())
    special = [l for l in lines if not (l.isascii() and l.isprintable())]
    rest = [l for l in lines if l.isascii() and l.isprintable()]
    step = max(1, len(rest) // (2100 - len(special)))
    return special + rest[::step] + EDGE_CASES


def tokenizer_goldens() -> None:
    lines = sample_lines()
    out = {"lines": lines}
    for name, vocab, lower in (("uncased", UNCASED, True), ("cased", CASED, False)):
        tok = BertTokenizer(vocab, do_lower_case=lower)
        out[name] = [tok.convert_tokens_to_ids(tok.tokenize(l)) for l in lines]
    with gzip.open(os.path.join(OUT, "tokenizer_ids.json.gz"), "wt", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    print(f"tokenizer goldens: {len(lines)} lines")


# ---- the original algorithm, re-implemented faithfully (token strings, Python random) ----

def _truncate(a, b, max_num, rng):
    while len(a) + len(b) > max_num:
        trunc = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def _mask(tokens, prob, max_pred, vocab_words, rng):
    cand = [[i] for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
    rng.shuffle(cand)
    out = list(tokens)
    n_pred = min(max_pred, max(1, int(round(len(tokens) * prob))))
    masked, kinds = [], collections.Counter()
    for idx in cand:
        if len(masked) >= n_pred:
            break
        i = idx[0]
        if rng.random() < 0.8:
            out[i], kind = "[MASK]", "mask"
        elif rng.random() < 0.5:
            kind = "keep"
        else:
            out[i], kind = vocab_words[rng.randint(0, len(vocab_words) - 1)], "random"
        masked.append(i)
        kinds[kind] += 1
    return out, masked, kinds, len(cand)


def _instances(docs, d, seq, short_prob, prob, max_pred, vocab_words, rng, st):
    doc = docs[d]
    max_num = seq - 3
    target = max_num
    if rng.random() < short_prob:
        target = rng.randint(2, max_num)
    chunk, length, i = [], 0, 0
    while i < len(doc):
        chunk.append(doc[i])
        length += len(doc[i])
        if i == len(doc) - 1 or length >= target:
            if chunk:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for s in chunk[:a_end] for t in s]
                b = []
                if len(chunk) == 1 or rng.random() < 0.5:
                    is_random = True
                    for _ in range(10):
                        r = rng.randint(0, len(docs) - 1)
                        if r != d:
                            break
                    rdoc = docs[r]
                    for s in rdoc[rng.randint(0, len(rdoc) - 1):]:
                        b.extend(s)
                        if len(b) >= target - len(a):
                            break
                    i -= len(chunk) - a_end
                else:
                    is_random = False
                    b = [t for s in chunk[a_end:] for t in s]
                _truncate(a, b, max_num, rng)
                tokens = ["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"]
                _, masked, kinds, n_cand = _mask(tokens, prob, max_pred, vocab_words, rng)
                st["instances"] += 1
                st["is_next"] += not is_random
                st["masked"] += len(masked)
                st["candidates"] += n_cand
                st["tokens"] += len(tokens)
                for k, v in kinds.items():
                    st[k] += v
            chunk, length = [], 0
        i += 1


def original_stats(seq=128, max_pred=20, dupe=5, prob=0.15, short_prob=0.1, seeds=range(10)):
    """Mean statistics over several seeds: one run's IsNext fraction on this small corpus
    varies by ~1 point from seed to seed."""
    tok = BertTokenizer(UNCASED, do_lower_case=True)
    docs0 = [[]]
    for path in CORPUS:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    docs0.append([])
                    continue
                toks = tok.tokenize(line)
                if toks:
                    docs0[-1].append(toks)
    docs0 = [d for d in docs0 if d]
    vocab_words = list(tok.vocab.keys())
    runs = []
    for seed in seeds:
        rng = random.Random(seed)
        docs = list(docs0)
        rng.shuffle(docs)
        st = collections.Counter()
        for _ in range(dupe):
            for d in range(len(docs)):
                _instances(docs, d, seq, short_prob, prob, max_pred, vocab_words, rng, st)
        runs.append({
            "seed": seed,
            "instances": st["instances"],
            "is_next_fraction": st["is_next"] / st["instances"],
            "masked_fraction": st["masked"] / st["candidates"],
            "mean_tokens": st["tokens"] / st["instances"],
            "mask_split": [st[k] / st["masked"] for k in ("mask", "keep", "random")],
        })
    mean = {k: sum(r[k] for r in runs) / len(runs)
            for k in ("instances", "is_next_fraction", "masked_fraction", "mean_tokens")}
    res = {
        "settings": dict(max_seq_length=seq, max_predictions_per_seq=max_pred, dupe_factor=dupe,
                         masked_lm_prob=prob, short_seq_prob=short_prob),
        "documents": len(docs0),
        "mean": mean,
        "runs": runs,
    }
    with open(os.path.join(OUT, "original_stats.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(res["mean"])


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    tokenizer_goldens()
    original_stats()
