"""Input/output file lists of the data_prep CLIs (comma lists, globs, shard patterns).

Any name may be a URI (gs://bucket/corpus/*.txt, as google-research/bert's tools took): it
stays a URI, never a local ./gs:/ folder, and is listed, read and written through
`etils.epath` (TensorFlow's gfile when TensorFlow is installed, else fsspec)."""

from __future__ import annotations

import glob
import os

from etils import epath

from bert_jax import paths as bert_paths
from bert_jax.errors import UserError
from bert_jax.paths import is_uri
from bert_jax.data.features import files_named

# What the corpus tools read (the original create_pretraining_data.py's input format).
TEXT_FORMAT = "UTF-8 text, one sentence per line, a blank line between documents"
# The --runner and --beam_options help of both tools (prepare_corpus, create_pretraining_data).
RUNNER_HELP = ("'local': this machine's processes (--num_workers). A Beam runner "
               "(DirectRunner, DataflowRunner, FlinkRunner, SparkRunner; pip install .[beam]): "
               "the same {what} from an Apache Beam pipeline, inputs and outputs local or in a "
               "bucket.")
BEAM_OPTIONS_HELP = ("With a Beam --runner: its pipeline options as one string, e.g. "
                     "'--project=P --region=R --temp_location=gs://B/tmp'.")


def size(path: str) -> int:
    return epath.Path(path).stat().length if is_uri(path) else os.path.getsize(path)


class InputError(UserError):
    """Bad flags or files, found before any work (printed without a traceback), or input
    that yields nothing (no output is written then)."""


def blank_inputs(paths: list[str]) -> list[str]:
    """The files among `paths` without a single non-blank line (empty, or only whitespace).
    Reads each file up to its first non-blank line: cheap on a real corpus."""
    blank = []
    for p in paths:
        with epath.Path(p).open("rb") as f:
            if not any(line.strip() for line in f):
                blank.append(p)
    return blank


def check_blank_inputs(paths: list[str], flag: str, expected: str) -> str | None:
    """InputError when every file of `paths` is blank; a warning naming the blank ones when
    some are (None when none is). `flag` and `expected` go into the message."""
    blank = blank_inputs(paths)
    if blank and len(blank) == len(paths):
        raise InputError(f"{flag}: {files_named(blank)}: no text (empty or blank); expected "
                         f"{expected}")
    if blank:
        return (f"{flag}: {len(blank)} of {len(paths)} input files hold no text (empty or "
                f"blank), they add nothing: {files_named(blank)}")
    return None


def resolve_inputs(spec: str) -> list[str]:
    paths = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if glob.has_magic(part):
            hits = bert_paths.glob(part)  # local or gs://, sorted
            if not hits:
                raise InputError(f"--input_file: no file matches {part!r}")
            paths.extend(hits)
        elif epath.Path(part).is_dir():
            raise InputError(f"--input_file: {part} is a directory (give files or a glob, "
                             f"e.g. {part.rstrip('/')}/*.txt)")
        elif not epath.Path(part).is_file():
            raise InputError(f"--input_file: file not found: {part}")
        else:
            paths.append(part)
    if not paths:
        raise InputError("--input_file: no input files given")
    for p in paths:
        if not is_uri(p) and not os.access(p, os.R_OK):
            raise InputError(f"--input_file: cannot read {p}")
    return paths


def resolve_outputs(spec: str, num_shards: int) -> list[str]:
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise InputError("--output_file: no output file given")
    if num_shards < 1:
        raise InputError(f"--num_output_shards must be >= 1 (got {num_shards})")
    if num_shards > 1:
        if len(parts) != 1:
            raise InputError("--num_output_shards needs a single --output_file name")
        name = parts[0]
        if "{shard" in name:
            parts = [name.format(shard=i, num_shards=num_shards) for i in range(num_shards)]
        else:
            parts = [f"{name}-{i:05d}-of-{num_shards:05d}" for i in range(num_shards)]
    if len(set(parts)) != len(parts):
        raise InputError(f"--output_file: duplicate output names {parts}")
    for p in parts:
        if epath.Path(p).is_dir():
            raise InputError(f"--output_file: {p} is a directory")
        blocker = bert_paths.file_in_the_way(os.path.dirname(bert_paths.resolve(p)))
        if blocker is not None:
            raise InputError(f"--output_file: {blocker} is a file, so {p} cannot be written "
                             f"there: pass another path")
    return parts
