"""Checks of pre-training records against the config, naming the file and the values.

The most common silent failure in BERT pre-training is data written with other lengths or
another vocabulary than the model's config. `check_files` reads the first records of each
file (cheap: a few records per file, files read in parallel) and `check_batch` checks a
parsed batch; both raise `DataCheckError` listing every problem as
`<file> record <i>: <feature>: expected ..., found ...`.
"""

from __future__ import annotations

import collections
import concurrent.futures
from typing import Mapping, Sequence

import numpy as np

from bert_jax.data import features as features_lib
from bert_jax.errors import UserError

MAX_LINES = 20


class DataCheckError(UserError, ValueError):
    """Pre-training input the run cannot use: records that do not match the config, empty
    files, raw text (data.text_files) without any."""


def group(problems: Sequence[tuple[str, str]]) -> list[str]:
    """[(where, problem)] -> lines "<where>: <problem>", one per distinct problem (the first
    place it occurs), with "(and N more records)" when it repeats."""
    first: dict[str, str] = {}
    counts: collections.Counter = collections.Counter()
    for where, problem in problems:
        first.setdefault(problem, where)
        counts[problem] += 1
    return [f"{first[p]}: {p}" + (f" (and {counts[p] - 1} more records)" if counts[p] > 1
                                  else "") for p in first]


def _raise(problems: list[str], what: str):
    """One line: what, then every problem (at most MAX_LINES), then what to run."""
    if problems:
        shown = problems[:MAX_LINES]
        more = len(problems) - len(shown)
        raise DataCheckError(
            f"{what}: {len(problems)} problem(s): " + "; ".join(shown)
            + (f"; ... and {more} more" if more else "")
            + ". Run `python -m bert_jax.data.inspect --input=<glob>` for a full report.")


def files_named(files: Sequence[str], shown: int = 3) -> str:
    """"a, b, c and 7 more": a list of files for a one-line message."""
    names = ", ".join(files[:shown])
    return names + (f" and {len(files) - shown} more" if len(files) > shown else "")


def unk_counts(decoded: Sequence[Mapping[str, tuple[str, np.ndarray]]],
               vocab: Mapping[str, int]) -> tuple[int, int]:
    """([UNK] pieces, all pieces) over the real tokens of decoded records (decode_example),
    masked positions counted by their original id (masked_lm_ids), the special tokens
    ([PAD] [CLS] [SEP] [MASK]) left out. vocab: pretrain.vocab_info(cfg, with_unk=True)."""
    unk_id = vocab["unk_id"]
    special_ids = [vocab[k] for k in ("pad_id", "cls_id", "sep_id", "mask_id")]
    unk = total = 0
    for record in decoded:
        if "input_ids" not in record:
            continue
        ids = np.array(record["input_ids"][1], np.int64)
        mask = record.get("input_mask", (None, np.ones_like(ids)))[1]
        if len(mask) != len(ids):
            continue
        pos, labels, weights = (record.get(n, (None, np.zeros(0)))[1] for n in (
            "masked_lm_positions", "masked_lm_ids", "masked_lm_weights"))
        if len(pos) == len(labels) == len(weights):
            keep = (weights > 0) & (pos >= 0) & (pos < len(ids))
            ids[pos[keep].astype(np.int64)] = labels[keep]
        real = (mask > 0) & ~np.isin(ids, list(special_ids))
        unk += int((ids[real] == unk_id).sum())
        total += int(real.sum())
    return unk, total


def decode_example(serialized: bytes) -> dict[str, tuple[str, np.ndarray]]:
    """A serialized tf.train.Example -> {feature: (kind, values)}; kind in int64/float/bytes."""
    import tensorflow as tf
    example = tf.train.Example.FromString(serialized)
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "int64_list":
            out[name] = ("int64", np.asarray(feature.int64_list.value, np.int64))
        elif kind == "float_list":
            out[name] = ("float", np.asarray(feature.float_list.value, np.float32))
        elif kind == "bytes_list":
            out[name] = ("bytes", np.asarray(feature.bytes_list.value, object))
        else:
            out[name] = ("empty", np.zeros(0))
    return out


def _value_problems(values: Mapping[str, np.ndarray], *, max_seq_length: int,
                    vocab_size: int | None) -> list[str]:
    """Range checks shared by records and batches; values keyed by feature name."""
    problems = []

    def bad(name, lo, hi, what):
        v = values.get(name)
        if v is None or v.size == 0:
            return
        if v.min() < lo or v.max() >= hi:
            problems.append(f"{name}: expected values in [{lo}, {hi}) ({what}), found "
                            f"min {v.min()}, max {v.max()}")

    if vocab_size:
        bad("input_ids", 0, vocab_size, f"vocab_size={vocab_size}")
        bad("masked_lm_ids", 0, vocab_size, f"vocab_size={vocab_size}")
    else:
        bad("input_ids", 0, np.iinfo(np.int32).max, "non-negative")
    bad("input_mask", 0, 2, "0/1")
    bad("segment_ids", 0, 2, "type_vocab_size=2")
    bad("masked_lm_positions", 0, max_seq_length, f"max_seq_length={max_seq_length}")
    bad("next_sentence_labels", 0, 2, "0 IsNext / 1 random")
    return problems


def check_record(decoded: Mapping[str, tuple[str, np.ndarray]], *, max_seq_length: int,
                 max_predictions_per_seq: int, vocab_size: int | None = None) -> list[str]:
    """Problems of one decoded record (see decode_example); empty list if it is fine."""
    lengths = features_lib.feature_lengths(max_seq_length, max_predictions_per_seq)
    problems = []
    missing = [n for n in features_lib.PRETRAIN_FEATURES if n not in decoded]
    if missing:
        problems.append(f"missing feature(s) {missing}; found {sorted(decoded)}")
    for name, (kind, key) in features_lib.PRETRAIN_FEATURES.items():
        if name not in decoded:
            continue
        found_kind, values = decoded[name]
        if found_kind != kind:
            problems.append(f"{name}: expected {kind} values, found {found_kind}")
        if values.shape[0] != lengths[name]:
            problems.append(f"{name}: expected {lengths[name]} values ({key or 'one label'}"
                            f"{'=' + str(lengths[name]) if key else ''}), found "
                            f"{values.shape[0]}")
    values = {n: v for n, (k, v) in decoded.items() if k in ("int64", "float")}
    problems += _value_problems(values, max_seq_length=max_seq_length, vocab_size=vocab_size)
    return problems


def first_records(files: Sequence[str], records_per_file: int, threads: int = 16):
    """[(file, [serialized records], error or None)] reading the head of each file."""
    import tensorflow as tf

    def head(path):
        records = []
        try:
            for r in tf.data.TFRecordDataset(path).take(records_per_file):
                records.append(r.numpy())
            return path, records, None
        except tf.errors.OpError as e:
            from bert_jax.data.shards import short_error
            return path, records, short_error(e)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(head, files))


def first_bad_record(path: str, *, max_seq_length: int, max_predictions_per_seq: int,
                     block: int = 1024) -> tuple[str, str] | None:
    """Parses EVERY record of a file as the training pipeline does (tf.io.parse_example
    with the config's lengths): None if all parse, else ("record <i>", problem) for the
    first one that does not (a missing feature, another length). Read errors are left to
    shards.scan_file."""
    import tensorflow as tf

    from bert_jax.data import tfrecord
    spec = tfrecord.parse_spec(max_seq_length, max_predictions_per_seq)
    start = 0
    try:
        for batch in tf.data.TFRecordDataset(path).batch(block):
            try:
                tf.io.parse_example(batch, spec)
            except tf.errors.InvalidArgumentError as e:
                for i, raw in enumerate(batch.numpy()):
                    try:
                        found = check_record(decode_example(raw), max_seq_length=max_seq_length,
                                             max_predictions_per_seq=max_predictions_per_seq)
                    except Exception as bad:  # not a tf.train.Example
                        found = [f"not a tf.train.Example ({bad})"]
                    if found:
                        return f"record {start + i}", found[0]
                from bert_jax.data.shards import short_error
                return f"records {start}-{start + len(batch) - 1}", short_error(e)
            start += int(batch.shape[0])
    except tf.errors.DataLossError:
        return None
    return None


def check_files(files: Sequence[str], *, max_seq_length: int, max_predictions_per_seq: int,
                vocab_size: int | None = None, records_per_file: int = 2,
                skip_unreadable: bool = False, vocab: Mapping[str, int] | None = None,
                vocab_name: str = "") -> str | None:
    """Raises DataCheckError if the first records of any file disagree with the config.

    vocab (pretrain.vocab_info(cfg, with_unk=True)): also measures the share of [UNK]
    among the sampled tokens: VocabError above tokenization.UNK_ERROR, returned as a
    warning from UNK_WARN on (else None). vocab_name names the vocabulary in it."""
    problems, decoded_all = [], []
    for path, records, error in first_records(files, records_per_file):
        if error and not skip_unreadable:
            problems.append((path, f"unreadable TFRecord file: {error}"))
        if not records and not error:
            problems.append((path, "empty file (no records), expected TFRecords of "
                                   "create_pretraining_data.py"))
        for i, record in enumerate(records):
            try:
                decoded = decode_example(record)
            except Exception as e:  # a record that is not a tf.train.Example
                problems.append((f"{path} record {i}", f"not a tf.train.Example ({e})"))
                continue
            decoded_all.append(decoded)
            for p in check_record(decoded, max_seq_length=max_seq_length,
                                  max_predictions_per_seq=max_predictions_per_seq,
                                  vocab_size=vocab_size):
                problems.append((f"{path} record {i}", p))
    _raise(group(problems), f"input files do not match the config (max_seq_length={max_seq_length}, "
                     f"max_predictions_per_seq={max_predictions_per_seq}, "
                     f"vocab_size={vocab_size})")
    if vocab is None or vocab.get("unk_id") is None:
        return None
    from bert_jax.data.tokenization import check_unk_rate
    unk, total = unk_counts(decoded_all, vocab)
    return check_unk_rate(unk, total, f"{files_named(list(files))} (the first "
                                      f"{len(decoded_all)} records)", vocab_name)


def check_batch(batch: Mapping[str, np.ndarray], *, max_seq_length: int,
                max_predictions_per_seq: int, vocab_size: int | None = None,
                source: str = "batch") -> None:
    """Checks names, shapes, dtypes and id ranges of a host batch (numpy, as the iterators
    yield); `source` (e.g. the file glob) is named in the error."""
    problems = []
    lengths = features_lib.feature_lengths(max_seq_length, max_predictions_per_seq)
    names = list(features_lib.PRETRAIN_FEATURES) + ["example_weights"]
    missing = [n for n in names if n not in batch]
    if missing:
        problems.append(f"missing feature(s) {missing}; found {sorted(batch)}")
    rows = {np.shape(v)[0] for v in batch.values() if np.ndim(v)}
    if len(rows) > 1:
        problems.append(f"features disagree on the batch size: {sorted(rows)}")
    for name in names:
        if name not in batch:
            continue
        v = np.asarray(batch[name])
        if name in ("next_sentence_labels", "example_weights"):
            if v.ndim not in (1, 2) or (v.ndim == 2 and v.shape[1] != 1):
                problems.append(f"{name}: expected shape [batch] or [batch, 1], found "
                                f"{list(v.shape)}")
        elif v.ndim != 2 or v.shape[1] != lengths[name]:
            problems.append(f"{name}: expected shape [batch, {lengths[name]}], found "
                            f"{list(v.shape)}")
        want = np.floating if name in ("masked_lm_weights", "example_weights") else np.integer
        if not np.issubdtype(v.dtype, want):
            problems.append(f"{name}: expected {want.__name__} dtype, found {v.dtype}")
    problems += _value_problems({k: np.asarray(v) for k, v in batch.items()},
                                max_seq_length=max_seq_length, vocab_size=vocab_size)
    _raise(problems, f"{source}: batch does not match the config (max_seq_length="
                     f"{max_seq_length}, max_predictions_per_seq={max_predictions_per_seq}, "
                     f"vocab_size={vocab_size})")
