"""What a corpus front door run writes and reports, on either runner (prepare_corpus.py's
local one, data_prep/beam/corpus.py): the output files' names, a kept document's text in
them, the Summary, and the refusal when no document is kept."""

from __future__ import annotations

import collections
import dataclasses
import os

from bert_jax import paths as bert_paths
from data_prep.corpus.types import DROP_REASONS, Options, PrepareError

# Notes of bad input a Summary keeps (the first ones); the rest are counted.
MAX_NOTES = 20


def format_document(sentences: list[str]) -> str:
    """A kept document's text in the output: a sentence per line, then a blank line."""
    return "\n".join(sentences) + "\n\n"


def output_paths(spec: str, num_shards: int) -> list[str]:
    """The local output files of --output and --num_output_shards (see Options.output);
    PrepareError for a URI, a bad count, or a file in the way of the folder."""
    if not spec:
        raise PrepareError("--output: no output given")
    if "://" in spec:
        raise PrepareError(f"--output={spec}: prepare_corpus reads and writes local files; "
                           f"on Beam (--runner) it writes to buckets")
    if num_shards < 1:
        raise PrepareError(f"--num_output_shards must be >= 1 (got {num_shards})")
    if spec.endswith(os.sep) or os.path.isdir(spec):
        prefix = os.path.join(spec, "corpus")
    elif num_shards == 1:
        prefix = None
    else:
        prefix = spec[:-4] if spec.endswith(".txt") else spec
    outputs = ([spec] if prefix is None else
               [f"{prefix}-{i:05d}-of-{num_shards:05d}.txt" for i in range(num_shards)])
    blocker = bert_paths.file_in_the_way(os.path.dirname(os.path.abspath(outputs[0])))
    if blocker is not None:
        raise PrepareError(f"--output={spec}: {blocker} is a file, so nothing can be written "
                           f"there: pass another path")
    return outputs


@dataclasses.dataclass
class Summary:
    """A run's counts, its notes of bad input and its output files; `text()` is what the
    command prints."""
    documents: int = 0
    kept: int = 0
    dropped: dict = dataclasses.field(
        default_factory=lambda: collections.Counter({r: 0 for r in DROP_REASONS}))
    bad: list = dataclasses.field(default_factory=list)   # notes of bad input (MAX_NOTES)
    sentences: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    outputs: list = dataclasses.field(default_factory=list)

    def drop(self, reason: str, note: str = "") -> None:
        """A document dropped for `reason` (DROP_REASONS); the first MAX_NOTES notes of bad
        input are kept."""
        self.dropped[reason] += 1
        if note and len(self.bad) < MAX_NOTES:
            self.bad.append(note)

    def keep(self, sentences: int, nbytes: int) -> None:
        """A document kept: `sentences` sentences, `nbytes` bytes of output text."""
        self.kept += 1
        self.sentences += sentences
        self.bytes_out += nbytes

    def text(self) -> str:
        rate = self.bytes_in / 1e6 / self.seconds if self.seconds else 0.0
        lines = [f"documents in     {self.documents:,}",
                 f"kept             {self.kept:,}"]
        lines += [f"dropped, {r + ':':<16} {self.dropped[r]:,}" for r in DROP_REASONS]
        lines += [f"sentences        {self.sentences:,}",
                  f"bytes in         {self.bytes_in:,}",
                  f"bytes out        {self.bytes_out:,}",
                  f"seconds          {self.seconds:.1f}",
                  f"MB/s             {rate:.2f}"]
        n_bad = self.dropped["bad input"]
        lines += [f"bad input: {note}" for note in self.bad]
        if n_bad > len(self.bad):
            lines.append(f"bad input: ... and {n_bad - len(self.bad)} more")
        return "\n".join(lines)


def nothing_usable(o: Options, summary: Summary) -> str:
    """The refusal when no document is kept."""
    dropped = ", ".join(f"{r} {n}" for r, n in summary.dropped.items() if n)
    first = f"; {summary.bad[0]}" if summary.bad else ""
    return (f"--input={o.input}: nothing usable: {summary.documents} document(s) read, "
            f"none kept ({dropped or 'no documents'}){first}; {o.output} not written")
