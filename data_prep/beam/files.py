"""Files as both pipelines read and write them, through Beam's FileSystems (local, gs://,
s3://, hdfs://): raw bytes (no compression guessed from a name, as the local runners read
them), output files written under temporary names and swapped in at the end."""

from __future__ import annotations

from typing import Sequence

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems


def open_raw(path: str):
    """A file's bytes as the local runners read them: no decompression guessed from the
    name."""
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def create_raw(path: str):
    """A new file, written as given (no compression from the name)."""
    return FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)


def write_in_order(item, tmp_paths: Sequence[str]):
    """(output file f, [(position, bytes)]) -> tmp_paths[f] holding the parts in position
    order; yields f."""
    f, parts = item
    with create_raw(tmp_paths[f]) as out:
        for _, part in sorted(parts, key=lambda t: t[0]):
            out.write(part)
    yield f


def swap_in(tmp_paths: Sequence[str], final_paths: Sequence[str]) -> None:
    """Each temporary file renamed to its final name, over an older file; a temporary file
    that no step wrote (no record or document for it) becomes an empty file, as locally."""
    for t, final in zip(tmp_paths, final_paths):
        if not FileSystems.exists(t):
            create_raw(t).close()
        if FileSystems.exists(final):
            FileSystems.delete([final])
        FileSystems.rename([t], [final])


def delete_present(paths: Sequence[str]) -> None:
    """Deletes those of `paths` that exist (what a failed or finished run leaves)."""
    stale = [p for p in paths if FileSystems.exists(p)]
    if stale:
        FileSystems.delete(stale)
