"""Paths of workdirs, checkpoints and model directories: local paths or URIs.

On Cloud TPU the workdir is usually a bucket (`--workdir=gs://bucket/run`): every host
must see the same checkpoints, and a TPU VM's disk goes when the VM does. Local paths are
made absolute (user and relative parts resolved); URIs are kept as they are, never passed
through `os.path.abspath` (which would turn gs://b/run into ./gs:/b/run, a local folder).
File operations on either go through `etils.epath` (local files, or TensorFlow's gfile /
fsspec for gs://, s3://, ...), as orbax's own do.
"""

from __future__ import annotations

import contextlib
import glob as _glob
import io
import os
import shutil
import tempfile
from typing import Iterator, Optional, TextIO

from etils import epath

from bert_jax.errors import UserError


def is_uri(path) -> bool:
    return "://" in str(path)


def resolve(path) -> str:
    """An absolute local path, or the URI itself (without a trailing slash)."""
    path = str(path)
    return path.rstrip("/") if is_uri(path) else os.path.abspath(os.path.expanduser(path))


def join(path, *parts) -> str:
    return os.path.join(resolve(path), *parts)


def is_dir(path) -> bool:
    return epath.Path(path).is_dir()


def is_file(path) -> bool:
    return epath.Path(path).is_file()


def makedirs(path) -> None:
    epath.Path(path).mkdir(parents=True, exist_ok=True)


def file_in_the_way(path) -> Optional[str]:
    """The file that stands at local `path` or at a folder above it (so that no folder can
    be made there), or None. URIs: None (buckets have no folders to block)."""
    path = resolve(path)
    if is_uri(path):
        return None
    here = path
    while not os.path.exists(here):
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up
    return None if os.path.isdir(here) else here


def check_dir(path, flag: str = "--workdir") -> None:
    """Raises UserError (one line naming `flag`) when `path` cannot be a directory: it, or
    a local folder above it, is a file. Creates nothing."""
    path = resolve(path)
    blocker = file_in_the_way(path)
    if blocker is None and is_uri(path) and epath.Path(path).is_file():
        blocker = path
    if blocker == path:
        raise UserError(f"{flag}={path} is a file, not a directory: pass a directory (it is "
                        f"created if missing)")
    if blocker is not None:
        raise UserError(f"{flag}={path}: {blocker} is a file, so no directory can be made "
                        f"there: pass another path")


def glob(pattern) -> list[str]:
    """Sorted matches of a glob pattern, local (`~` expanded) or a URI (matches named by URI).
    Directories included, as glob.glob does."""
    pattern = str(pattern)
    if not is_uri(pattern):
        return sorted(_glob.glob(os.path.expanduser(pattern)))
    # epath globs relative to a directory: split at the first component with a wildcard.
    scheme, rest = pattern.split("://", 1)
    parts = rest.split("/")
    first = next((i for i, x in enumerate(parts) if _glob.has_magic(x)), None)
    if first is None:
        return [pattern] if exists(pattern) else []
    base = epath.Path(f"{scheme}://" + "/".join(parts[:first]))
    if not base.is_dir():
        return []
    return sorted(str(p) for p in base.glob("/".join(parts[first:])))


def exists(path) -> bool:
    return epath.Path(path).exists()


def rmtree(path) -> None:
    """Removes a directory tree if it is there (local or URI)."""
    p = epath.Path(path)
    if p.exists():
        p.rmtree()


def rename(src, dst) -> None:
    """Moves a file or a directory onto a name that must not exist. Atomic for local paths;
    on Cloud Storage a directory moves object by object (the writers here keep their
    previous copy until the new one is complete)."""
    epath.Path(src).rename(dst)


def copy_file(src, dst) -> None:
    """Copies a file between any two places (a local file into a bucket, say), streamed.
    Written straight to `dst` (parents made): an object in a bucket appears whole when its
    upload ends."""
    epath.Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with epath.Path(src).open("rb") as f, epath.Path(dst).open("wb") as g:
        shutil.copyfileobj(f, g, 16 << 20)


@contextlib.contextmanager
def open_text(path, newline: Optional[str] = None) -> Iterator[TextIO]:
    """A UTF-8 text file for reading, local or URI. `newline` as for `open` (the csv module
    wants ""): a URI's file is read whole and served from memory, since remote file objects
    do not take that argument."""
    if is_uri(path):
        yield io.StringIO(epath.Path(path).read_bytes().decode("utf-8"), newline=newline)
    else:
        with open(path, encoding="utf-8", newline=newline) as f:
            yield f


@contextlib.contextmanager
def write_atomic(path, mode: str = "w") -> Iterator[TextIO]:
    """Writes PATH.tmp (parents made as needed), then moves it onto PATH: readers never see a
    half-written file, and an exception leaves PATH as it was. Local or URI."""
    target = epath.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = epath.Path(f"{path}.tmp")
    kwargs = {} if "b" in mode else {"encoding": "utf-8"}
    try:
        with tmp.open(mode, **kwargs) as f:
            yield f
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise
    tmp.replace(target)


@contextlib.contextmanager
def staged_dir(output) -> Iterator[str]:
    """A local folder to write OUTPUT's files into with plain file APIs (safetensors, a TF
    checkpoint writer), put in place whole when the block ends without an error: OUTPUT.tmp
    renamed for a local OUTPUT; for a URI, a local temporary folder uploaded to OUTPUT.tmp,
    then renamed. An existing OUTPUT is refused before anything is written."""
    output = resolve(output)
    if exists(output):
        raise FileExistsError(f"{output} already exists; refusing to overwrite it")
    remote = is_uri(output)
    local = tempfile.mkdtemp(prefix="bert_jax-stage-") if remote else output + ".tmp"
    if not remote:
        shutil.rmtree(local, ignore_errors=True)
        os.makedirs(local)
    try:
        yield local
        if remote:
            rmtree(output + ".tmp")
            for dirpath, _, files in os.walk(local):
                rel = os.path.relpath(dirpath, local)
                target = epath.Path(output + ".tmp") / ("" if rel == "." else rel)
                target.mkdir(parents=True, exist_ok=True)
                for name in files:
                    copy_file(os.path.join(dirpath, name), target / name)
            rename(output + ".tmp", output)
        else:
            os.replace(local, output)
    finally:
        if remote or os.path.exists(local):
            shutil.rmtree(local, ignore_errors=True)
