"""Input files: globs, per-host shares, and the scans that find corrupt shards.

TF's TFRecord reader names no file in its errors ("truncated record at 370588"), and it
takes a file cut inside a 12-byte record header for a clean end. So:
  * by default the training iterator, on a DataLossError, scans this host's files that are
    longer than the offset in the message and raises CorruptShardError naming them;
  * `data.skip_corrupt=True` scans this host's files once before training (every record:
    framing, CRCs, and the records' total size against the file size), leaves the corrupt
    ones out and logs each with its error and readable-record count, plus a summary count;
  * evaluation counts (and so verifies) every record of its files up front.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
from typing import Sequence

import numpy as np
import tensorflow as tf

from bert_jax.errors import FaultError, UserError

log = logging.getLogger(__name__)


class CorruptShardError(UserError, RuntimeError):
    """A TFRecord file is truncated or corrupt."""


class InputReadError(FaultError, OSError):
    """The input files could not be read mid-run (a file gone, no permission, a bucket out
    of reach)."""


# ---------------------------------------------------------------- files and sharding


class NoInputError(UserError, FileNotFoundError):
    """A glob of input files matches nothing, or no glob was given."""


def expand_files(patterns: str | Sequence[str], key: str = "") -> list[str]:
    """Sorted, de-duplicated files matching comma-separated globs (or a list of them).

    Raises NoInputError naming `key` (the config key or flag that gave the globs, such as
    "data.train_files") and the glob that matches nothing.
    """
    if isinstance(patterns, str):
        patterns = [p for p in patterns.split(",")]
    patterns = [p.strip() for p in patterns if p and p.strip()]
    where = f"{key}: " if key else ""
    if not patterns:
        raise NoInputError(f"{where}no input files given; expected comma-separated globs of "
                           f"TFRecord files")
    files = set()
    for pattern in patterns:
        found = tf.io.gfile.glob(pattern)
        if not found:
            raise NoInputError(f"{where}the glob {pattern!r} matches no file; check the path "
                               f"(comma-separated globs, local or gs://)")
        files.update(found)
    return sorted(files)


def shard_files(files: Sequence[str], process_index: int,
                process_count: int) -> tuple[list[str], bool]:
    """This host's share: (files, record_level).

    File-level sharding (host i reads files i, i+P, i+2P, ... of the sorted list) when there
    are at least as many files as hosts: every byte is read by exactly one host. With fewer
    files than hosts, every host reads every file and keeps every P-th record (record_level
    True): still disjoint and complete, but each host reads all the data, so it is only a
    fallback (a warning says so) for small data on many hosts.
    """
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if len(files) >= process_count:
        if len(files) % process_count:
            log.warning("%d input files over %d hosts: hosts get %d or %d files each",
                        len(files), process_count, len(files) // process_count,
                        len(files) // process_count + 1)
        return list(files[process_index::process_count]), False
    log.warning(
        "only %d input file(s) for %d hosts: falling back to record-level sharding (every "
        "host reads every file and keeps 1/%d of the records). Write at least %d shards to "
        "avoid the extra reading.", len(files), process_count, process_count, process_count)
    return list(files), True


# ---------------------------------------------------------------- corrupt files


def _framed_bytes(path: str) -> tuple[int, int]:
    """(records, bytes they occupy in the file incl. the 16 bytes of framing each)."""
    def add(acc, record):
        return acc[0] + 1, acc[1] + 16 + tf.cast(tf.strings.length(record), tf.int64)
    n, size = tf.data.TFRecordDataset(path).reduce((np.int64(0), np.int64(0)), add)
    return int(n), int(size)


def scan_file(path: str) -> tuple[int, str | None]:
    """(readable records, error message or None): reads every record (framing and CRCs,
    no parsing) and checks that they end exactly at the end of the file. The size check
    catches a file cut inside a record header, which TF's reader takes for a clean end."""
    try:
        count, framed = _framed_bytes(path)
    except tf.errors.OpError as e:
        good = tf.data.TFRecordDataset(path).ignore_errors().reduce(np.int64(0),
                                                                      lambda n, _: n + 1)
        return int(good), short_error(e)
    size = tf.io.gfile.stat(path).length
    if framed != size:
        return count, (f"the file has {size} bytes but its {count} records end at byte "
                       f"{framed}: truncated inside a record header (or trailing garbage)")
    return count, None


def short_error(error: Exception | str) -> str:
    """TF's error text without its graph-function prefix and op suffix, and a TFRecord
    reader's "truncated record at 250190' failed with Read less bytes than requested" as
    "truncated record at byte 250190 (read less bytes than requested)"."""
    message = error if isinstance(error, str) else getattr(error, "message", str(error))
    message = re.sub(r"\{\{function_node[^}]*\}\}\s*", "", message)
    message = re.sub(r"\s*\[\[\{\{node [^}]*\}\}\]\]", "", message)  # the graph node
    message = " ".join(message.split(" [Op:")[0].split())  # one line
    message = re.sub(r"Error in user-defined function passed to \S+ transformation with "
                     r"iterator: \S+: (Name: <unknown>, )?", "", message).rstrip(".")
    found = _RECORD_AT.search(message)
    if found:
        reason = found.group(3) or found.group(4)
        message = (f"{found.group(1)} record at byte {found.group(2)}"
                   + (f" ({reason[:1].lower() + reason[1:]})" if reason else ""))
    return message


# TF's TFRecord reader: "truncated record at 250190' failed with <why>" (a stray quote from
# its own formatting) or "corrupted record at 0 (Is this even a TFRecord file?)".
_RECORD_AT = re.compile(r"(truncated|corrupted) record at (\d+)'?(?: failed with (.+?)\.?$|"
                        r" \((.+)\))?")


def scan_files(files: Sequence[str], threads: int = 8) -> dict[str, tuple[int, str | None]]:
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return dict(zip(files, pool.map(scan_file, files)))


def find_corrupt(files: Sequence[str], error: Exception) -> list[tuple[str, int, str]]:
    """The files among `files` that fail to read: [(file, good records, error)].

    Only files longer than the byte offset named in the error are scanned.
    """
    offset = re.search(r"record at (\d+)", str(error))
    candidates = list(files)
    if offset:
        need = int(offset.group(1))
        candidates = [f for f in files if tf.io.gfile.stat(f).length > need]
    found = scan_files(candidates)
    return [(f, n, e) for f, (n, e) in found.items() if e is not None]


def drop_corrupt(files: Sequence[str]) -> tuple[list[str], list[tuple[str, int, str]]]:
    """`data.skip_corrupt=True`: scans `files` once, returns (good files, skipped)."""
    found = scan_files(files)
    bad = [(f, n, e) for f, (n, e) in found.items() if e is not None]
    for f, n, e in bad:
        log.warning("skipping corrupt shard %s (%s; %d readable records)", f, e, n)
    if bad:
        log.warning("skip_corrupt: skipped %d of %d shards", len(bad), len(files))
    good = [f for f in files if found[f][1] is None]
    if not good:
        raise CorruptShardError(f"all {len(files)} input shards are corrupt: "
                                + "; ".join(f"{f}: {e}" for f, _, e in bad[:5]))
    return good, bad


def count_records(files: Sequence[str], threads: int = 8) -> dict[str, int]:
    """Number of records of each file (reads and verifies them; for evaluation sets)."""
    def count(path):
        n, error = scan_file(path)
        if error:
            raise CorruptShardError(f"{path}: {error}")
        return n
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return dict(zip(files, pool.map(count, files)))
