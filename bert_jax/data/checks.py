"""Checks of pre-training records against the config, naming the file and the values.

The most common silent failure in BERT pre-training is data written with other lengths or
another vocabulary than the model's config. `check_files` reads the first records of each
file (cheap: a few records per file, files read in parallel) and `check_batch` checks a
parsed batch; both raise `DataCheckError` listing every problem as
`<file> record <i>: <feature>: expected ..., found ...`.

Packed rows (data_prep --pack, features.PACKED_FEATURES) are recognised by their features;
`packed_problems` checks what holds them together: sequences back to back from position
0, positions restarting at every sequence, a [CLS] at each next_sentence_position, the
NSP weights of the sequences present, predictions on real tokens. A set of files is all
packed or all unpacked: a file of the other kind is named.
"""

from __future__ import annotations

import collections
import concurrent.futures
from typing import Mapping, Sequence

import numpy as np

from bert_jax.data import features as features_lib
from bert_jax.data.features import DataCheckError, files_named
from bert_jax.tokenization import check_unk_rate

MAX_LINES = 20


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


def unk_counts(decoded: Sequence[Mapping[str, tuple[str, np.ndarray]]],
               vocab: Mapping[str, int]) -> tuple[int, int]:
    """([UNK] pieces, all pieces) over the real tokens of decoded records (decode_example),
    masked positions counted by their original id (masked_lm_ids), the special tokens
    ([PAD] [CLS] [SEP] [MASK]) left out. vocab: tokenization.vocab_info(cfg, with_unk=True)."""
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


def value_counts(decoded: Mapping[str, tuple[str, np.ndarray]]) -> dict[str, int]:
    """{feature: number of values} of a decoded record (decode_example)."""
    return {name: len(values) for name, (_, values) in decoded.items()}


def files_packing(files: Sequence[str]) -> int:
    """The layout of a set of files, from the first record of the first file that has one:
    0 = unpacked rows, K = packed rows of up to K sequences (data_prep --pack)."""
    for path in files:
        for _, records, _ in first_records([path], 1, threads=1):
            for raw in records:
                try:
                    return features_lib.packing_of(value_counts(decode_example(raw)))
                except Exception:  # noqa: BLE001  (not an Example: the checks name it)
                    return 0
    return 0


def packed_problems(values: Mapping[str, np.ndarray], cls_id: int | None = None) -> list[str]:
    """What breaks the packed-row layout of one record (features.PACKED_FEATURES): values
    keyed by feature name, each <[length]>. cls_id: also check the [CLS] at each
    sequence's first position."""
    need = ("input_mask", "sequence_ids", "position_ids", "next_sentence_positions",
            "next_sentence_weights", "masked_lm_positions", "masked_lm_weights")
    if any(n not in values for n in need):
        return []  # missing features are named by check_record
    sid = np.asarray(values["sequence_ids"], np.int64)
    k = len(values["next_sentence_weights"])
    problems = []
    if sid.size and (sid.min() < 0 or sid.max() > k):
        return [f"sequence_ids: expected values in [0, {k}] (0 padding, 1..{k} the row's "
                f"sequences), found min {sid.min()}, max {sid.max()}"]
    real = sid > 0
    n_real = int(real.sum())
    if not (real[:n_real].all() and not real[n_real:].any()):
        at = int(np.flatnonzero(real != (np.arange(len(sid)) < n_real))[0])
        return [f"sequence_ids: padding (0) at position {at} before a sequence; expected the "
                f"sequences back to back from position 0, then padding"]
    steps = np.diff(sid[:n_real])
    if n_real and (sid[0] != 1 or ((steps != 0) & (steps != 1)).any()):
        return [f"sequence_ids: expected runs numbered 1, 2, ... in order, found "
                f"{_runs(sid[:n_real])}"]
    index = np.arange(len(sid))
    first = np.zeros(len(sid), bool)  # the first token of each sequence
    first[:n_real] = np.diff(np.concatenate([[0], sid[:n_real]])) != 0
    starts = np.flatnonzero(first)
    n_seq = len(starts)
    mask = np.asarray(values["input_mask"])
    if (mask != real).any():
        at = int(np.flatnonzero(mask != real)[0])
        problems.append(f"input_mask: expected 1 exactly on the sequences' tokens "
                        f"(sequence_ids > 0), found {mask[at]} at position {at}")
    want_pos = np.where(real, index - np.maximum.accumulate(np.where(first, index, 0)), 0)
    pos = np.asarray(values["position_ids"])
    if (pos != want_pos).any():
        at = int(np.flatnonzero(pos != want_pos)[0])
        problems.append(f"position_ids: expected 0, 1, ... restarting at every sequence (0 on "
                        f"padding), found {pos[at]} at position {at} (expected {want_pos[at]})")
    w = np.asarray(values["next_sentence_weights"])
    want_w = (np.arange(k) < n_seq).astype(w.dtype)
    if (w != want_w).any():
        problems.append(f"next_sentence_weights: expected 1.0 for each of the row's {n_seq} "
                        f"sequence(s), then 0.0, found {w.tolist()}")
    nsp_pos = np.asarray(values["next_sentence_positions"])
    want_nsp = np.zeros(k, np.int64)
    want_nsp[:min(n_seq, k)] = starts[:k]
    if (nsp_pos != want_nsp).any():
        problems.append(f"next_sentence_positions: expected each sequence's first position "
                        f"{want_nsp.tolist()}, found {nsp_pos.tolist()}")
    if cls_id is not None and "input_ids" in values and n_seq:
        ids = np.asarray(values["input_ids"])[starts]
        if (ids != cls_id).any():
            problems.append(f"input_ids: expected [CLS] (id {cls_id}) at each sequence's first "
                            f"position {starts.tolist()}, found {ids.tolist()}")
    if "segment_ids" in values and n_seq and (np.asarray(values["segment_ids"])[starts] != 0).any():
        problems.append(f"segment_ids: expected 0 (segment A) at each sequence's first "
                        f"position {starts.tolist()}")
    mw = np.asarray(values["masked_lm_weights"])
    mp = np.asarray(values["masked_lm_positions"], np.int64)
    live = mw > 0
    if live.sum() and not live[:int(live.sum())].all():
        problems.append("masked_lm_weights: expected the real predictions (1.0) first, then "
                        "0.0 slots")
    on = mp[live]
    bad = on[(on < 0) | (on >= len(sid))]
    bad = bad if len(bad) else on[~real[on] | np.isin(on, starts)]
    if len(bad):
        problems.append(f"masked_lm_positions: a prediction at position {int(bad[0])}, outside "
                        f"the row's sequences or on a sequence's [CLS]")
    return problems


def layout_problem(pack: int, first_pack: int, first_where: str, what: str) -> str:
    """A record of layout `pack` among files whose first record (first_where) has
    `first_pack` (features.packing_of)."""
    return (f"{features_lib.describe_packing(pack)}, but {first_where} holds "
            f"{features_lib.describe_packing(first_pack)}: the files of {what} must be all "
            f"packed or all unpacked (the same data_prep --pack and --max_sequences_per_pack); "
            f"rebuild or leave out one kind")


def _runs(ids: np.ndarray) -> str:
    """[1 1 2 2 2 1] -> "1 x2, 2 x3, 1 x1"."""
    edges = np.flatnonzero(np.diff(ids)) + 1
    parts = np.split(ids, edges)
    return ", ".join(f"{int(p[0])} x{len(p)}" for p in parts[:8]) + (", ..." if len(parts) > 8
                                                                      else "")


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
                 max_predictions_per_seq: int, vocab_size: int | None = None,
                 max_sequences_per_pack: int | None = None,
                 cls_id: int | None = None) -> list[str]:
    """Problems of one decoded record (see decode_example); empty list if it is fine.
    max_sequences_per_pack: the layout expected (0 unpacked, K packed); None: the record's
    own (features.packing_of). Packed records also get packed_problems (cls_id: [CLS]s)."""
    if max_sequences_per_pack is None:
        max_sequences_per_pack = features_lib.packing_of(value_counts(decoded))
    table = features_lib.feature_table(max_sequences_per_pack)
    lengths = features_lib.feature_lengths(max_seq_length, max_predictions_per_seq,
                                           max_sequences_per_pack)
    problems = []
    missing = [n for n in table if n not in decoded]
    if missing:
        problems.append(f"missing feature(s) {missing}; found {sorted(decoded)}")
    for name, (kind, key) in table.items():
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
    if max_sequences_per_pack and not problems:
        problems += packed_problems(values, cls_id)
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
            from bert_jax.data.shards import short_error  # TensorFlow, loaded here anyway
            return path, records, short_error(e)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(head, files))


def first_bad_record(path: str, *, max_seq_length: int, max_predictions_per_seq: int,
                     block: int = 1024, max_sequences_per_pack: int = 0
                     ) -> tuple[str, str] | None:
    """Parses EVERY record of a file as the training pipeline does (tf.io.parse_example
    with the config's lengths): None if all parse, else ("record <i>", problem) for the
    first one that does not (a missing feature, another length). Read errors are left to
    shards.scan_file."""
    import tensorflow as tf

    from bert_jax.data import tfrecord  # TensorFlow, as this function: only when it runs
    spec = tfrecord.parse_spec(max_seq_length, max_predictions_per_seq, max_sequences_per_pack)
    start = 0
    try:
        for batch in tf.data.TFRecordDataset(path).batch(block):
            try:
                tf.io.parse_example(batch, spec)
            except tf.errors.InvalidArgumentError as e:
                for i, raw in enumerate(batch.numpy()):
                    try:
                        found = check_record(decode_example(raw), max_seq_length=max_seq_length,
                                             max_predictions_per_seq=max_predictions_per_seq,
                                             max_sequences_per_pack=max_sequences_per_pack)
                    except Exception as bad:  # not a tf.train.Example
                        found = [f"not a tf.train.Example ({bad})"]
                    if found:
                        return f"record {start + i}", found[0]
                from bert_jax.data.shards import short_error  # TensorFlow: loaded here anyway
                return f"records {start}-{start + len(batch) - 1}", short_error(e)
            start += int(batch.shape[0])
    except tf.errors.DataLossError:
        return None
    return None


def check_files(files: Sequence[str], *, max_seq_length: int, max_predictions_per_seq: int,
                vocab_size: int | None = None, records_per_file: int = 2,
                skip_unreadable: bool = False, vocab: Mapping[str, int] | None = None,
                vocab_name: str = "", what: str = "input files") -> str | None:
    """Raises DataCheckError if the first records of any file disagree with the config,
    or with the layout (packed or not, features.packing_of) of the first record read.

    vocab (tokenization.vocab_info(cfg, with_unk=True)): also measures the share of [UNK]
    among the sampled tokens: VocabError above tokenization.UNK_ERROR, returned as a
    warning from UNK_WARN on (else None). vocab_name names the vocabulary in it; `what`
    names the set of files (e.g. data.train_files) in a layout mismatch."""
    problems, decoded_all = [], []
    layout = None  # (K, where) of the first record read
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
            pack = features_lib.packing_of(value_counts(decoded))
            layout = layout or (pack, f"{path} record {i}")
            if pack != layout[0]:
                problems.append((f"{path} record {i}", layout_problem(pack, *layout, what)))
                continue
            for p in check_record(decoded, max_seq_length=max_seq_length,
                                  max_predictions_per_seq=max_predictions_per_seq,
                                  vocab_size=vocab_size, max_sequences_per_pack=pack,
                                  cls_id=vocab.get("cls_id") if vocab else None):
                problems.append((f"{path} record {i}", p))
    _raise(group(problems), f"input files do not match the config (max_seq_length={max_seq_length}, "
                     f"max_predictions_per_seq={max_predictions_per_seq}, "
                     f"vocab_size={vocab_size})")
    if vocab is None or vocab.get("unk_id") is None:
        return None
    unk, total = unk_counts(decoded_all, vocab)
    return check_unk_rate(unk, total, f"{files_named(list(files))} (the first "
                                      f"{len(decoded_all)} records)", vocab_name)


def check_batch(batch: Mapping[str, np.ndarray], *, max_seq_length: int,
                max_predictions_per_seq: int, vocab_size: int | None = None,
                source: str = "batch") -> None:
    """Checks names, shapes, dtypes and id ranges of a host batch (numpy, as the iterators
    yield; packed rows too); `source` (e.g. the file glob) is named in the error."""
    problems = []
    pack = features_lib.packing_of({k: np.shape(v)[-1] for k, v in batch.items()
                                    if np.ndim(v) == 2})
    lengths = features_lib.feature_lengths(max_seq_length, max_predictions_per_seq, pack)
    names = list(features_lib.feature_table(pack)) + ["example_weights"]
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
        if name == "example_weights" or (name == "next_sentence_labels" and not pack):
            if v.ndim not in (1, 2) or (v.ndim == 2 and v.shape[1] != 1):
                problems.append(f"{name}: expected shape [batch] or [batch, 1], found "
                                f"{list(v.shape)}")
        elif v.ndim != 2 or v.shape[1] != lengths[name]:
            problems.append(f"{name}: expected shape [batch, {lengths[name]}], found "
                            f"{list(v.shape)}")
        want = (np.floating if name in ("masked_lm_weights", "next_sentence_weights",
                                        "example_weights") else np.integer)
        if not np.issubdtype(v.dtype, want):
            problems.append(f"{name}: expected {want.__name__} dtype, found {v.dtype}")
    problems += _value_problems({k: np.asarray(v) for k, v in batch.items()},
                                max_seq_length=max_seq_length, vocab_size=vocab_size)
    _raise(problems, f"{source}: batch does not match the config (max_seq_length="
                     f"{max_seq_length}, max_predictions_per_seq={max_predictions_per_seq}, "
                     f"vocab_size={vocab_size})")
