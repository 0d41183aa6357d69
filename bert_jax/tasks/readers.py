"""What every task's reader (bert_jax/tasks/<task>/reader.py) shares: the error of input
that does not have its format, and tensorflow-datasets builders that say where to get the
data when they cannot download it. Readers raise early, naming the file and line.
"""

from __future__ import annotations

from typing import Optional

from bert_jax.errors import UserError


class DataError(UserError, ValueError):
    """Input data that does not have the expected format; the message names the place."""


def some(examples: list, path: str, none: str, expected: str) -> list:
    """`examples`, or a DataError naming `path` when there are none: an empty file or one
    with only a header reads as "no examples", never as an empty (then silent) set."""
    if not examples:
        raise DataError(f"{path}: {none}; expected {expected}")
    return examples


def tfds_builder(name: str, data_dir: Optional[str], remedy: str):
    """tfds.builder(name), its data downloaded and prepared first when it is not there yet
    (as tfds.load does); a failed download is a DataError naming `remedy` (where to get
    the files and which flag to set), not tfds' own advice."""
    import tensorflow_datasets as tfds

    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        try:
            builder.download_and_prepare()
        except Exception as e:  # noqa: BLE001  no network, no access, a missing extra, ...
            why = " ".join(str(e).split())[:200]
            raise DataError(f"tfds {name} is not in {builder.data_dir} and downloading it "
                            f"failed ({type(e).__name__}: {why}); {remedy}") from e
    return builder
