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

In process (training from raw text, bert_jax/train/data.py, does this), with the flags as
Options fields and errors as exceptions (InputError / VocabError: the user's mistake;
OSError: a fault):

    import data_prep
    from data_prep import create_pretraining_data as cpd
    result = cpd.create(cpd.Options(input_file="corpus/*.txt", output_file="out.tfrecord",
                                    vocab_file=data_prep.SAMPLE_VOCAB, progress=False))
    print(result.summary, result.warnings)
"""

from __future__ import annotations

import dataclasses
import os
import sys

if __package__ in (None, ""):  # run as a script: make `data_prep` and `bert_jax` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bert_jax.errors import UserError  # noqa: E402
from data_prep import instances as inst  # noqa: E402
from data_prep import pipeline  # noqa: E402
from data_prep.paths import (TEXT_FORMAT, InputError, check_blank_inputs,  # noqa: E402
                             resolve_inputs, resolve_outputs)


@dataclasses.dataclass(frozen=True)
class Options:
    """One run's settings: the command line's flags, the same names and defaults."""
    input_file: str | None = None
    output_file: str | None = None
    num_output_shards: int = 1
    vocab_file: str | None = None
    spm_model_file: str | None = None
    do_lower_case: bool = True
    do_whole_word_mask: bool = False
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    random_seed: int = 12345
    dupe_factor: int = 10
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    num_workers: int | None = None
    no_nsp: bool = False
    chunk_size_mb: float = 1.0
    pack: bool = False
    max_sequences_per_pack: int = 3
    progress: bool = True


@dataclasses.dataclass(frozen=True)
class Plan:
    """A checked run (`check`): the files it reads and writes, its workers' settings, and
    the warnings found so far (e.g. some input files are blank)."""
    options: Options
    inputs: list[str]
    outputs: list[str]
    spec: pipeline.WorkerSpec
    num_workers: int
    warnings: list[str]


@dataclasses.dataclass(frozen=True)
class Result:
    """A finished run: its statistics, their summary (the lines the command line prints),
    the files written, and warnings (from `write`: e.g. most of the text is [UNK]; from
    `create`: those of `check` too)."""
    stats: pipeline.Stats
    summary: str
    outputs: list[str]
    warnings: list[str]


def check(options: Options) -> Plan:
    """Settings, files and vocabulary checked before any work. Raises InputError (or the
    vocabulary's VocabError) naming the setting or file: a user's mistake."""
    from bert_jax.data.tokenization import load_tokenizer

    o = options
    try:
        if not o.input_file or not o.output_file:
            raise InputError("--input_file and --output_file are required")
        if not (o.vocab_file or o.spm_model_file):
            raise InputError("give --vocab_file (WordPiece) or --spm_model_file (SentencePiece)")
        if o.vocab_file and o.spm_model_file:
            raise InputError("give only one of --vocab_file and --spm_model_file")
        cfg = inst.InstanceConfig(
            max_seq_length=o.max_seq_length,
            max_predictions_per_seq=o.max_predictions_per_seq,
            masked_lm_prob=o.masked_lm_prob, short_seq_prob=o.short_seq_prob,
            dupe_factor=o.dupe_factor, do_whole_word_mask=o.do_whole_word_mask,
            no_nsp=o.no_nsp,
            max_sequences_per_pack=o.max_sequences_per_pack if o.pack else 0)
        if o.pack and o.max_sequences_per_pack < 1:
            raise InputError(f"--max_sequences_per_pack must be >= 1 with --pack "
                             f"(got {o.max_sequences_per_pack})")
        cfg.validate()
        if o.chunk_size_mb <= 0:
            raise InputError(f"--chunk_size_mb must be > 0 (got {o.chunk_size_mb})")
        inputs = resolve_inputs(o.input_file)
        outputs = resolve_outputs(o.output_file, o.num_output_shards)
        # Load the vocabulary here, before any worker starts: a bad one fails fast.
        load_tokenizer(o.vocab_file, o.spm_model_file, o.do_lower_case)
        warning = check_blank_inputs(inputs, "--input_file", TEXT_FORMAT)
    except UserError:
        raise
    except (ValueError, FileNotFoundError) as e:  # a bad value (validate), a missing vocab
        raise InputError(str(e)) from e
    # All cores this process may use (the affinity mask, not the machine's count).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    spec = pipeline.WorkerSpec(o.vocab_file, o.spm_model_file, o.do_lower_case, cfg,
                               o.random_seed)
    return Plan(o, inputs, outputs, spec, o.num_workers or cores or 1,
                [warning] if warning else [])


def write(plan: Plan) -> Result:
    """Writes the TFRecords of a checked run. Raises InputError when the text yields no
    instance, OSError when an output cannot be written (e.g. disk full); either way, and on
    KeyboardInterrupt, nothing is left half-written (an older output stays)."""
    o, cfg = plan.options, plan.spec.cfg
    stats = pipeline.run(plan.inputs, plan.outputs, plan.spec, num_workers=plan.num_workers,
                         chunk_chars=int(o.chunk_size_mb * 1e6), progress=o.progress,
                         require_instances=True)
    summary = stats.summary(no_nsp=cfg.no_nsp, max_seq_length=cfg.max_seq_length,
                            max_sequences_per_pack=cfg.max_sequences_per_pack)
    from bert_jax.data.checks import files_named
    from bert_jax.data.tokenization import check_unk_rate
    # Only a warning here: the records are well-formed; the data doctor and the training
    # run refuse them above tokenization.UNK_ERROR.
    warning = check_unk_rate(
        stats.unk_tokens, stats.tokens, f"--input_file {files_named(plan.inputs)}",
        f"{o.vocab_file or o.spm_model_file} (do_lower_case={o.do_lower_case})",
        error_above=None)
    return Result(stats, summary, plan.outputs, [warning] if warning else [])


def create(options: Options) -> Result:
    """`check` then `write`: the command line's work in process, its errors as exceptions
    (InputError / VocabError for the user's mistakes, OSError for faults). The warnings
    are those of both steps."""
    plan = check(options)
    result = write(plan)
    return dataclasses.replace(result, warnings=plan.warnings + result.warnings)


def _define_flags() -> None:
    """The command line's flags, defined only when it runs: importing this module for
    `create` adds nothing to the importing program's flags."""
    from absl import flags

    d = Options()
    flags.DEFINE_string("input_file", d.input_file,
                        "Input text file(s): comma-separated list, each may be a glob.")
    flags.DEFINE_string("output_file", d.output_file,
                        "Output TFRecord file(s): comma-separated list, or one name with "
                        "--num_output_shards (a {shard} field is formatted, else "
                        "-00000-of-0000N is appended).")
    flags.DEFINE_integer("num_output_shards", d.num_output_shards,
                         "Shards when --output_file is a single name.")
    flags.DEFINE_string("vocab_file", d.vocab_file, "BERT WordPiece vocab.txt.")
    flags.DEFINE_string("spm_model_file", d.spm_model_file,
                        "SentencePiece model (instead of --vocab_file).")
    flags.DEFINE_bool("do_lower_case", d.do_lower_case,
                      "Lower-case (and strip accents for WordPiece).")
    flags.DEFINE_bool("do_whole_word_mask", d.do_whole_word_mask,
                      "Mask whole words, not single pieces.")
    flags.DEFINE_integer("max_seq_length", d.max_seq_length, "Maximum sequence length.")
    flags.DEFINE_integer("max_predictions_per_seq", d.max_predictions_per_seq,
                         "Maximum masked LM predictions per sequence.")
    flags.DEFINE_integer("random_seed", d.random_seed, "Random seed for data generation.")
    flags.DEFINE_integer("dupe_factor", d.dupe_factor,
                         "Passes over the input, each with different masks.")
    flags.DEFINE_float("masked_lm_prob", d.masked_lm_prob, "Masked LM probability.")
    flags.DEFINE_float("short_seq_prob", d.short_seq_prob,
                       "Probability of a shorter-than-maximum target length.")
    flags.DEFINE_integer("num_workers", d.num_workers, "Worker processes (default: all cores).")
    flags.DEFINE_bool("no_nsp", d.no_nsp,
                      "Pack whole sentences up to max_seq_length with no NSP pair (RoBERTa's "
                      "FULL-SENTENCES, an extra [SEP] between documents; short_seq_prob still "
                      "applies); segment_ids and next_sentence_labels are then always 0.")
    flags.DEFINE_float("chunk_size_mb", d.chunk_size_mb,
                       "Text per chunk: the memory bound, and the pool NSP draws random B "
                       "sentences from. Part of the output's identity (like the seed).")
    flags.DEFINE_bool("pack", d.pack,
                      "Write packed rows: up to --max_sequences_per_pack instances back to "
                      "back in each row of max_seq_length (histogram packing, SPFHP), with "
                      "per-token sequence_ids and position_ids and per-sequence NSP slots; "
                      "max_predictions_per_seq + K MLM slots per row "
                      "(bert_jax/data/features.py).")
    flags.DEFINE_integer("max_sequences_per_pack", d.max_sequences_per_pack,
                         "With --pack: the most sequences one row holds (K).")
    flags.DEFINE_bool("progress", d.progress, "Show a progress bar.")


def _error(e: BaseException, exit_code: int) -> int:
    print(f"create_pretraining_data: error: {e}", file=sys.stderr)
    return exit_code


def main(argv):
    """The command line over check / write: their warnings and errors as lines on stderr
    (exit 2 for the user's mistakes, 1 for an OSError, 130 on Ctrl-C), the summary on
    stdout."""
    from absl import app, flags

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    options = Options(**{f.name: flags.FLAGS[f.name].value
                         for f in dataclasses.fields(Options)})
    try:
        plan = check(options)
    except UserError as e:
        return _error(e, 2)
    for warning in plan.warnings:
        print(f"create_pretraining_data: warning: {warning}", file=sys.stderr)
    print(f"{len(plan.inputs)} input file(s) -> {len(plan.outputs)} output file(s), "
          f"{plan.num_workers} worker(s)", file=sys.stderr)
    try:
        result = write(plan)
    except UserError as e:  # text without a single token: no output written
        return _error(e, 2)
    except OSError as e:  # unwritable output, disk full, ...: nothing left half-written
        return _error(e, 1)
    except KeyboardInterrupt:
        print("create_pretraining_data: interrupted; no output written", file=sys.stderr)
        return 130
    print(result.summary)
    print("wrote " + ", ".join(result.outputs))
    for warning in result.warnings:
        print(f"create_pretraining_data: warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from bert_jax import cli

    _define_flags()
    cli.run(main)
