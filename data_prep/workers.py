"""What the two local runners (data_prep/pipeline.py's records, prepare_corpus's text) share
about their worker processes: whether this process may fork them, and the work of an input
stream done by a pool and taken back in input order, a bounded amount of it at a time.
"""

from __future__ import annotations

import collections
import sys
from typing import Callable, Iterable, Iterator

# Runtimes whose thread pools do not survive fork(): once one is loaded, workers are spawned.
# (OpenBLAS's threads, which numpy starts at import, are fork-safe: it re-creates them.)
NOT_FORK_SAFE = ("tensorflow", "jaxlib", "torch")


def fork_safe() -> bool:
    """Whether this process may fork workers: none of NOT_FORK_SAFE is loaded. A forked
    child can block for ever on a lock or a thread that only the parent has (seen: a
    tf.data iterator collected in a forked worker waited on its prefetch threads)."""
    return not any(name in sys.modules for name in NOT_FORK_SAFE)


def ordered(pool, fn: Callable, jobs: Iterable[tuple[tuple, object]], in_flight: int
            ) -> Iterator[tuple[object, object]]:
    """(fn(*args), tag) for each (args, tag) of `jobs`, in their order, computed in `pool`
    (a concurrent.futures executor) with at most `in_flight` jobs submitted and not yet
    taken: the input is read only that far ahead (Pool.imap would read all of it into its
    task queue). A job's exception is raised where its result is taken."""
    pending = collections.deque()

    def take():
        future, tag = pending.popleft()
        return future.result(), tag

    for args, tag in jobs:
        pending.append((pool.submit(fn, *args), tag))
        if len(pending) >= in_flight:
            yield take()
    while pending:
        yield take()
