"""The paper's sampling of masked sentence pairs, on one chunk of tokenized documents.

Same algorithm as google-research/bert `create_pretraining_data.py` (written anew here):

* per document and dupe pass, a target length: `max_seq_length - 3`, or with probability
  `short_seq_prob` a uniform length in [2, max_seq_length - 3] (one draw per document, as
  the original);
* sentences are gathered until the target is reached (or the document ends); segment A is
  the first `a_end` of them (`a_end` uniform in [1, n - 1]);
* B is the rest of the gathered sentences (label 0, IsNext), or - always when only one
  sentence was gathered, else with probability 1/2 - a span of another document starting
  at a random sentence, long enough for the target (label 1, random); the unused sentences
  are put back for the next instance;
* the pair is truncated to `max_seq_length - 3` by removing tokens from the longer segment,
  each removal from the front or the back with probability 1/2;
* `round(len(tokens) * masked_lm_prob)` positions (at least 1, at most
  `max_predictions_per_seq`) chosen uniformly among non-[CLS]/[SEP] tokens (whole words with
  `do_whole_word_mask`); each becomes [MASK] 80%, stays 10%, a random vocabulary id 10%.

Differences, for bounded memory and speed (statistics are the same):
* the random B comes from another document *of the same chunk* (a chunk is ~1 MB of text),
  not of the whole corpus, and instances are shuffled within the chunk, not globally;
* the truncation is computed in closed form (how many tokens leave each segment, then a
  binomial front/back split) instead of one token at a time; masking is vectorized with
  numpy over a batch of instances (positions from a partial Fisher-Yates shuffle of the
  candidates instead of a full shuffle: the same uniform choice). Random streams differ from the original's, so the
  output is not byte-equal to it - only equal in distribution.

`--no_nsp` (RoBERTa's FULL-SENTENCES): `[CLS] s_i ... s_j [SEP]` packed from consecutive
sentences up to `max_seq_length - 2` tokens, crossing document boundaries with an extra
[SEP]; segment_ids all 0, next_sentence_labels 0 (meaningless; train without NSP).
"""

from __future__ import annotations

import bisect
import dataclasses
import random

import numpy as np


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    do_whole_word_mask: bool = False
    no_nsp: bool = False
    # --pack: rows of up to this many instances (data_prep/packing.py); 0 = one per row.
    max_sequences_per_pack: int = 0

    def validate(self) -> None:
        if self.max_seq_length < 5:
            raise ValueError(f"max_seq_length must be >= 5 (got {self.max_seq_length}): "
                             "[CLS] A [SEP] B [SEP] needs 2 text tokens at least")
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq must be >= 1 "
                             f"(got {self.max_predictions_per_seq})")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1] (got {self.masked_lm_prob})")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob must be in [0, 1] (got {self.short_seq_prob})")
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor must be >= 1 (got {self.dupe_factor})")
        if self.max_sequences_per_pack < 0:
            raise ValueError(f"max_sequences_per_pack must be >= 1 with --pack "
                             f"(got {self.max_sequences_per_pack})")


@dataclasses.dataclass(frozen=True)
class VocabInfo:
    """What masking needs from the tokenizer (picklable, small)."""
    vocab_size: int
    pad_id: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray  # <bool>[vocab_size]: piece continues the previous word

    @classmethod
    def from_tokenizer(cls, tok) -> "VocabInfo":
        return cls(tok.vocab_size, tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id,
                   tok.is_continuation)


# A chunk's documents: flat token ids, and per document (start, [sentence end offsets]).
Docs = list[tuple[int, list[int]]]


def _randint(rng: random.Random, lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi] (inclusive, like random.randint, with less overhead)."""
    return lo + int(rng.random() * (hi - lo + 1))


def truncation_amounts(la: int, lb: int, max_num_tokens: int) -> tuple[int, int]:
    """Tokens the original removes from A and B: it always trims the longer one (B on ties)
    until la + lb <= max_num_tokens. Returns (removed_from_a, removed_from_b)."""
    excess = la + lb - max_num_tokens
    if excess <= 0:
        return 0, 0
    diff = la - lb
    ra = min(excess, diff) if diff > 0 else 0
    rb = min(excess, -diff) if diff < 0 else 0
    rest = excess - ra - rb  # now equal lengths: B, A, B, A, ... so B gets the odd one
    return ra + rest // 2, rb + (rest + 1) // 2


def nsp_instances(docs: Docs, cfg: InstanceConfig, rng: random.Random) -> list[tuple]:
    """Instance specs `(a_start, a_len, b_start, b_len, is_random_next)` for all dupe passes.

    Offsets index the chunk's flat token array. Python loop per instance (not per token).
    """
    out = []
    append = out.append
    rnd = rng.random  # bound once: this loop runs per instance (_randint inlined below)
    bits = rng.getrandbits
    bisect_left = bisect.bisect_left
    max_num = cfg.max_seq_length - 3
    short = cfg.short_seq_prob
    n_docs = len(docs)
    for _ in range(cfg.dupe_factor):
        for d in range(n_docs):
            start, cum = docs[d]
            n = len(cum)
            # One target per document and pass, as the original (not per instance).
            target = max_num
            if rnd() < short:
                target = 2 + int(rnd() * (max_num - 1))
            cs = 0  # first sentence of the current chunk of sentences
            while cs < n:
                base = cum[cs - 1] if cs else start
                j = bisect_left(cum, base + target, cs)  # first j with length >= target
                if j >= n:
                    j = n - 1
                n_chunk = j - cs + 1
                a_end = 1 + int(rnd() * (n_chunk - 1)) if n_chunk >= 2 else 1
                a_lo, a_hi = base, cum[cs + a_end - 1]
                if n_chunk == 1 or rnd() < 0.5:
                    is_random = 1
                    target_b = target - (a_hi - a_lo)
                    r = d
                    for _ in range(10):  # the original's ten tries for another document
                        r = int(rnd() * n_docs)
                        if r != d:
                            break
                    rstart, rcum = docs[r]
                    rs = int(rnd() * len(rcum))
                    b_lo = rcum[rs - 1] if rs else rstart
                    k = bisect_left(rcum, b_lo + target_b, rs)
                    b_hi = rcum[k] if k < len(rcum) else rcum[-1]
                    cs += a_end  # the unused sentences go back for the next instance
                else:
                    is_random = 0
                    b_lo, b_hi = a_hi, cum[j]
                    cs = j + 1
                la, lb = a_hi - a_lo, b_hi - b_lo
                if la + lb > max_num:
                    ra, rb = truncation_amounts(la, lb, max_num)
                    if ra:  # each removal from the front with probability 1/2
                        a_lo += bits(ra).bit_count()
                    if rb:
                        b_lo += bits(rb).bit_count()
                    la -= ra
                    lb -= rb
                append((a_lo, la, b_lo, lb, is_random))
    return out


def packed_instances(stream_len: int, bounds: list[int], cfg: InstanceConfig,
                     rng: random.Random, sep_positions: set) -> list[tuple]:
    """--no_nsp: specs `(start, len, 0, 0, 0)` of whole sentences packed into the stream.

    bounds: sorted sentence end offsets in the stream (document [SEP]s included).
    """
    out = []
    max_num = cfg.max_seq_length - 2
    for _ in range(cfg.dupe_factor):
        pos = 0
        while pos < stream_len:
            if pos in sep_positions:  # never start with a document separator
                pos += 1
                continue
            target = max_num
            if rng.random() < cfg.short_seq_prob:
                target = _randint(rng, 2, max_num)
            k = bisect.bisect_right(bounds, pos + target) - 1
            end = bounds[k] if k >= 0 and bounds[k] > pos else min(pos + target, stream_len)
            out.append((pos, end - pos, 0, 0, 0))
            pos = end
    return out


def spec_lengths(spec: np.ndarray) -> np.ndarray:
    """Tokens of each instance of <int64>[n, 5] specs, as assemble lays them out:
    [CLS] A [SEP] (B [SEP]). <int64>[n]."""
    spec = np.asarray(spec, np.int64).reshape(-1, 5)
    la, lb = spec[:, 1], spec[:, 3]
    return la + 2 + np.where(lb > 0, lb + 1, 0)


def assemble(src: np.ndarray, spec: np.ndarray, cfg: InstanceConfig, vi: VocabInfo,
             rng: np.random.Generator, src_has_special: bool = True) -> dict[str, np.ndarray]:
    """Token matrices for a batch of specs, masked. spec: <int64>[n, 5].

    src_has_special: whether src holds [CLS]/[SEP] ids at all (a --no_nsp stream does; text
    tokenized by WordPiece never does); False skips checking every token for them.

    Returns input_ids <int32>[n, max_seq_length], input_mask/segment_ids <uint8>[n, S],
    masked_lm_positions/masked_lm_ids <int32>[n, max_predictions_per_seq],
    masked_lm_weights <float32>[n, max_predictions_per_seq], next_sentence_labels <int32>[n],
    and `decision` <int8>[n, max_predictions_per_seq] (0 [MASK], 1 kept, 2 random, -1 pad).
    """
    n, S, P = len(spec), cfg.max_seq_length, cfg.max_predictions_per_seq
    # int32 throughout: half the memory traffic of int64 on these [n, S] matrices.
    spec32 = spec.astype(np.int32)
    a_lo, la, b_lo, lb, nsp = (spec32[:, i:i + 1] for i in range(5))
    j = np.arange(S, dtype=np.int32)[None, :]
    has_b = lb > 0
    length = la + 2 + np.where(has_b, lb + 1, 0)  # [n, 1]: [CLS] A [SEP] (B [SEP])
    b0 = la + 2
    # Position j holds A[j - 1] for 1 <= j <= la, B[j - b0] for b0 <= j < length - 1.
    text = (j >= 1) & (j < length - 1) & (j != la + 1)
    idx = j + np.where(j <= la, a_lo - 1, b_lo - b0)
    idx *= text  # padding and specials read src[0], overwritten next
    ids = src[idx]
    ids[~text] = vi.pad_id
    rows = np.arange(n)
    ids[:, 0] = vi.cls_id
    ids[rows, la[:, 0] + 1] = vi.sep_id
    ids[rows, length[:, 0] - 1] = vi.sep_id
    input_mask = j < length
    segment_ids = (j >= b0) & input_mask & has_b

    # Candidates: every text token but [CLS]/[SEP] ids (the original compares strings; a
    # document [SEP] inside a --no_nsp instance is not a candidate either).
    cand = text
    if src_has_special:
        cand = text & (ids != vi.sep_id) & (ids != vi.cls_id)
    n_cand = cand.sum(1)
    # round() half-to-even on length * prob, as Python's round in the original.
    n_pred = np.minimum(P, np.maximum(1, np.rint(length[:, 0] * cfg.masked_lm_prob)))
    n_pred = np.minimum(n_pred, n_cand).astype(np.int64)

    if cfg.do_whole_word_mask:
        chosen = _whole_word_choice(ids, cand, n_pred, P, vi, rng)
    elif not src_has_special:
        # Candidates are exactly the text positions: choose among their indices.
        chosen = _uniform_text_positions(la[:, 0], (la + lb)[:, 0], n_pred, P, S, rng)
    else:
        keys = rng.random((n, S), dtype=np.float32)
        np.putmask(keys, ~cand, 2.0)  # never chosen before a candidate
        k = min(P, S)
        part = np.argpartition(keys, k - 1, axis=1)[:, :k] if k < S else np.argsort(keys, 1)
        order = np.take_along_axis(keys, part, 1).argsort(1)
        chosen = np.take_along_axis(part, order, 1)[:, :P]  # first n_pred = a uniform subset
        chosen = np.where(np.arange(chosen.shape[1])[None] < n_pred[:, None], chosen, S)
        if chosen.shape[1] < P:
            chosen = np.pad(chosen, ((0, 0), (0, P - chosen.shape[1])), constant_values=S)
    positions = np.sort(chosen, axis=1)
    valid = positions < S
    positions = np.where(valid, positions, 0)
    labels = np.where(valid, np.take_along_axis(ids, positions, 1), 0)

    u = rng.random((n, P))
    rand_ids = rng.integers(0, vi.vocab_size, (n, P))
    decision = np.where(u < 0.8, 0, np.where(u < 0.9, 1, 2)).astype(np.int8)
    new = np.where(decision == 0, vi.mask_id, np.where(decision == 1, labels, rand_ids))
    r, c = np.nonzero(valid)
    ids[r, positions[r, c]] = new[r, c]
    decision[~valid] = -1
    return {  # int32/uint8 suffice for the values; written as int64 features
        "input_ids": ids,
        "input_mask": input_mask.view(np.uint8),
        "segment_ids": segment_ids.view(np.uint8),
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": labels.astype(np.int32),
        "masked_lm_weights": valid.astype(np.float32),
        "next_sentence_labels": nsp[:, 0].astype(np.int32),
        "decision": decision,
        "n_candidates": n_cand,
    }


def _uniform_text_positions(la, n_text, n_pred, P: int, S: int, rng) -> np.ndarray:
    """n_pred distinct positions per row, uniform among the row's n_text text positions
    (1..la, then la+2.. past A's [SEP]): the first n_pred steps of a Fisher-Yates shuffle
    of the text indices, vectorized over rows. <int64>[n, P], padded with S."""
    n = len(la)
    perm = np.broadcast_to(np.arange(S, dtype=np.int32), (n, S)).copy()
    u = rng.random((n, P))
    for t in range(min(P, S)):
        live = np.flatnonzero(n_pred > t)
        if not len(live):
            break
        # swap index t with one drawn uniformly from t..n_text-1
        j = t + (u[live, t] * (n_text[live] - t)).astype(np.int64)
        a, b = perm[live, t].copy(), perm[live, j]
        perm[live, t] = b
        perm[live, j] = a
    k = min(P, S)
    idx = perm[:, :k].astype(np.int64)
    pos = idx + 1 + (idx >= la[:, None])
    chosen = np.where(np.arange(k)[None] < n_pred[:, None], pos, S)
    if k < P:
        chosen = np.pad(chosen, ((0, 0), (0, P - k)), constant_values=S)
    return chosen


def _whole_word_choice(ids, cand, n_pred, P: int, vi: VocabInfo, rng) -> np.ndarray:
    """Positions of whole words, greedily in random word order, skipping a word that would
    overflow n_pred (as the original). <int64>[n, P], padded with max_seq_length."""
    n, S = ids.shape
    prev_cand = np.zeros_like(cand)
    prev_cand[:, 1:] = cand[:, :-1]
    # A word starts at a non-continuation piece, or right after [CLS]/[SEP] (a word cut by
    # truncation starts its own group instead of joining the word before the [SEP]).
    start = cand & (~vi.is_continuation[ids] | ~prev_cand)
    word = np.cumsum(start, axis=1) - 1  # word index per position (valid where cand)
    n_words = start.sum(1)
    wkeys = rng.random((n, int(n_words.max()) if n else 0))
    out = np.full((n, P), S, dtype=np.int64)
    for i in range(n):
        pos = np.flatnonzero(cand[i])
        if not len(pos):
            continue
        w = word[i, pos]
        sizes = np.bincount(w, minlength=n_words[i])
        order = np.argsort(wkeys[i, :n_words[i]]).tolist()
        budget, taken, picked = int(n_pred[i]), 0, []
        size_l = sizes.tolist()
        for g in order:
            if taken >= budget:
                break
            if taken + size_l[g] > budget:
                continue
            picked.append(g)
            taken += size_l[g]
        sel = pos[np.isin(w, picked)]
        out[i, :len(sel)] = sel
    return out
