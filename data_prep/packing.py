"""`--pack`: several masked sequences per row, so that rows carry little padding.

Which sequences share a row is decided from the histogram of sequence lengths by SPFHP,
"shortest-pack-first histogram packing" (Krell et al., "Efficient Sequence Packing without
Cross-contamination", arXiv 2107.02027, section 4.1), written anew here. Lengths are
taken longest first; each one goes into the open pack with the most room left that still
fits it (the shortest pack), or opens a new pack; a pack closes when it is full or holds
K sequences. It works on the histogram (counts per length), not on single sequences, so it
costs O(max_seq_length^2) per chunk however many sequences there are, and it needs no
solver. Chosen over NNLSHP (the paper's other algorithm: a non-negative least-squares fit
over every combination of up to K lengths) because that one's strategies grow as
max_seq_length^K (millions at 512 and K = 3) for a gain of under 0.1 point of efficiency
at K = 3 in the paper's Wikipedia figures; SPFHP reaches 1.996x of the 2.0013x limit there.

Packing runs per chunk of the corpus (data_prep/pipeline.py), after the chunk's instances
are sampled and before they are masked, so memory stays bounded and the output is the same
for any number of workers. The feature layout of a packed row is documented in
bert_jax/data/features.py (PACKED_FEATURES).
"""

from __future__ import annotations

import collections

import numpy as np

def spfhp(histogram, max_length: int, max_per_pack: int) -> list[tuple[int, tuple[int, ...]]]:
    """Packing strategies for a histogram of sequence lengths.

    histogram: <int>[max_length + 1], histogram[L] = number of sequences of L tokens.
    Returns [(count, lengths)]: `count` packs each holding one sequence of each of
    `lengths` (longest first); sum(lengths) <= max_length and len(lengths) <= max_per_pack.
    Every sequence of the histogram is in exactly one pack.
    """
    histogram = np.asarray(histogram, np.int64)
    if len(histogram) > max_length + 1 and histogram[max_length + 1:].any():
        raise ValueError(f"sequences longer than max_length={max_length}")
    open_packs: dict[int, list] = collections.defaultdict(list)  # room left -> [(count, lengths)]
    done: list[tuple[int, tuple[int, ...]]] = []

    def add(count, lengths, room):
        if len(lengths) >= max_per_pack or room == 0:
            done.append((count, lengths))
        else:
            open_packs[room].append((count, lengths))

    for length in range(min(max_length, len(histogram) - 1), 0, -1):
        todo = int(histogram[length])
        room = max_length - 1  # the most room an open pack can have left
        while todo > 0:
            while room >= length and not open_packs.get(room):
                room -= 1
            if room < length:  # fits in no open pack: `todo` new packs of this one length
                add(todo, (length,), max_length - length)
                break
            count, lengths = open_packs[room].pop()
            take = min(count, todo)
            if count > take:  # the rest of these packs stay open, as they were
                open_packs[room].append((count - take, lengths))
            todo -= take
            add(take, lengths + (length,), room - length)
    for room in sorted(open_packs, reverse=True):
        done += open_packs[room]
    return [(c, lengths) for c, lengths in done if c > 0]


def max_predictions(lengths, max_predictions_per_seq: int, masked_lm_prob: float) -> np.ndarray:
    """The most MLM predictions instances.assemble draws for sequences of `lengths` tokens:
    min(P, max(1, round(L * prob))) (fewer if there are fewer candidates)."""
    n = np.rint(np.asarray(lengths, np.float64) * masked_lm_prob)
    return np.minimum(max_predictions_per_seq, np.maximum(1, n)).astype(np.int64)


def assign(lengths, max_length: int, max_per_pack: int, rng: np.random.Generator,
           predictions=None, slots: int | None = None) -> tuple[list[np.ndarray], int]:
    """Sequences -> packs. lengths: <int>[n] tokens per sequence (in a shuffled order:
    sequences of one length fill packs in that order).

    predictions <int>[n] / slots: a pack whose sequences could draw more than `slots`
    predictions gives up its last sequences to packs of their own, so that no prediction
    is ever dropped (never happens when P >= max_length * masked_lm_prob: see
    features.predictions_per_pack).
    Returns (packs, moved): the packs in random order, each <int64>[members] the indices of
    its sequences (longest first), and how many sequences were moved for the slots.
    """
    lengths = np.asarray(lengths, np.int64)
    if not len(lengths):
        return [], 0
    histogram = np.bincount(lengths, minlength=max_length + 1)
    by_length = {int(n): list(np.flatnonzero(lengths == n)[::-1]) for n in np.unique(lengths)}
    packs = []
    for count, pack_lengths in spfhp(histogram, max_length, max_per_pack):
        for _ in range(count):
            packs.append([by_length[n].pop() for n in pack_lengths])
    moved = 0
    if slots is not None:
        predictions = np.asarray(predictions, np.int64)
        extra = []
        for pack in packs:
            while len(pack) > 1 and int(predictions[pack].sum()) > slots:
                extra.append([pack.pop()])
                moved += 1
        packs += extra
    order = rng.permutation(len(packs))
    return [np.asarray(packs[i], np.int64) for i in order], moved


def pack_rows(inst: dict, sizes, max_per_pack: int, slots: int) -> dict:
    """Packed rows of masked instances.

    inst: instances.assemble's arrays of m instances, the members of each row consecutive
    (sizes[0] instances for row 0, then sizes[1] for row 1, ...): input_ids / input_mask /
    segment_ids [m, S], masked_lm_* [m, P] (real predictions first), next_sentence_labels
    [m]. sizes: <int>[rows], each in 1..max_per_pack; slots: MLM slots per row.
    Returns PACKED_FEATURES arrays (bert_jax/data/features.py): [rows, S], [rows, slots]
    and [rows, max_per_pack].
    """
    sizes = np.asarray(sizes, np.int64)
    n_rows, k, S = len(sizes), max_per_pack, inst["input_ids"].shape[1]
    row = np.repeat(np.arange(n_rows), sizes)                     # [m] row of each instance
    slot = np.arange(len(row)) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # [m] place in it
    length = inst["input_mask"].astype(np.int64).sum(1)
    offset = _start_in_row(length, row, sizes)                    # [m] first token in the row
    pred = (inst["masked_lm_weights"] > 0)
    n_pred = pred.sum(1)
    pred_offset = _start_in_row(n_pred, row, sizes)
    if n_rows and np.bincount(row, weights=n_pred, minlength=n_rows).max() > slots:
        raise ValueError(f"a packed row has more than {slots} predictions")  # assign() prevents

    j = np.arange(S)[None, :]
    real = j < length[:, None]
    r, col = np.broadcast_to(row[:, None], real.shape)[real], (offset[:, None] + j)[real]
    out = {}
    for name, value in (("input_ids", inst["input_ids"]), ("input_mask", inst["input_mask"]),
                        ("segment_ids", inst["segment_ids"]),
                        ("sequence_ids", np.broadcast_to(slot[:, None] + 1, real.shape)),
                        ("position_ids", np.broadcast_to(j, real.shape))):
        out[name] = np.zeros((n_rows, S), np.int32)
        out[name][r, col] = value[real]
    pr = np.broadcast_to(row[:, None], pred.shape)[pred]
    pc = (pred_offset[:, None] + np.arange(pred.shape[1])[None, :])[pred]
    for name, value, dtype in (
            ("masked_lm_positions", inst["masked_lm_positions"] + offset[:, None], np.int32),
            ("masked_lm_ids", inst["masked_lm_ids"], np.int32),
            ("masked_lm_weights", inst["masked_lm_weights"], np.float32)):
        out[name] = np.zeros((n_rows, slots), dtype)
        out[name][pr, pc] = value[pred]
    for name, value, dtype in (("next_sentence_positions", offset, np.int32),
                               ("next_sentence_labels", inst["next_sentence_labels"], np.int32),
                               ("next_sentence_weights", np.ones(len(row)), np.float32)):
        out[name] = np.zeros((n_rows, k), dtype)
        out[name][row, slot] = value
    return out


def _start_in_row(counts, row, sizes) -> np.ndarray:
    """Exclusive running sum of `counts` restarting at every row (members consecutive)."""
    before = np.cumsum(counts) - counts
    first = np.repeat(np.cumsum(sizes) - sizes, sizes)
    return before - before[first] if len(before) else before
