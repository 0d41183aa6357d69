r"""Corpus -> TFRecords of masked sentence pairs, in the original BERT format.

Input: UTF-8 text, one sentence per line, a blank line between documents. Output:
`tf.train.Example`s with exactly the original features (`input_ids`, `input_mask`,
`segment_ids`, `masked_lm_positions`, `masked_lm_ids`, `masked_lm_weights`,
`next_sentence_labels`), interchangeable with files made by google-research/bert's tool.

    python data_prep/create_pretraining_data.py \
      --input_file=data_prep/sample_corpus/*.txt \
      --output_file=/tmp/pretrain/sample-{shard:03d}.tfrecord --num_output_shards=4 \
      --vocab_file=data_prep/bert_uncased_vocab.txt --do_lower_case \
      --max_seq_length=128 --max_predictions_per_seq=20 --masked_lm_prob=0.15 \
      --dupe_factor=5 --random_seed=12345

Same flags as the original, plus --spm_model_file, --num_workers, --no_nsp,
--chunk_size_mb and --pack / --max_sequences_per_pack (several sequences per row: the
packed-row features of bert_jax/data/features.py, packing in data_prep/packing.py).
Same sampling algorithm (see data_prep/instances.py); the differences are for bounded memory: NSP's random B comes from another document of the same ~1 MB chunk
and instances are shuffled within a chunk. Byte-identical output for any --num_workers.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script: make `data_prep` and `bert_jax` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from bert_jax import cli  # noqa: E402
from data_prep import instances as inst  # noqa: E402
from data_prep import pipeline  # noqa: E402
from data_prep.paths import (TEXT_FORMAT, InputError, check_blank_inputs,  # noqa: E402
                             resolve_inputs, resolve_outputs)

FLAGS = flags.FLAGS

flags.DEFINE_string("input_file", None,
                    "Input text file(s): comma-separated list, each may be a glob.")
flags.DEFINE_string("output_file", None,
                    "Output TFRecord file(s): comma-separated list, or one name with "
                    "--num_output_shards (a {shard} field is formatted, else "
                    "-00000-of-0000N is appended).")
flags.DEFINE_integer("num_output_shards", 1, "Shards when --output_file is a single name.")
flags.DEFINE_string("vocab_file", None, "BERT WordPiece vocab.txt.")
flags.DEFINE_string("spm_model_file", None, "SentencePiece model (instead of --vocab_file).")
flags.DEFINE_bool("do_lower_case", True, "Lower-case (and strip accents for WordPiece).")
flags.DEFINE_bool("do_whole_word_mask", False, "Mask whole words, not single pieces.")
flags.DEFINE_integer("max_seq_length", 128, "Maximum sequence length.")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Maximum masked LM predictions per sequence.")
flags.DEFINE_integer("random_seed", 12345, "Random seed for data generation.")
flags.DEFINE_integer("dupe_factor", 10, "Passes over the input, each with different masks.")
flags.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.")
flags.DEFINE_float("short_seq_prob", 0.1,
                   "Probability of a shorter-than-maximum target length.")
flags.DEFINE_integer("num_workers", None, "Worker processes (default: all cores).")
flags.DEFINE_bool("no_nsp", False,
                  "Pack whole sentences up to max_seq_length with no NSP pair (RoBERTa's "
                  "FULL-SENTENCES, an extra [SEP] between documents; short_seq_prob still "
                  "applies); segment_ids and next_sentence_labels are then always 0.")
flags.DEFINE_float("chunk_size_mb", 1.0,
                   "Text per chunk: the memory bound, and the pool NSP draws random B "
                   "sentences from. Part of the output's identity (like the seed).")
flags.DEFINE_bool("pack", False,
                  "Write packed rows: up to --max_sequences_per_pack instances back to back "
                  "in each row of max_seq_length (histogram packing, SPFHP), with per-token "
                  "sequence_ids and position_ids and per-sequence NSP slots; "
                  "max_predictions_per_seq + K MLM slots per row (bert_jax/data/features.py).")
flags.DEFINE_integer("max_sequences_per_pack", 3,
                     "With --pack: the most sequences one row holds (K).")
flags.DEFINE_bool("progress", True, "Show a progress bar.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from bert_jax.data.tokenization import VocabError, load_tokenizer
    try:
        if not FLAGS.input_file or not FLAGS.output_file:
            raise InputError("--input_file and --output_file are required")
        if not (FLAGS.vocab_file or FLAGS.spm_model_file):
            raise InputError("give --vocab_file (WordPiece) or --spm_model_file (SentencePiece)")
        if FLAGS.vocab_file and FLAGS.spm_model_file:
            raise InputError("give only one of --vocab_file and --spm_model_file")
        cfg = inst.InstanceConfig(
            max_seq_length=FLAGS.max_seq_length,
            max_predictions_per_seq=FLAGS.max_predictions_per_seq,
            masked_lm_prob=FLAGS.masked_lm_prob, short_seq_prob=FLAGS.short_seq_prob,
            dupe_factor=FLAGS.dupe_factor, do_whole_word_mask=FLAGS.do_whole_word_mask,
            no_nsp=FLAGS.no_nsp,
            max_sequences_per_pack=FLAGS.max_sequences_per_pack if FLAGS.pack else 0)
        if FLAGS.pack and FLAGS.max_sequences_per_pack < 1:
            raise InputError(f"--max_sequences_per_pack must be >= 1 with --pack "
                             f"(got {FLAGS.max_sequences_per_pack})")
        cfg.validate()
        if FLAGS.chunk_size_mb <= 0:
            raise InputError(f"--chunk_size_mb must be > 0 (got {FLAGS.chunk_size_mb})")
        inputs = resolve_inputs(FLAGS.input_file)
        outputs = resolve_outputs(FLAGS.output_file, FLAGS.num_output_shards)
        # Load the vocabulary here, before any worker starts: a bad one fails fast.
        load_tokenizer(FLAGS.vocab_file, FLAGS.spm_model_file, FLAGS.do_lower_case)
        warning = check_blank_inputs(inputs, "--input_file", TEXT_FORMAT)
    except (InputError, ValueError, FileNotFoundError, VocabError) as e:
        print(f"create_pretraining_data: error: {e}", file=sys.stderr)
        return 2
    if warning:
        print(f"create_pretraining_data: warning: {warning}", file=sys.stderr)
    # All cores this process may use (the affinity mask, not the machine's count).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    num_workers = FLAGS.num_workers or cores or 1
    spec = pipeline.WorkerSpec(FLAGS.vocab_file, FLAGS.spm_model_file, FLAGS.do_lower_case,
                               cfg, FLAGS.random_seed)
    print(f"{len(inputs)} input file(s) -> {len(outputs)} output file(s), "
          f"{num_workers} worker(s)", file=sys.stderr)
    try:
        stats = pipeline.run(inputs, outputs, spec, num_workers=num_workers,
                             chunk_chars=int(FLAGS.chunk_size_mb * 1e6),
                             progress=FLAGS.progress, require_instances=True)
    except InputError as e:  # text without a single token: no output written
        print(f"create_pretraining_data: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # unwritable output, disk full, ...: nothing left half-written
        print(f"create_pretraining_data: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("create_pretraining_data: interrupted; no output written", file=sys.stderr)
        return 130
    print(stats.summary(no_nsp=cfg.no_nsp, max_seq_length=cfg.max_seq_length,
                        max_sequences_per_pack=cfg.max_sequences_per_pack))
    print("wrote " + ", ".join(outputs))
    from bert_jax.data.checks import files_named
    from bert_jax.data.tokenization import check_unk_rate
    # Only a warning here: the records are well-formed; the data doctor and the training
    # run refuse them above tokenization.UNK_ERROR.
    warning = check_unk_rate(
        stats.unk_tokens, stats.tokens, f"--input_file {files_named(inputs)}",
        f"{FLAGS.vocab_file or FLAGS.spm_model_file} (do_lower_case={FLAGS.do_lower_case})",
        error_above=None)
    if warning:
        print(f"create_pretraining_data: warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    cli.run(main)
