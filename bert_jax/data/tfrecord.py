"""tf.data over pre-tokenized TFRecords in the original BERT format (see features.py).

Use it through `bert_jax.data.pretrain` (train_iterator / eval_iterator); this module holds
the pipeline itself. Training pipeline, per host:

    sorted files -> this host's share -> shuffle file order (seeded, new order every epoch)
      -> repeat -> parallel interleave of TFRecordDatasets (deterministic order)
      -> window shuffle of serialized records: windows of ~shuffle_buffer records, each
         permuted by one seeded op and cut into host batches (drop_remainder)
      -> enumerate -> parse_example on the whole batch (+ dynamic masking, stateless seeds)
      -> prefetch(AUTOTUNE) -> numpy

Packed files (data_prep --pack, several sequences per row) are parsed with their own
features (features.PACKED_FEATURES); `pretrain` tells the pipeline which layout the files
have (max_sequences_per_pack, 0 = unpacked), from their first record.

Why this order: shuffling and batching the small serialized strings before parsing keeps the
shuffle cheap and lets `parse_example` and the masking run vectorized on whole batches (no
per-example Python or per-example graph functions). A per-record `Dataset.shuffle` costs
a large share of the throughput (benchmarks/RESULTS.md); the window shuffle costs one
permutation per window.

Resume exactness. Every stage that runs in parallel keeps its output order (`deterministic=
True`), and all randomness is seeded (shuffles) or stateless (masking keyed by the batch
index), so the stream of batches is a pure function of (files, config, host). The iterator
state is tf.data's own checkpoint of the iterator (explicit checkpointing: it stores the
read offsets, the partial shuffle window of serialized records and the batches already
prefetched),
serialized in memory with SerializeIterator. Restore is immediate and exact; the cost is the
size of the shuffle window (up to about 2 x shuffle_buffer x 0.8 KB at length 128 and
x 2.9 KB at length 512, per host). tf.data's "symbolic" checkpointing would be smaller but refuses any
transformation that reorders elements (shuffle), so it does not apply. The state also
carries the number of batches produced: if the serialized state cannot be restored (a
different TF version or pipeline code), the iterator falls back to rebuilding the pipeline
and skipping that many batches *before parsing* (exact as well, but it re-reads the data).

Unordered interleave (`deterministic=False`) is used only for evaluation, where each record
is seen once and order does not matter.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from typing import Any, Iterator, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_dataset_ops

from bert_jax.data import features as features_lib
from bert_jax.data import masking
from bert_jax.data.features import DataCheckError, files_named
from bert_jax.data import state as state_lib
from bert_jax.tokenization import vocab_info
from bert_jax.data.shards import (CorruptShardError, InputReadError, count_records,
                                  find_corrupt, short_error)

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
STATE_VERSION = 1
# ExternalStatePolicy.FAIL: refuse to checkpoint a pipeline with hidden state.
_FAIL = 2


# ---------------------------------------------------------------- parsing and masking


def parse_spec(max_seq_length: int, max_predictions_per_seq: int,
               max_sequences_per_pack: int = 0) -> dict:
    """tf.io.parse_example's features: of unpacked rows, or (max_sequences_per_pack = K
    > 0) of packed rows (features.PACKED_FEATURES)."""
    lengths = features_lib.feature_lengths(max_seq_length, max_predictions_per_seq,
                                           max_sequences_per_pack)
    return {name: tf.io.FixedLenFeature([lengths[name]],
                                        tf.int64 if kind == "int64" else tf.float32)
            for name, (kind, _) in features_lib.feature_table(max_sequences_per_pack).items()}


def parse_batch(serialized, max_seq_length: int, max_predictions_per_seq: int,
                max_sequences_per_pack: int = 0):
    """<string>[batch] serialized Examples -> dict of int32 / float32 [batch, ...] tensors.

    next_sentence_labels comes out as <int32>[batch] (packed rows: [batch, K], with
    next_sentence_weights <float32>[batch, K]); example_weights <float32>[batch] = 1.
    """
    parsed = tf.io.parse_example(serialized, parse_spec(max_seq_length,
                                                        max_predictions_per_seq,
                                                        max_sequences_per_pack))
    out = {k: (tf.cast(v, tf.int32) if v.dtype == tf.int64 else v) for k, v in parsed.items()}
    if not max_sequences_per_pack:
        out["next_sentence_labels"] = out["next_sentence_labels"][:, 0]
    out["example_weights"] = tf.ones(tf.shape(serialized)[:1], tf.float32)
    return out


def mask_params(cfg) -> dict[str, Any]:
    return dict(max_predictions_per_seq=cfg.max_predictions_per_seq,
                masked_lm_prob=cfg.masked_lm_prob, **vocab_info(cfg))


# ---------------------------------------------------------------- datasets


def _signature(cfg, files, process_index, process_count, local_batch,
               max_sequences_per_pack: int = 0) -> dict[str, Any]:
    digest = hashlib.sha256("\n".join(files).encode()).hexdigest()[:16]
    out = dict(files=digest, num_files=len(files), process_index=process_index,
               process_count=process_count, local_batch=local_batch,
               max_seq_length=cfg.max_seq_length,
               max_predictions_per_seq=cfg.max_predictions_per_seq, seed=cfg.seed,
               shuffle=cfg.shuffle, shuffle_buffer=cfg.shuffle_buffer,
               dynamic_masking=cfg.dynamic_masking)
    if max_sequences_per_pack:  # only then: the states saved before packing existed match
        out["max_sequences_per_pack"] = max_sequences_per_pack
    return out


def _read_parallelism(cfg, files: Sequence[str]) -> dict[str, Any]:
    """Interleave threads. Same record order either way (deterministic): only cost differs.

    On local files the pipeline's own thread reads with the least CPU per example
    (benchmarks/RESULTS.md); remote files (gs://...) need parallel reads to hide latency.
    """
    threads = cfg.read_threads
    if threads == -1:
        threads = -2 if any("://" in f for f in files) else 0
    if threads == 0:
        return {}
    return dict(num_parallel_calls=AUTOTUNE if threads < 0 else threads, deterministic=True)


def train_dataset(cfg, files: Sequence[str], *, process_index: int, process_count: int,
                  record_level: bool, local_batch: int, start_batch: int = 0,
                  max_sequences_per_pack: int = 0) -> tf.data.Dataset:
    """The endless training dataset of this host (see the module docstring).

    files: this host's files (all files when record_level). Elements: dict of
    input_ids / input_mask / segment_ids <int32>[local_batch, max_seq_length],
    masked_lm_positions / masked_lm_ids <int32>[local_batch, P],
    masked_lm_weights <float32>[local_batch, P], next_sentence_labels <int32>[local_batch],
    example_weights <float32>[local_batch] (all ones). Packed files
    (max_sequences_per_pack = K > 0): parse_batch's packed features, P = P + K slots.
    """
    # Host-specific seeds: hosts read different files anyway; this keeps their record
    # shuffles and masks independent too. Record-level sharding needs the SAME file order
    # on every host, so its file seed is host-independent.
    file_seed = cfg.seed if record_level else cfg.seed * 1_000_003 + process_index
    ds = tf.data.Dataset.from_tensor_slices(list(files))
    if cfg.shuffle:
        ds = ds.shuffle(len(files), seed=file_seed, reshuffle_each_iteration=True)
    ds = ds.repeat()
    cycle = max(1, min(cfg.num_parallel_reads, len(files)))
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, buffer_size=cfg.read_buffer_bytes),
                       cycle_length=cycle, block_length=cfg.interleave_block,
                       **_read_parallelism(cfg, files))
    if record_level:
        ds = ds.shard(process_count, process_index)
    if cfg.shuffle and cfg.shuffle_buffer > local_batch:
        # Window shuffle: permute each window of `window` consecutive records with one
        # vectorized op (seeded by the window index) and cut it into batches. Same mixing
        # scale as a shuffle buffer of that size, but no per-record shuffle step, which was
        # the most expensive stage of the pipeline (about half the throughput at length 128).
        per_window = math.ceil(cfg.shuffle_buffer / local_batch)
        window = per_window * local_batch
        window_seed = tf.constant([cfg.seed, 1_000_003 + process_index], tf.int64)

        def permute(index, records):
            seed = tf.random.experimental.stateless_fold_in(window_seed, index)
            records = tf.random.experimental.stateless_shuffle(records, seed)
            return tf.reshape(records, [per_window, local_batch])

        ds = ds.batch(window, drop_remainder=True).enumerate()
        ds = ds.map(permute, num_parallel_calls=AUTOTUNE, deterministic=True).unbatch()
    else:
        ds = ds.batch(local_batch, drop_remainder=True)
    ds = ds.enumerate()
    if start_batch:
        ds = ds.skip(start_batch)  # fallback resume: skipped before any parsing

    seq, preds, pack = cfg.max_seq_length, cfg.max_predictions_per_seq, max_sequences_per_pack
    if cfg.dynamic_masking:
        params = mask_params(cfg)
        base_seed = tf.constant([cfg.seed, process_index], tf.int64)

        def parse(index, serialized):
            batch = parse_batch(serialized, seq, preds)
            seed = tf.random.experimental.stateless_fold_in(base_seed, index)
            return masking.remask(batch, seed, **params)
    else:
        def parse(index, serialized):
            del index
            return parse_batch(serialized, seq, preds, pack)

    ds = ds.map(parse, num_parallel_calls=AUTOTUNE, deterministic=True)
    ds = ds.prefetch(AUTOTUNE)
    options = _options(cfg)
    options.deterministic = True
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.FAIL
    return ds.with_options(options)


def _options(cfg) -> tf.data.Options:
    """tf.data's autotuning model only if data.autotune. Its thread sleeps for an
    optimization period that doubles up to 60 s, and destroying the iterator waits out the
    current period (TF 2.21; gdb: the main thread in ~RootDataset::Iterator, the model
    thread in Model::OptimizeLoop's timed wait), so a run lingered 4-60 s after its last
    line, an evaluation after its last batch. Without it, AUTOTUNE values keep tf.data's
    untuned starting points: min(16, cores) parallel calls for map and interleave, and
    prefetch's own buffer tuning (not the model's). benchmarks/input_pipeline.py measures
    both side by side; tests/data/test_iterator_teardown.py the linger."""
    options = tf.data.Options()
    options.autotune.enabled = bool(cfg.autotune)
    return options


def _pad_batch(batch, local_batch: int):
    """Pads a short final batch with all-zero filler rows (example_weights 0)."""
    n = tf.shape(batch["input_ids"])[0]
    out = {}
    for k, v in batch.items():
        pad = [[0, local_batch - n]] + [[0, 0]] * (len(v.shape) - 1)
        v = tf.pad(v, pad)
        out[k] = tf.ensure_shape(v, [local_batch] + list(v.shape[1:]))
    return out


def eval_dataset(cfg, files: Sequence[str], *, process_index: int, process_count: int,
                 local_batch: int, max_sequences_per_pack: int = 0
                 ) -> tuple[tf.data.Dataset, int, int]:
    """Every eval record of this host exactly once, then filler: (dataset, batches, records).

    All hosts get the same number of batches (collectives need it): the counts of every
    host's share are computed from the record counts of all eval files, and hosts with
    fewer records get extra all-filler batches. Filler rows are all zeros with
    example_weights 0 (masked_lm_weights 0 too).
    """
    counts = count_records(files)
    record_level = len(files) < process_count
    if record_level:
        total = sum(counts.values())
        per_host = [len(range(h, total, process_count)) for h in range(process_count)]
        mine = list(files)
    else:
        per_host = [sum(counts[f] for f in files[h::process_count])
                    for h in range(process_count)]
        mine = list(files[process_index::process_count])
    if sum(per_host) == 0:
        raise ValueError(f"evaluation files hold no records: {files[:3]}...")
    num_batches = max(math.ceil(n / local_batch) for n in per_host)
    num_records = per_host[process_index]

    ds = tf.data.Dataset.from_tensor_slices(mine if mine else [""])
    if not mine:
        ds = ds.take(0)
    # Order does not matter for evaluation, unless records are dealt out by position.
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, buffer_size=cfg.read_buffer_bytes),
                       cycle_length=max(1, min(cfg.num_parallel_reads, len(mine) or 1)),
                       num_parallel_calls=AUTOTUNE, deterministic=record_level)
    if record_level:
        ds = ds.shard(process_count, process_index)
    seq, preds, pack = cfg.max_seq_length, cfg.max_predictions_per_seq, max_sequences_per_pack
    ds = ds.batch(local_batch).map(
        lambda s: _pad_batch(parse_batch(s, seq, preds, pack), local_batch),
        num_parallel_calls=AUTOTUNE, deterministic=False)
    real_batches = math.ceil(num_records / local_batch)
    if num_batches > real_batches:
        filler = tf.data.Dataset.from_tensors(
            tf.constant([], tf.string)).map(
                lambda s: _pad_batch(parse_batch(s, seq, preds, pack), local_batch))
        ds = ds.concatenate(filler.repeat(num_batches - real_batches))
    return ds.prefetch(AUTOTUNE).with_options(_options(cfg)), num_batches, num_records


# ---------------------------------------------------------------- iterators


def input_error(error: tf.errors.OpError, files: Sequence[str], cfg,
                max_sequences_per_pack: int = 0):
    """TF's error while reading a pipeline over `files` -> the one-line error to raise:
    CorruptShardError naming the corrupt file(s) and byte offset (DataLossError),
    DataCheckError naming the files and the lengths expected (InvalidArgumentError: a record
    that does not parse), else InputReadError (a file gone or unreadable: TF's message
    names it)."""
    if not isinstance(error, (tf.errors.DataLossError, tf.errors.InvalidArgumentError)):
        return InputReadError(f"cannot read the input files ({files_named(list(files))}): "
                              f"{short_error(error)}")
    if isinstance(error, tf.errors.DataLossError):
        bad = find_corrupt(files, error)
        names = "; ".join(f"{f}: {msg}, after {n} good records" for f, n, msg in bad)
        fix = ("the same command leaves it out (data.skip_corrupt=True scans the files "
               "when it starts)" if cfg.skip_corrupt else
               "set --config.data.skip_corrupt=True to leave corrupt shards out")
        return CorruptShardError(f"corrupt or truncated input shard "
                                 f"{names or short_error(error)}. Re-create it, or {fix}.")
    packed = (f" of {features_lib.describe_packing(max_sequences_per_pack)}"
              if max_sequences_per_pack else "")
    return DataCheckError(
        f"cannot parse the records of {files_named(list(files))} as BERT pre-training "
        f"features{packed} with max_seq_length={cfg.max_seq_length}, max_predictions_per_seq="
        f"{cfg.max_predictions_per_seq}: {short_error(error)}. Run `python -m "
        f"bert_jax.data.inspect --verify --input=...` on the files to find the record.")



def _to_numpy(batch) -> dict[str, np.ndarray]:
    # `_numpy()` hands over the tensor's buffer (as Dataset.as_numpy_iterator does);
    # `.numpy()` would copy every array, a visible share of the pipeline's CPU
    # (benchmarks/RESULTS.md).
    return {k: v._numpy() for k, v in batch.items()}  # pylint: disable=protected-access


class TFRecordIterator:
    """Host-local numpy training batches from TFRecords, with exact save / restore.

    Built by `bert_jax.data.pretrain.train_iterator`. `next(it)` -> dict[str, np.ndarray];
    `get_state()` -> dict[str, np.ndarray]; `set_state(state)`; `save(path)`,
    `restore(path)`. `skipped_files`: the corrupt shards left out (skip_corrupt=True).
    """

    def __init__(self, cfg, files: Sequence[str], *, process_index: int, process_count: int,
                 local_batch: int, record_level: bool, skipped_files=(),
                 max_sequences_per_pack: int = 0):
        self._cfg = cfg
        self.files = list(files)
        self.skipped_files = list(skipped_files)
        self.process_index, self.process_count = process_index, process_count
        self.local_batch = local_batch
        self.max_sequences_per_pack = max_sequences_per_pack  # 0: unpacked files
        self._record_level = record_level
        self._signature = _signature(cfg, self.files, process_index, process_count,
                                     local_batch, max_sequences_per_pack)
        self._build(0)

    def _build(self, start_batch: int):
        self._dataset = train_dataset(
            self._cfg, self.files, process_index=self.process_index,
            process_count=self.process_count, record_level=self._record_level,
            local_batch=self.local_batch, start_batch=start_batch,
            max_sequences_per_pack=self.max_sequences_per_pack)
        self._iter = iter(self._dataset)
        self.batches = start_batch
        self._failed = False  # a read error: the tf.data iterator cannot be serialized

    @property
    def element_spec(self):
        return self._dataset.element_spec

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        try:
            batch = next(self._iter)
        except tf.errors.OpError as e:  # a corrupt, unparsable or vanished file
            self._failed = True
            raise input_error(e, self.files, self._cfg, self.max_sequences_per_pack) from None
        self.batches += 1
        return _to_numpy(batch)

    # -- state

    def get_state(self) -> dict[str, np.ndarray]:
        meta = dict(kind="tfrecord", version=STATE_VERSION, batches=self.batches,
                    signature=self._signature)
        if self._failed:
            # A read error left tf.data's iterator mid-record: only the count is saved, and
            # set_state rebuilds the pipeline and skips that many batches (exact, also once
            # the file is re-created; with data.skip_corrupt the files differ and
            # restore_input seeks instead).
            return {state_lib.META: state_lib.pack_meta(meta)}
        variant = gen_dataset_ops.serialize_iterator(self._iter._iterator_resource, _FAIL)
        blob = tf.io.serialize_tensor(variant).numpy()
        return {state_lib.META: state_lib.pack_meta(meta),
                "tf_iterator": np.frombuffer(blob, np.uint8).copy()}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        meta = state_lib.unpack_meta(state)
        if meta.get("kind") != "tfrecord":
            raise ValueError(f"input state of kind {meta.get('kind')!r}, expected 'tfrecord'")
        if meta["signature"] != self._signature:
            diff = {k: (meta["signature"].get(k), v) for k, v in self._signature.items()
                    if meta["signature"].get(k) != v}
            raise ValueError(
                "the saved input state belongs to a different pipeline; (saved, now): "
                + json.dumps(diff) + ". Resuming it would repeat or skip examples.")
        blob = np.asarray(state.get("tf_iterator", np.zeros(0, np.uint8)), np.uint8).tobytes()
        if not blob:  # saved after a read error (see get_state): the count is the position
            log.warning("the input state was saved after a read error: rebuilding the "
                        "pipeline and skipping %d batches (exact, but re-reads the data)",
                        meta["batches"])
            self._build(int(meta["batches"]))
            return
        try:
            variant = tf.io.parse_tensor(blob, tf.variant)
            self._iter = iter(self._dataset)
            gen_dataset_ops.deserialize_iterator(self._iter._iterator_resource, variant)
            self.batches = int(meta["batches"])
            self._failed = False
        except (tf.errors.OpError, ValueError) as e:
            log.warning("cannot restore the tf.data iterator state (%s); rebuilding the "
                        "pipeline and skipping %d batches instead (exact, but re-reads the "
                        "data)", short_error(e), meta["batches"])
            self._build(int(meta["batches"]))

    def seek(self, batches: int) -> None:
        """Rebuilds the pipeline so that the next batch is batch `batches` of this host's
        stream (skipped before parsing): a resume without a usable state, e.g. onto
        another process count (bert_jax.data.state.restore_input)."""
        self._build(int(batches))

    def save(self, path) -> None:
        state_lib.save_state(path, self.get_state())

    def restore(self, path) -> None:
        self.set_state(state_lib.load_state(path))


class EvalIterable:
    """One pass over the eval records of this host; `len()` batches, same on every host.

    Iterating again starts a fresh pass. Batches carry example_weights (1 real, 0 filler).
    """

    def __init__(self, cfg, files: Sequence[str], *, process_index: int, process_count: int,
                 local_batch: int, max_sequences_per_pack: int = 0):
        self.files = list(files)
        self.local_batch = local_batch
        self.max_sequences_per_pack = max_sequences_per_pack
        self._cfg = cfg
        self._dataset, self.num_batches, self.num_records = eval_dataset(
            cfg, self.files, process_index=process_index, process_count=process_count,
            local_batch=local_batch, max_sequences_per_pack=max_sequences_per_pack)

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        try:
            for batch in self._dataset:
                yield _to_numpy(batch)
        except tf.errors.OpError as e:
            raise input_error(e, self.files, self._cfg, self.max_sequences_per_pack) from None
