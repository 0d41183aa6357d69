"""Pre-training input: the `data` config section and the iterators the trainer uses.

    from bert_jax.data import pretrain, device
    config.data = pretrain.data_config()            # in configs/*.py; override on the CLI
    pretrain.check_input(config.data)                # before compiling: names a bad file
    train_it = pretrain.train_iterator(config.data, 256)  # endless host-local numpy batches
    batch = next(train_it)                           # dict[str, np.ndarray], see below
    state = train_it.get_state(); train_it.set_state(state)   # exact resume
    for batch in pretrain.eval_iterator(config.data, 256): ... # every record once
    checks.check_batch(batch, max_seq_length=..., max_predictions_per_seq=...,
                       vocab_size=...)               # optional: a batch against the config

Batches (host-local, local_batch = batch_size // jax.process_count(); config.train.batch_size):
    input_ids, input_mask, segment_ids: <int32>[local_batch, max_seq_length]
    masked_lm_positions, masked_lm_ids: <int32>[local_batch, max_predictions_per_seq]
    masked_lm_weights:                  <float32>[local_batch, max_predictions_per_seq]
    next_sentence_labels:               <int32>[local_batch]  (0 = IsNext, as the original)
    example_weights:                    <float32>[local_batch] (1 real, 0 eval filler)
Packed files (data_prep --pack; recognised by their features, see features.PACKED_FEATURES)
add sequence_ids, position_ids <int32>[local_batch, max_seq_length] and
next_sentence_positions <int32>, next_sentence_weights <float32> [local_batch, K], with
next_sentence_labels <int32>[local_batch, K] and max_predictions_per_seq + K MLM slots.
`device.to_global` / `device.DevicePrefetcher` turn them into global jax.Arrays sharded on
the logical "batch" axis.

Sources: "tfrecord" (tf.data over the original BERT TFRecords, `bert_jax.data.tfrecord`)
and "synthetic" (random batches of the same shapes, `bert_jax.data.synthetic`, no
TensorFlow). This module imports TensorFlow only when a tfrecord pipeline is built, so
`source="synthetic"` runs on images without TF.

Iterator state: `get_state()`, a flat dict of host-local numpy arrays, is saved per process
with the checkpoint (bert_jax.data.checkpointing); for tfrecord, tf.data's own serialized
iterator (read offsets + the partial shuffle window: exact; bert_jax.data.tfrecord).
"""

from __future__ import annotations

import logging

import jax
import ml_collections

from bert_jax.data import checks, features, synthetic
from bert_jax.data.features import DataCheckError
from bert_jax.tokenization import vocab_info

log = logging.getLogger(__name__)

SOURCES = ("tfrecord", "synthetic")


def data_config(**overrides) -> ml_collections.ConfigDict:
    """The `config.data` section with the paper's defaults (phase 1: length 128)."""
    c = ml_collections.ConfigDict()
    c.source = "tfrecord"        # "tfrecord" | "synthetic"
    c.train_files = ""           # comma-separated globs (gs:// works)
    c.eval_files = ""            # comma-separated globs; empty: no evaluation
    # With no train_files: raw text (a sentence per line, a blank line between documents),
    # comma-separated globs, made into TFRecords once in the workdir (bert_jax.tasks.
    # pretraining.data; 1 document in 20 held out for eval). Empty: the sample corpus.
    c.text_files = ""
    c.do_lower_case = True       # for text_files: uncased vocabularies
    c.max_seq_length = 128
    c.max_predictions_per_seq = 20   # per sequence (a packed row has this + K slots)
    # Packed rows (several sequences per row, no compute on padding): TFRecords written by
    # data_prep --pack are recognised by their features (the train files all packed or all
    # unpacked, the eval files too). pack=True packs the data the run makes itself: the
    # training TFRecords built from text_files / the sample corpus (evaluation stays
    # unpacked, so eval metrics compare with unpacked runs; bert_jax.tasks.pretraining.data).
    c.pack = False
    c.max_sequences_per_pack = 3     # K: the most sequences a packed row holds
    c.shuffle = True
    c.shuffle_buffer = 10_000    # records per shuffle window, per host (~ state size)
    c.seed = 0
    c.num_parallel_reads = 16    # files read at once (interleave cycle length)
    c.interleave_block = 16      # consecutive records taken from one file at a time
    c.read_threads = -1          # interleave threads: -1 auto (0 for local files, AUTOTUNE
                                 # for gs:// and other remote ones), 0 = the pipeline's own
                                 # thread (cheapest on local disks), N, or -2 = AUTOTUNE
    c.read_buffer_bytes = 1 << 20  # TFRecordDataset read buffer per file
    # tf.data's autotuning model thread: off, as AUTOTUNE's untuned values (min(16, cores)
    # parallel calls, prefetch's own buffer tuning) already feed far more than a step eats,
    # and destroying a tuned iterator waits out the model's sleep (up to 60 s) at the end
    # of every evaluation and of the run. True: tune (benchmarks/input_pipeline.py).
    c.autotune = False
    c.dynamic_masking = False    # re-mask on the fly (RoBERTa); else the files' masks
    c.masked_lm_prob = 0.15
    # Vocabulary, for dynamic masking and the id checks: read from vocab_file if given
    # (WordPiece vocab.txt or SentencePiece .model), else these (uncased BERT WordPiece).
    c.vocab_file = ""
    c.vocab_size = 30522
    c.pad_id = 0
    c.cls_id = 101
    c.sep_id = 102
    c.mask_id = 103
    c.unk_id = 100               # only to measure the share of [UNK] (check_input)
    c.skip_corrupt = False       # True: leave corrupt shards out (warning + count)
    c.check_records_per_file = 2  # records of each file checked by check_input
    c.prefetch_to_device = 2     # batches put on device ahead (device.DevicePrefetcher)
    for key, value in overrides.items():
        if key in ("batch_size", "eval_batch_size"):
            raise KeyError(f"data_config: {key} is a key of the train section now "
                           f"(config.train.{key})")
        if key not in c:
            raise KeyError(f"data_config: unknown key {key!r}; known keys: {sorted(c.keys())}")
        setattr(c, key, value)
    return c


def _hosts(process_index, process_count) -> tuple[int, int]:
    return (jax.process_index() if process_index is None else process_index,
            jax.process_count() if process_count is None else process_count)


def local_batch_size(global_batch: int, process_count: int) -> int:
    if global_batch <= 0 or global_batch % process_count:
        raise ValueError(f"train.batch_size={global_batch} (global) must be a positive "
                         f"multiple of the number of hosts, {process_count}")
    return global_batch // process_count


def _check_source(cfg):
    if cfg.source not in SOURCES:
        raise ValueError(f"data.source={cfg.source!r}, expected one of {SOURCES}")


def host_files(cfg, patterns: str, process_index: int, process_count: int):
    """(this host's files, record_level, skipped corrupt files)."""
    from bert_jax.data import shards  # TensorFlow: the tfrecord source only
    files = shards.expand_files(patterns, "data.train_files")
    mine, record_level = shards.shard_files(files, process_index, process_count)
    skipped = []
    if cfg.skip_corrupt:
        mine, skipped = shards.drop_corrupt(mine)
    return mine, record_level, skipped


def train_iterator(cfg, batch_size: int, *, process_index: int | None = None,
                   process_count: int | None = None):
    """Endless iterator of this host's training batches (dict of numpy, see module doc) of
    `batch_size` examples in all hosts (config.train.batch_size).

    process_index / process_count default to jax's; pass them to simulate hosts. The
    returned object has get_state() / set_state() / save(path) / restore(path).
    """
    _check_source(cfg)
    index, count = _hosts(process_index, process_count)
    local_batch = local_batch_size(batch_size, count)
    if cfg.source == "synthetic":
        return synthetic.SyntheticIterator(cfg, process_index=index, process_count=count,
                                           local_batch=local_batch)
    from bert_jax.data import tfrecord  # TensorFlow: the tfrecord source only
    files, record_level, skipped = host_files(cfg, cfg.train_files, index, count)
    pack = files_packing(cfg, files, "data.train_files")
    return tfrecord.TFRecordIterator(cfg, files, process_index=index, process_count=count,
                                     local_batch=local_batch, record_level=record_level,
                                     skipped_files=skipped, max_sequences_per_pack=pack)


def files_packing(cfg, files, what: str) -> int:
    """0 if `files` hold unpacked rows, else K (data_prep --pack), from their first record;
    DataCheckError for what a packed set cannot do (dynamic masking)."""
    pack = checks.files_packing(files)
    if pack and cfg.dynamic_masking:
        raise DataCheckError(
            f"{what} {checks.files_named(list(files))} hold {features.describe_packing(pack)}, "
            f"and data.dynamic_masking=True re-masks unpacked rows only; set "
            f"--config.data.dynamic_masking=False (the files' own masks) or give unpacked files")
    return pack


def eval_iterator(cfg, batch_size: int, *, process_index: int | None = None,
                  process_count: int | None = None, num_batches: int | None = None):
    """One pass over the eval files in batches of `batch_size` examples in all hosts: every
    record exactly once, the last batch padded with filler rows (example_weights 0), never
    dropped; `len()` is the same on every host.

    source="synthetic": `num_batches` (default 4) synthetic batches.
    """
    _check_source(cfg)
    index, count = _hosts(process_index, process_count)
    local_batch = local_batch_size(batch_size, count)
    if cfg.source == "synthetic":
        return synthetic.SyntheticEval(cfg, process_index=index, process_count=count,
                                       local_batch=local_batch, num_batches=num_batches or 4)
    if not cfg.eval_files:
        raise ValueError("data.eval_files is empty: nothing to evaluate")
    from bert_jax.data import shards, tfrecord  # TensorFlow: the tfrecord source only
    files = shards.expand_files(cfg.eval_files, "data.eval_files")
    return tfrecord.EvalIterable(cfg, files, process_index=index, process_count=count,
                                 local_batch=local_batch,
                                 max_sequences_per_pack=checks.files_packing(files))


def check_input(cfg, *, process_index: int | None = None,
                process_count: int | None = None) -> None:
    """Checks the first records of each of this host's training (and eval) files against
    the config before anything is compiled; raises `DataCheckError` naming the file
    and the expected and found values (or `tokenization.VocabError` when most of their
    tokens are [UNK]; a warning from tokenization.UNK_WARN on); packed and unpacked files
    mixed in train_files (or in eval_files) are named too. No-op for source="synthetic"."""
    _check_source(cfg)
    if cfg.source == "synthetic":
        return
    index, count = _hosts(process_index, process_count)
    vocab = vocab_info(cfg, with_unk=True)
    for what, patterns in (("data.train_files", cfg.train_files),
                           ("data.eval_files", cfg.eval_files)):
        if not patterns:
            continue
        from bert_jax.data import shards  # TensorFlow: the tfrecord source only
        files, _ = shards.shard_files(shards.expand_files(patterns, what), index, count)
        warning = checks.check_files(
            files, max_seq_length=cfg.max_seq_length,
            max_predictions_per_seq=cfg.max_predictions_per_seq,
            vocab_size=vocab["vocab_size"], records_per_file=cfg.check_records_per_file,
            skip_unreadable=cfg.skip_corrupt, vocab=vocab,
            vocab_name=cfg.get("vocab_file") or (f"of the config (data.vocab_size="
                                                 f"{vocab['vocab_size']}, data.unk_id="
                                                 f"{vocab['unk_id']})"), what=what)
        if warning:
            log.warning("%s", warning)
        if what == "data.train_files":
            files_packing(cfg, files, what)
