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
packed-row features of bert_jax/data/features.py, packing in data_prep/packing.py), and
--runner / --beam_options (the same records from an Apache Beam pipeline on a cluster:
data_prep/beam/records.py).
Same sampling algorithm (see data_prep/instances.py); the differences are for bounded
memory: NSP's random B comes from another document of the same ~1 MB chunk and instances are
shuffled within a chunk. Byte-identical output for any --num_workers.

In process (training from raw text, bert_jax/tasks/pretraining/data.py, does this), with the
flags as Options fields and errors as exceptions (InputError / VocabError: the user's
mistake; OSError: a fault):

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
from data_prep import paths as dp_paths  # noqa: E402
from data_prep import instances as inst  # noqa: E402
from data_prep import pipeline  # noqa: E402
from data_prep.beam import load_beam  # noqa: E402
from data_prep.paths import (TEXT_FORMAT, InputError, check_blank_inputs,  # noqa: E402
                             resolve_inputs, resolve_outputs)
from bert_jax.data.features import files_named  # noqa: E402
from bert_jax.tokenization import check_unk_rate, load_tokenizer  # noqa: E402


def _opt(default, help_text: str):
    return dataclasses.field(default=default, metadata={"help": help_text})


@dataclasses.dataclass(frozen=True)
class Options:
    """One run's settings: the command line's flags, the same names, defaults and help."""
    input_file: str | None = _opt(
        None, "Input text file(s): comma-separated list, each may be a glob.")
    output_file: str | None = _opt(
        None, "Output TFRecord file(s): comma-separated list, or one name with "
        "--num_output_shards (a {shard} field is formatted, else -00000-of-0000N is "
        "appended).")
    num_output_shards: int = _opt(1, "Shards when --output_file is a single name.")
    vocab_file: str | None = _opt(None, "BERT WordPiece vocab.txt.")
    spm_model_file: str | None = _opt(None, "SentencePiece model (instead of --vocab_file).")
    do_lower_case: bool = _opt(True, "Lower-case (and strip accents for WordPiece).")
    do_whole_word_mask: bool = _opt(False, "Mask whole words, not single pieces.")
    max_seq_length: int = _opt(128, "Maximum sequence length.")
    max_predictions_per_seq: int = _opt(20, "Maximum masked LM predictions per sequence.")
    random_seed: int = _opt(12345, "Random seed for data generation.")
    dupe_factor: int = _opt(10, "Passes over the input, each with different masks.")
    masked_lm_prob: float = _opt(0.15, "Masked LM probability.")
    short_seq_prob: float = _opt(0.1, "Probability of a shorter-than-maximum target length.")
    num_workers: int | None = _opt(None, "Worker processes (default: all cores).")
    no_nsp: bool = _opt(
        False, "Pack whole sentences up to max_seq_length with no NSP pair (RoBERTa's "
        "FULL-SENTENCES, an extra [SEP] between documents; short_seq_prob still applies); "
        "segment_ids and next_sentence_labels are then always 0.")
    chunk_size_mb: float = _opt(
        1.0, "Text per chunk: the memory bound, and the pool NSP draws random B sentences "
        "from. Part of the output's identity (like the seed).")
    pack: bool = _opt(
        False, "Write packed rows: up to --max_sequences_per_pack instances back to back in "
        "each row of max_seq_length (histogram packing, SPFHP), with per-token sequence_ids "
        "and position_ids and per-sequence NSP slots; max_predictions_per_seq + K MLM slots "
        "per row (bert_jax/data/features.py).")
    max_sequences_per_pack: int = _opt(3, "With --pack: the most sequences one row holds (K).")
    progress: bool = _opt(True, "Show a progress bar.")
    runner: str = _opt("local", dp_paths.RUNNER_HELP.format(what="records"))
    beam_options: str = _opt("", dp_paths.BEAM_OPTIONS_HELP)


@dataclasses.dataclass(frozen=True)
class Result:
    """A finished run: its statistics, their summary (the lines the command line prints),
    the files written, and the warnings (some input files blank, most of the text [UNK])."""
    stats: pipeline.Stats
    summary: str
    outputs: list[str]
    warnings: list[str]


def create(options: Options, announce=None) -> Result:
    """The command line's work in process. Settings, files and vocabulary are checked
    before any work: InputError (or the vocabulary's VocabError) names the setting or file,
    a user's mistake, as does text that yields no instance; OSError when an output cannot
    be written (a full disk). Either way, and on KeyboardInterrupt, nothing is left
    half-written (an older output stays). `announce(warnings, plan)`, if given, runs once
    the checks passed, before the work (the command line prints them)."""
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
        blank = check_blank_inputs(inputs, "--input_file", TEXT_FORMAT)
    except UserError:
        raise
    except (ValueError, FileNotFoundError) as e:  # a bad value (validate), a missing vocab
        raise InputError(str(e)) from e
    warnings = [blank] if blank else []
    beam = _beam(o.runner, o.beam_options)
    # All cores this process may use (the affinity mask, not the machine's count).
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = o.num_workers or cores or 1
    if announce is not None:
        announce(warnings, f"{len(inputs)} input file(s) -> {len(outputs)} output file(s), "
                           + (f"Beam {o.runner}" if beam else f"{workers} worker(s)"))
    spec = pipeline.WorkerSpec(o.vocab_file, o.spm_model_file, o.do_lower_case, cfg,
                               o.random_seed)
    if beam is not None:
        stats = beam.run(inputs, outputs, spec, o.runner, o.beam_options,
                         chunk_chars=int(o.chunk_size_mb * 1e6), require_instances=True)
    else:
        stats = pipeline.run(inputs, outputs, spec, num_workers=workers,
                             chunk_chars=int(o.chunk_size_mb * 1e6), progress=o.progress,
                             require_instances=True)
    summary = stats.summary(no_nsp=cfg.no_nsp, max_seq_length=cfg.max_seq_length,
                            max_sequences_per_pack=cfg.max_sequences_per_pack)
    # Only a warning here: the records are well-formed; the data doctor and the training
    # run refuse them above tokenization.UNK_ERROR.
    unk = check_unk_rate(
        stats.unk_tokens, stats.tokens, f"--input_file {files_named(inputs)}",
        f"{o.vocab_file or o.spm_model_file} (do_lower_case={o.do_lower_case})",
        error_above=None)
    return Result(stats, summary, outputs, warnings + ([unk] if unk else []))


def _beam(runner: str, beam_options: str):
    """data_prep.beam.records for a Beam runner, None for 'local' (Beam is not imported)."""
    if runner == "local":
        if beam_options:
            raise InputError("--beam_options needs a Beam --runner (e.g. DirectRunner)")
        return None
    return load_beam("records", runner, beam_options, InputError)


def _define_flags() -> None:
    """The command line's flags, from Options, defined only when it runs: importing this
    module for `create` adds nothing to the importing program's flags."""
    from absl import flags

    define = {"bool": flags.DEFINE_bool, "int": flags.DEFINE_integer,
              "float": flags.DEFINE_float}
    for f in dataclasses.fields(Options):
        kind = str(f.type).split(" ")[0]
        define.get(kind, flags.DEFINE_string)(f.name, f.default, f.metadata["help"])


def _error(e: BaseException, exit_code: int) -> int:
    print(f"create_pretraining_data: error: {e}", file=sys.stderr)
    return exit_code


def main(argv):
    """The command line over `create`: its warnings and errors as lines on stderr (exit 2
    for the user's mistakes, 1 for an OSError, 130 on Ctrl-C), the summary on stdout."""
    from absl import app, flags

    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    options = Options(**{f.name: flags.FLAGS[f.name].value
                         for f in dataclasses.fields(Options)})
    shown = []

    def announce(warnings, plan):
        shown.extend(warnings)
        for line in [f"warning: {w}" for w in warnings] + [plan]:
            print(line if line == plan else f"create_pretraining_data: {line}",
                  file=sys.stderr)

    try:
        result = create(options, announce)
    except UserError as e:  # a bad setting or file; text without a single token
        return _error(e, 2)
    except OSError as e:  # unwritable output, disk full, ...: nothing left half-written
        return _error(e, 1)
    except KeyboardInterrupt:
        print("create_pretraining_data: interrupted; no output written", file=sys.stderr)
        return 130
    print(result.summary)
    print("wrote " + ", ".join(result.outputs))
    for warning in result.warnings[len(shown):]:
        print(f"create_pretraining_data: warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from bert_jax import cli

    cli.quiet_native_logs()
    _define_flags()
    cli.run(main)
