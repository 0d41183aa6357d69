"""Shared helpers for tests/data_prep: run the tool in-process, read its output back with
TensorFlow's own parser (an implementation independent of our serializer)."""

from __future__ import annotations

import pathlib
import random

import numpy as np

from bert_jax.data.features import feature_lengths, feature_table
from data_prep import instances as inst
from data_prep import pipeline

REPO = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = sorted(str(p) for p in (REPO / "data_prep" / "sample_corpus").glob("*.txt"))
VOCAB = str(REPO / "data_prep" / "bert_uncased_vocab.txt")
GOLDENS = REPO / "tests" / "data_prep" / "goldens"


def run_tool(inputs, outputs, *, seed=12345, num_workers=1, chunk_chars=1_000_000,
             vocab=VOCAB, spm=None, lower=True, **cfg_kw) -> pipeline.Stats:
    cfg = inst.InstanceConfig(**{"dupe_factor": 1, **cfg_kw})
    cfg.validate()
    spec = pipeline.WorkerSpec(None if spm else vocab, spm, lower, cfg, seed)
    return pipeline.run([str(p) for p in inputs], [str(p) for p in outputs], spec,
                        num_workers=num_workers, chunk_chars=chunk_chars, progress=False)


def read_examples(paths, max_seq_length: int, max_predictions_per_seq: int,
                  max_sequences_per_pack: int = 0) -> dict:
    """All records of the files, parsed by tf.io.parse_example: name -> <[n, length]>
    (packed rows with max_sequences_per_pack > 0)."""
    import tensorflow as tf

    lengths = feature_lengths(max_seq_length, max_predictions_per_seq, max_sequences_per_pack)
    spec = {name: tf.io.FixedLenFeature([lengths[name]],
                                        tf.float32 if dt == "float" else tf.int64)
            for name, (dt, _) in feature_table(max_sequences_per_pack).items()}
    out = {k: [] for k in spec}
    for path in paths:
        ds = tf.data.TFRecordDataset(str(path)).batch(4096)
        for batch in ds:
            parsed = tf.io.parse_example(batch, spec)
            for k in spec:
                out[k].append(parsed[k].numpy())
    return {k: (np.concatenate(v) if v else np.zeros((0, lengths[k]))) for k, v in out.items()}


def unpack_rows(rows: dict, max_predictions_per_seq: int) -> dict:
    """Packed rows -> the unpacked examples they hold (each sequence alone in a row of the
    same length, its predictions in slots of its own), in row order, then slot order.
    Written from the documented layout (bert_jax/data/features.py) with plain loops,
    independently of data_prep/packing.py."""
    n, S = rows["input_ids"].shape
    P = max_predictions_per_seq
    out = {k: [] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                           "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")}
    for r in range(n):
        for k in range(rows["next_sentence_weights"].shape[1]):
            if rows["next_sentence_weights"][r, k] == 0:
                continue
            start = int(rows["next_sentence_positions"][r, k])
            length = int((rows["sequence_ids"][r] == k + 1).sum())
            cut = slice(start, start + length)
            for name in ("input_ids", "input_mask", "segment_ids"):
                row = np.zeros(S, np.int64)
                row[:length] = rows[name][r, cut]
                out[name].append(row)
            mine = (rows["masked_lm_weights"][r] > 0) & (
                rows["masked_lm_positions"][r] >= start) & (
                rows["masked_lm_positions"][r] < start + length)
            pos, ids, w = (np.zeros(P, np.int64), np.zeros(P, np.int64), np.zeros(P, np.float32))
            m = int(mine.sum())
            pos[:m] = rows["masked_lm_positions"][r][mine] - start
            ids[:m] = rows["masked_lm_ids"][r][mine]
            w[:m] = 1.0
            out["masked_lm_positions"].append(pos)
            out["masked_lm_ids"].append(ids)
            out["masked_lm_weights"].append(w)
            out["next_sentence_labels"].append([rows["next_sentence_labels"][r, k]])
    return {k: np.array(v) for k, v in out.items()}


def restore(ex: dict) -> np.ndarray:
    """input_ids with the masked positions given back their original ids."""
    ids = ex["input_ids"].copy()
    r, c = np.nonzero(ex["masked_lm_weights"] > 0)
    ids[r, ex["masked_lm_positions"][r, c]] = ex["masked_lm_ids"][r, c]
    return ids


def check_invariants(ex: dict, *, cls_id: int, sep_id: int, max_seq_length: int,
                     max_predictions_per_seq: int, masked_lm_prob: float = 0.15,
                     no_nsp: bool = False, whole_word: bool = False) -> None:
    """Every structural invariant of the original format, asserted for every record."""
    n = len(ex["input_ids"])
    if n == 0:
        return
    S, P = max_seq_length, max_predictions_per_seq
    mask = ex["input_mask"]
    L = mask.sum(1)
    j = np.arange(S)[None, :]
    np.testing.assert_array_equal(mask, (j < L[:, None]).astype(mask.dtype))  # a prefix
    assert (L >= (3 if no_nsp else 5)).all() and (L <= S).all()
    ids = restore(ex)
    assert (ids[:, 0] == cls_id).all()
    assert (ids[np.arange(n), L - 1] == sep_id).all()
    assert (ex["input_ids"][j >= L[:, None]] == 0).all()
    assert (ids[:, 1:] != cls_id).all()
    seps = (ids == sep_id) & (mask > 0)
    seg = ex["segment_ids"]
    if no_nsp:
        assert (seg == 0).all() and (ex["next_sentence_labels"] == 0).all()
    else:
        assert (seps.sum(1) == 2).all(), "[CLS] A [SEP] B [SEP]: exactly two [SEP]"
        first_sep = seps.argmax(1)
        assert (first_sep >= 2).all() and (first_sep <= L - 3).all()  # A and B non-empty
        want = (j > first_sep[:, None]) & (j < L[:, None])
        np.testing.assert_array_equal(seg, want.astype(seg.dtype))
        assert set(np.unique(ex["next_sentence_labels"])) <= {0, 1}
    w = ex["masked_lm_weights"]
    k = (w > 0).sum(1)
    np.testing.assert_array_equal(w, (np.arange(P)[None] < k[:, None]).astype(w.dtype))
    pos, lab = ex["masked_lm_positions"], ex["masked_lm_ids"]
    valid = w > 0
    assert (pos[~valid] == 0).all() and (lab[~valid] == 0).all()
    assert ((pos >= 1) & (pos < L[:, None]))[valid].all()
    assert (np.diff(np.where(valid, pos, S + np.arange(P)), axis=1) > 0).all()  # increasing
    rows = np.nonzero(valid)[0]
    assert (lab[valid] == ids[rows, pos[valid]]).all()
    assert (lab[valid] != cls_id).all() and (lab[valid] != sep_id).all()  # never specials
    n_cand = ((ids != cls_id) & (ids != sep_id) & (mask > 0)).sum(1)
    n_pred = np.minimum(np.minimum(P, np.maximum(1, np.rint(L * masked_lm_prob))), n_cand)
    if whole_word:
        # A word longer than the budget is skipped, as in the original: may mask nothing.
        assert (k <= n_pred).all()
    else:
        np.testing.assert_array_equal(k, n_pred)


def passages(n: int, words: int = 300) -> list[str]:
    """`n` disjoint `words`-word passages of the sample corpus's Britannica article."""
    text = (REPO / "data_prep" / "sample_corpus" / "britannica.txt").read_text()
    w = text.split()
    assert len(w) >= n * words
    return [" ".join(w[i * words:(i + 1) * words]) for i in range(n)]


def mixed_corpus(seed: int = 0) -> list[str]:
    """Unrelated passages, overlapping windows (clusters near the threshold), few-word
    edits, exact copies (some recased or re-spaced) and short texts, shuffled."""
    rng = random.Random(seed)
    w = (REPO / "data_prep" / "sample_corpus" / "britannica.txt").read_text().split()
    docs = passages(30, 100) + [" ".join(w[i:i + 200]) for i in range(3000, 9000, 25)]
    for _ in range(150):
        e = rng.choice(docs).split()
        for _ in range(rng.randint(1, 6)):
            e[rng.randrange(len(e))] = rng.choice(["the", "zyzzyva", "x"])
        docs.append(" ".join(e))
    docs += [rng.choice(docs) for _ in range(60)]
    docs += [rng.choice(docs).upper().replace(" ", "  ") for _ in range(20)]
    docs += ["", "two words", "Two  WORDS", "three words here"]
    rng.shuffle(docs)
    return docs
