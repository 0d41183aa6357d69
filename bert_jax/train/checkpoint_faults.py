"""What a checkpoint fault leaves behind and how it is told: the error classes, the one-line
reason, the failed save's temporary folder, a damaged step set aside.

    raise save_failed(directory, step, error, last_good)   # CheckpointSaveError, one line
    reason = describe(error)        # "no space left on device", or the error's first line
    moved = set_aside(directory, 8) # checkpoints/8 -> checkpoints/8.damaged (never deleted)

A failed save or restore of orbax prints ~50-200 tracebacks on its way out, none of them
news once the run reports the fault in one line: orbax logs each failure of its background
threads with its traceback; it runs the writes (reads) as asyncio tasks on a loop it closes
as soon as one of them fails, so tensorstore's completion of the others calls into a closed
loop ("Event loop is closed", through sys.unraisablehook), and the tasks left suspended are
finalized at exit, when their cleanup can no longer import anything ("sys.meta_path is
None"), or report an exception nobody read (asyncio's logger). `quiet_orbax_errors()`
(installed by the first Checkpointer) drops exactly these records and prints, and `release`
collects the stranded tasks while the interpreter is alive. With absl's verbosity at INFO or
below (--verbosity=0) orbax's own error logs are kept. It also drops orbax's warning that a
preemption sync point was reached: the loop's own line says it.
"""

from __future__ import annotations

import atexit
import errno
import gc
import logging
import os
import re
import sys
from typing import Optional

from bert_jax import paths
from bert_jax.errors import FaultError, UserError

log = logging.getLogger(__name__)

# orbax writes step N under this name and renames it to N once every item is written.
TMP_SUFFIX = ".orbax-checkpoint-tmp"
DAMAGED_SUFFIX = ".damaged"


class CheckpointSaveError(FaultError, OSError):
    """A checkpoint could not be written (disk full, permissions, a lost bucket); the run
    stopped at the step it noticed, and the previous checkpoints are kept. `process`: the
    process whose part of the save failed (several processes), if known."""

    def __init__(self, message: str, process: Optional[int] = None):
        super().__init__(message)
        self.process = process

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DamagedCheckpointError(FaultError, OSError):
    """A checkpoint that cannot be read back (a truncated or missing file)."""


class CheckpointMismatchError(UserError, ValueError):
    """A checkpoint of another model (other parameter shapes) than the run's config."""


def describe(error: BaseException) -> str:
    """The cause of `error` in a few words: the OS error's text for an errno found anywhere
    in its chain (tensorstore reports one as "[os_error_code='28']"), else the first line
    of the innermost error (orbax wraps tensorstore's, which names the file and the fault)."""
    chain = []
    e: Optional[BaseException] = error
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        code = e.errno if isinstance(e, OSError) and e.errno else None
        if code is None:
            m = re.search(r"os_error_code='?(\d+)", str(e))
            code = int(m.group(1)) if m else None
        if code:
            text = os.strerror(code).lower() if code in errno.errorcode else f"OS error {code}"
            name = getattr(e, "filename", None)
            return f"{text}: {name}" if name else text
    root = chain[-1]
    first = (str(root).strip().splitlines() or [""])[0].split(" [tensorstore_spec=")[0]
    first = first if len(first) <= 300 else first[:297] + "..."
    if type(root) in (ValueError, RuntimeError, Exception) and first:
        return first  # a wrapper's type says nothing; tensorstore's message starts with a code
    return f"{type(root).__name__}: {first}" if first else type(root).__name__


def cause(error: BaseException, kind: type) -> Optional[BaseException]:
    """The first error of type `kind` in `error`'s chain (itself included), or None."""
    seen, e = set(), error
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def release(error: BaseException) -> None:
    """Drops the frames held by `error` and its chain, then collects them now (see the
    module docstring); the error keeps its type and message."""
    seen = set()
    e: Optional[BaseException] = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
    gc.collect()
    release_at_exit()


def release_at_exit() -> None:
    """`gc.collect()` once more at exit, before modules are torn down: a task whose write
    ended after `release` is collected then, quietly, rather than during teardown."""
    if not getattr(release_at_exit, "registered", False):
        atexit.register(gc.collect)
        release_at_exit.registered = True


def _orbax_error_with_traceback(record: logging.LogRecord) -> bool:
    return (record.levelno >= logging.ERROR and bool(record.exc_info)
            and f"{os.sep}orbax{os.sep}" in record.pathname
            and logging.getLogger("absl").getEffectiveLevel() > logging.INFO)


def _orbax_preemption_note(record: logging.LogRecord) -> bool:
    # orbax's warning that jax's preemption sync picked this step (its save checks it too):
    # the loop's own line says so, once per process.
    return (f"{os.sep}orbax{os.sep}" in record.pathname
            and "Reached preemption sync point" in record.getMessage())


def orbax_async_garbage(record: logging.LogRecord) -> bool:
    # asyncio's report of a task or future of orbax's reads / writes (tensorstore's OCDBT
    # files) that it finalized unfinished or with an exception nobody read. A bare future
    # names no coroutine: its exception's traceback then shows where it came from (seen
    # once in 19 restarts from a damaged checkpoint: orbax's _read_array_index_and_device_put).
    text = record.getMessage()
    if f"{os.sep}orbax{os.sep}" in text or "OCDBT" in text:
        return True
    exc = record.exc_info[1] if record.exc_info else None
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        if f"{os.sep}orbax{os.sep}" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _orbax_unraisable(unraisable) -> bool:
    """An error raised where nobody can catch it, by orbax's stranded tasks: the closed-loop
    wake-up from tensorstore's C callback (no Python caller above asyncio's
    call_soon_threadsafe), or an orbax coroutine failing as it is finalized."""
    exc, tb, obj = unraisable.exc_value, unraisable.exc_traceback, unraisable.object
    if (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
            and tb is not None and tb.tb_frame.f_code.co_name == "call_soon_threadsafe"):
        return True
    code = getattr(obj, "cr_code", None)
    return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


def quiet_orbax_errors() -> None:
    """Installs, once per process, the filters described in the module docstring (each
    matches only orbax's records and errors; everything else passes unchanged)."""
    if getattr(quiet_orbax_errors, "installed", False):
        return
    quiet_orbax_errors.installed = True
    logging.getLogger("absl").addFilter(lambda r: not _orbax_error_with_traceback(r)
                                        and not _orbax_preemption_note(r))
    logging.getLogger("asyncio").addFilter(lambda r: not orbax_async_garbage(r))
    previous = sys.unraisablehook

    def unraisablehook(unraisable):
        if not _orbax_unraisable(unraisable):
            previous(unraisable)

    sys.unraisablehook = unraisablehook


def temporary_dirs(directory: str, step: int) -> list[str]:
    """The unfinished folders of a save of `step` (orbax: N.orbax-checkpoint-tmp[-<time>])."""
    return paths.glob(paths.join(directory, f"{step}{TMP_SUFFIX}*"))


def save_failed(directory: str, step: int, error: BaseException,
                last_good: Optional[int]) -> CheckpointSaveError:
    """The one-line error of a failed save of `step`, after removing its temporary folder
    (a full disk stays full otherwise). Earlier checkpoints are not touched."""
    reason = describe(error)
    release(error)
    removed = []
    for tmp in temporary_dirs(directory, step):
        try:
            paths.rmtree(tmp)
            removed.append(tmp)
        except OSError as e:  # another process of the run may have removed it first
            log.warning("could not remove %s: %s", tmp, e)
    where = (f"{', '.join(removed)}, removed" if removed
             else paths.join(directory, str(step)))
    good = (f"last good checkpoint: {last_good}; free the space (or fix the cause) and run "
            f"the same command again to resume from it" if last_good is not None else
            "no earlier checkpoint; free the space (or fix the cause) and run again")
    return CheckpointSaveError(f"checkpoint at step {step} failed: {reason} ({where}); {good}")


def set_aside(directory: str, step: int) -> str:
    """Renames checkpoints/<step> to <step>.damaged (or .damaged-2, ...), a name orbax does
    not list: kept for inspection, never deleted by the keep-N policy, and the resumed run
    can save that step again. Returns the new path."""
    src = paths.join(directory, str(step))
    dst, n = src + DAMAGED_SUFFIX, 1
    while paths.exists(dst):
        n += 1
        dst = f"{src}{DAMAGED_SUFFIX}-{n}"
    paths.rename(src, dst)
    return dst
