"""SQuAD examples -> fixed-length features over doc_stride windows (run_squad.py's layout),
with every context token's [start, end) character span in the ORIGINAL context.

The original tool split the context on whitespace and re-derived answers from whitespace
tokens, which loses accents, odd spacing and punctuation glued to words; it then needed a
heuristic (`get_final_text`) to map back. Here the `tokenizers` offsets give each WordPiece
its exact character span, so labels and predictions are exact slices of the context.

Features (`<int32>`; L = max_seq_length):
    input_ids, input_mask, segment_ids [N, L]   [CLS] question [SEP] context window [SEP]
    start_positions, end_positions [N]          answer tokens; 0 ([CLS]) = no answer here
    char_start, char_end [N, L]                 span of each context token, -1 elsewhere
    max_context [N, L]                          1 where this window gives the token its
                                                most context (predictions only from there)
    example_index, feature_index [N]
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from absl import logging

from bert_jax.tasks.inputs import encode_with_offsets
from bert_jax.tasks.squad.reader import SquadExample


def doc_windows(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of the windows over a context of num_tokens: each starts doc_stride
    after the previous (or right after it when shorter), the last one reaches the end."""
    if max_tokens <= 0:
        raise ValueError(f"no room for context tokens (max_tokens={max_tokens}): "
                         "raise max_seq_length or lower max_query_length")
    spans, start = [], 0
    while True:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length >= num_tokens:
            return spans
        start += min(length, doc_stride)


def max_context_flags(spans: list[tuple[int, int]]) -> list[np.ndarray]:
    """For each window, whether each of its tokens has its maximum context there: score =
    min(tokens left, tokens right) + 0.01 * window length, ties to the earlier window."""
    best: dict[int, tuple[float, int]] = {}
    for w, (start, length) in enumerate(spans):
        for pos in range(start, start + length):
            score = min(pos - start, start + length - 1 - pos) + 0.01 * length
            if pos not in best or score > best[pos][0]:
                best[pos] = (score, w)
    return [np.array([best[p][1] == w for p in range(s, s + n)], np.int32)
            for w, (s, n) in enumerate(spans)]


def answer_token_span(offsets: Sequence[tuple[int, int]], start_char: int, end_char: int):
    """First and last token overlapping [start_char, end_char), or None if none does."""
    first = next((i for i, (s, e) in enumerate(offsets) if e > start_char and s < end_char), None)
    if first is None:
        return None
    last = max(i for i, (s, e) in enumerate(offsets) if s < end_char and e > start_char)
    return first, last


def convert_examples(examples: Sequence[SquadExample], tokenizer, max_seq_length: int = 384,
                     doc_stride: int = 128, max_query_length: int = 64,
                     is_training: bool = False) -> dict[str, np.ndarray]:
    """Features of every window of every example. Training examples whose answer has no
    token (only whitespace) are skipped with a warning; evaluation keeps every example."""
    rows: dict[str, list] = {k: [] for k in (
        "input_ids", "input_mask", "segment_ids", "start_positions", "end_positions",
        "char_start", "char_end", "max_context", "example_index")}
    skipped = 0
    for ex_i, ex in enumerate(examples):
        query = tokenizer.encode(ex.question)[:max_query_length]
        ids, offsets = encode_with_offsets(tokenizer, ex.context)
        answer = None
        if is_training and ex.answers and not ex.is_impossible:
            text, start = ex.answers[0]
            answer = answer_token_span(offsets, start, start + len(text))
            if answer is None:
                skipped += 1
                continue
        spans = doc_windows(len(ids), max_seq_length - len(query) - 3, doc_stride)
        for (start, length), flags in zip(spans, max_context_flags(spans)):
            tokens = [tokenizer.cls_id] + query + [tokenizer.sep_id]
            ctx0 = len(tokens)
            tokens += ids[start:start + length] + [tokenizer.sep_id]
            pad = max_seq_length - len(tokens)
            segments = [0] * ctx0 + [1] * (length + 1)
            cs = np.full([max_seq_length], -1, np.int32)
            ce = np.full([max_seq_length], -1, np.int32)
            mc = np.zeros([max_seq_length], np.int32)
            window = offsets[start:start + length]
            cs[ctx0:ctx0 + length] = [s for s, _ in window]
            ce[ctx0:ctx0 + length] = [e for _, e in window]
            mc[ctx0:ctx0 + length] = flags
            s_pos = e_pos = 0
            if answer is not None and start <= answer[0] and answer[1] < start + length:
                s_pos, e_pos = answer[0] - start + ctx0, answer[1] - start + ctx0
            rows["input_ids"].append(tokens + [0] * pad)
            rows["input_mask"].append([1] * len(tokens) + [0] * pad)
            rows["segment_ids"].append(segments + [0] * pad)
            rows["start_positions"].append(s_pos)
            rows["end_positions"].append(e_pos)
            rows["char_start"].append(cs)
            rows["char_end"].append(ce)
            rows["max_context"].append(mc)
            rows["example_index"].append(ex_i)
    if skipped:
        logging.warning("SQuAD: skipped %d training example(s) whose answer has no token",
                        skipped)
    per_token = ("input_ids", "input_mask", "segment_ids", "char_start", "char_end",
                 "max_context")
    out = {k: np.asarray(v, np.int32).reshape((-1, max_seq_length) if k in per_token else (-1,))
           for k, v in rows.items()}
    out["feature_index"] = np.arange(len(out["example_index"]), dtype=np.int32)
    return out
