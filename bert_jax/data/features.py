"""The original BERT pre-training feature format (google-research/bert
create_pretraining_data.py): names, dtypes and lengths. Both data_prep (writer) and the
input pipeline (reader) use this one definition."""

from __future__ import annotations

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

# Label of the original tool: 0 = B is the true continuation (IsNext), 1 = random B.
IS_NEXT, IS_RANDOM = 0, 1

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def feature_lengths(max_seq_length: int, max_predictions_per_seq: int) -> dict[str, int]:
    sizes = {"max_seq_length": max_seq_length, "max_predictions_per_seq": max_predictions_per_seq}
    return {name: (sizes[key] if key else 1) for name, (_, key) in PRETRAIN_FEATURES.items()}
