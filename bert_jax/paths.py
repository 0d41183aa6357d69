"""Paths of workdirs, checkpoints and model directories: local paths or URIs.

On Cloud TPU the workdir is usually a bucket (`--workdir=gs://bucket/run`): every host
must see the same checkpoints, and a TPU VM's disk goes when the VM does. Local paths are
made absolute (user and relative parts resolved); URIs are kept as they are, never passed
through `os.path.abspath` (which would turn gs://b/run into ./gs:/b/run, a local folder).
File operations on either go through `etils.epath` (local files, or TensorFlow's gfile /
fsspec for gs://, s3://, ...), as orbax's own do.
"""

from __future__ import annotations

import os

from etils import epath


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
