"""The original BERT pre-training feature format (google-research/bert
create_pretraining_data.py): names, dtypes and lengths, and the packed-row format of
`data_prep --pack` (several sequences per row). data_prep (writer), the input pipeline
(reader) and the data doctor (checks) all use these definitions."""

from __future__ import annotations

from typing import Mapping, Sequence

from bert_jax.errors import UserError


class DataCheckError(UserError, ValueError):
    """Pre-training input the run cannot use: records that do not match the config, empty
    files, raw text (data.text_files) without any."""


def files_named(files: Sequence[str], shown: int = 3) -> str:
    """"a, b, c and 7 more": a list of files for a one-line message."""
    names = ", ".join(files[:shown])
    return names + (f" and {len(files) - shown} more" if len(files) > shown else "")


# name -> (dtype in the tf.train.Example, length key)
PRETRAIN_FEATURES = {
    "input_ids": ("int64", "max_seq_length"),
    "input_mask": ("int64", "max_seq_length"),
    "segment_ids": ("int64", "max_seq_length"),
    "masked_lm_positions": ("int64", "max_predictions_per_seq"),
    "masked_lm_ids": ("int64", "max_predictions_per_seq"),
    "masked_lm_weights": ("float", "max_predictions_per_seq"),
    "next_sentence_labels": ("int64", None),  # length 1
}

# Packed rows (data_prep --pack): up to K = max_sequences_per_pack sequences
# `[CLS] A [SEP] B [SEP]` back to back in one row of max_seq_length, then padding.
#   input_ids, input_mask, segment_ids   as unpacked (segment_ids: token types, 0 on A)
#   sequence_ids     k + 1 on the tokens of the row's k-th sequence, 0 on padding
#   position_ids     position within its own sequence (0 at every [CLS]); 0 on padding
#   masked_lm_*      every prediction of the row's sequences, positions in the row,
#                    sorted; predictions_per_pack(P, K) slots, unused ones weigh 0
#   next_sentence_positions / _labels / _weights: per sequence slot k < K, its [CLS]
#                    position, its label (0 IsNext) and 1.0; empty slots 0, 0, 0.0
# The model takes them as they are (bert_jax.train.step.PACKED_INPUTS).
PACKED_FEATURES = {
    "input_ids": ("int64", "max_seq_length"),
    "input_mask": ("int64", "max_seq_length"),
    "segment_ids": ("int64", "max_seq_length"),
    "sequence_ids": ("int64", "max_seq_length"),
    "position_ids": ("int64", "max_seq_length"),
    "masked_lm_positions": ("int64", "max_predictions_per_pack"),
    "masked_lm_ids": ("int64", "max_predictions_per_pack"),
    "masked_lm_weights": ("float", "max_predictions_per_pack"),
    "next_sentence_positions": ("int64", "max_sequences_per_pack"),
    "next_sentence_labels": ("int64", "max_sequences_per_pack"),
    "next_sentence_weights": ("float", "max_sequences_per_pack"),
}

# Label of the original tool: 0 = B is the true continuation (IsNext), 1 = random B.
IS_NEXT, IS_RANDOM = 0, 1

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def predictions_per_pack(max_predictions_per_seq: int, max_sequences_per_pack: int) -> int:
    """MLM slots of a packed row: P + K, at most K * P.

    A sequence of L tokens gets min(P, max(1, round(L * masked_lm_prob))) <= L * prob + 1
    predictions, so the K sequences of a row of S tokens get at most S * prob + K: within
    P + K whenever P >= S * prob (the paper's 20 at 128 and 80 at 512 for prob 0.15; 23
    and 83 slots with K = 3). A row that would need more is never written: data_prep
    moves its last sequence to a row of its own (and counts it)."""
    p, k = int(max_predictions_per_seq), int(max_sequences_per_pack)
    return min(k * p, p + k)


def predictions_per_seq_of_pack(slots: int, max_sequences_per_pack: int) -> int:
    """The P that predictions_per_pack(P, K) turns into `slots` (the doctor infers it)."""
    k = int(max_sequences_per_pack)
    if k <= 1:
        return int(slots)
    return 1 if slots == k else int(slots) - k


def feature_table(max_sequences_per_pack: int = 0) -> Mapping[str, tuple]:
    """PRETRAIN_FEATURES (0: one sequence per row) or PACKED_FEATURES (K >= 1)."""
    return PACKED_FEATURES if max_sequences_per_pack else PRETRAIN_FEATURES


def feature_lengths(max_seq_length: int, max_predictions_per_seq: int,
                    max_sequences_per_pack: int = 0) -> dict[str, int]:
    """Values per feature: of unpacked rows (max_sequences_per_pack=0), or of rows packed
    with up to max_sequences_per_pack sequences."""
    k = int(max_sequences_per_pack)
    sizes = {"max_seq_length": max_seq_length, "max_predictions_per_seq": max_predictions_per_seq,
             "max_predictions_per_pack": predictions_per_pack(max_predictions_per_seq, k or 1),
             "max_sequences_per_pack": k}
    return {name: (sizes[key] if key else 1) for name, (_, key) in feature_table(k).items()}


def packing_of(names_and_lengths: Mapping[str, int]) -> int:
    """The layout of one record or batch, from its feature names -> value counts: 0 for
    unpacked rows, else K = max_sequences_per_pack (the length of next_sentence_weights)."""
    if "sequence_ids" not in names_and_lengths:
        return 0
    return int(names_and_lengths.get("next_sentence_weights",
                                     names_and_lengths.get("next_sentence_labels", 1)))


def describe_packing(max_sequences_per_pack: int) -> str:
    k = int(max_sequences_per_pack)
    return (f"packed rows (data_prep --pack, up to {k} sequences per row)" if k
            else "unpacked rows (one sequence per row)")
