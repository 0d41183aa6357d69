"""The packed-512 case's rows: text the model never trains on, cut and packed as the real
pipeline cuts and packs it, so that a step carries the sequence lengths a packed run sees.

The held-out documents of data_prep's sample corpus (1 document in HELD_OUT_EVERY, as
bert_jax.tasks.pretraining.data holds them out for evaluation) are made into masked pairs by
data_prep in this process, as `create_pretraining_data.py --pack --max_sequences_per_pack=K`
would write them (dupe factor SAMPLE_DUPE_FACTOR, short_seq_prob 0.1, masked at 0.15 with
`preds` predictions per sequence at most, SPFHP packing, features.PACKED_FEATURES). No
TensorFlow, no file written but one temporary text file.

heldout_rows(seq, preds, k) -> {feature: <int32|float32>[rows, ...]};
batches(rows, batch) -> the case's host batches; stats(batch) -> its real work.
"""

from __future__ import annotations

import glob
import os
import tempfile

HELD_OUT_SEED = 54321  # the random seed the pre-training task builds its held-out set with


def heldout_documents() -> list[str]:
    """The sample corpus' held-out documents, each its lines joined (one sentence per line)."""
    from bert_jax.tasks.pretraining.data import held_out, text_documents
    from data_prep import SAMPLE_CORPUS

    docs, _ = text_documents(sorted(glob.glob(os.path.join(SAMPLE_CORPUS, "*.txt"))))
    return held_out(docs)[1]


def heldout_rows(seq: int, preds: int, k: int) -> dict:
    """Every packed row data_prep makes of the held-out documents at length `seq` with
    `preds` predictions per sequence at most and up to `k` sequences per row: int32 /
    float32 arrays of PACKED_FEATURES (masked_lm_* have preds + k slots) plus
    example_weights (ones). k=0: the same sequences unpacked, one per row (the lengths are
    drawn before packing, so both hold the same multiset of sequence lengths)."""
    import numpy as np

    from bert_jax.tasks.pretraining.data import SAMPLE_DUPE_FACTOR
    from data_prep import SAMPLE_VOCAB, instances, pipeline

    cfg = instances.InstanceConfig(max_seq_length=seq, max_predictions_per_seq=preds,
                                   dupe_factor=SAMPLE_DUPE_FACTOR, max_sequences_per_pack=k)
    spec = pipeline.WorkerSpec(SAMPLE_VOCAB, None, True, cfg, HELD_OUT_SEED)
    with tempfile.TemporaryDirectory(prefix="gpu_suite_heldout_") as tmp:
        path = os.path.join(tmp, "heldout.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(heldout_documents()))  # a blank line between documents
        parts = list(pipeline.iter_rows([path], spec))
    names = [n for n in parts[0] if n not in ("decision", "n_candidates")]
    rows = {n: np.concatenate([p[n] for p in parts]) for n in names}
    rows = {n: v.astype(np.float32 if v.dtype.kind == "f" else np.int32)
            for n, v in rows.items()}
    rows["example_weights"] = np.ones(len(rows["input_ids"]), np.float32)
    return rows


def batches(rows: dict, batch: int, count: int = 2) -> list:
    """`count` batches of `batch` rows, taken in order from the rows (cycled when there
    are fewer than count x batch)."""
    import numpy as np

    n = len(rows["input_ids"])
    take = np.arange(count * batch) % n
    return [{name: v[take[i * batch:(i + 1) * batch]] for name, v in rows.items()}
            for i in range(count)]


def stats(batch: dict) -> dict:
    """A host batch's real work (bert_jax.train.metrics.input_stats): input/tokens,
    input/sequences, input/square_lengths and input/predictions as floats."""
    from bert_jax.train import metrics

    return {name: float(v) for name, v in metrics.input_stats(batch).items()}
