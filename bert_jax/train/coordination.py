"""The processes of one run watching each other through jax's coordination service (its
key-value store, hosted by process 0): a lost process ends every other one in one line,
and a save that fails on one process releases the others' wait for it at once.

    coordination.start(timeout=60, workdir=...)   # runtime.initialize, with jax.distributed
    coordination.watch(workdir, step)   # the loop: the run and step the one line names
    coordination.explain(error)         # a failed collective: wait for the verdict (exit 1)
    AsyncOptions(barrier_sync_fn=coordination.save_barrier)   # orbax's commit barriers
    coordination.save_failed(step)      # this process's part of that save failed

A lost process (killed, out of memory, its host gone). jax's own heartbeat finds it, but
then the distributed client ends every other process with a C++ check failure and its stack
(SIGABRT), after up to its heartbeat timeout; the callback that would replace that cannot be
set from Python. So each process also increments its own counter in the store every
`interval` seconds (a daemon thread, `Watchdog`). A peer whose counter has not moved for
`timeout` seconds is lost, and so is process 0 when the store cannot be reached for as
long; this process then prints one line (supervise.lost_line: the process, the step, the
last complete checkpoint on disk, the command that resumes), writes what it knows to its
log file (bert_jax.supervise) and leaves at once with exit code 1 (`os._exit`: the
distributed shutdown would wait for the lost process, then abort). jax's heartbeat timeout
is set to twice ours, so its abort never comes first (when process 0 itself is lost, the
client's abort comes at once: the supervising parent, bert_jax.supervise, turns it into the
same line). A collective that fails (gloo reports a peer's closed connection at once), or a
save barrier that waits long, makes the wait a few beats (`suspect`, `explain`).

A failed save. orbax ends each save's background thread at two barriers of every process
(`async_write_complete`, `async_commit_complete`); when one process's writes fail, the
others would wait there until orbax's timeout. `save_barrier` waits on the store instead,
and gives up as soon as a process has marked that step failed (`save_failed`) or has gone
past the barrier without arriving (its save failed in the background).
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import tempfile
import threading
import time
import traceback
from typing import Optional

from bert_jax import supervise
from bert_jax.errors import FaultError, ReportedError

BEAT = "bert_jax/beat/"           # + process: its counter
LOST = "bert_jax/lost"            # the lost process, once one survivor has named it
SAVE_FAILED = "bert_jax/save_failed/"   # + step: the process whose part of it failed
BARRIER = "bert_jax/barrier/"     # + key/use/process: arrivals
AT = "bert_jax/at/"               # + process: the barrier it waits at ("use#key")
# orbax's barriers of one save's commit; its other barriers are bookkeeping that every
# process finishes whatever the save's outcome.
COMMIT_BARRIERS = ("async_write_complete", "async_commit_complete")


class SaveFailedElsewhere(OSError):
    """The save of `step` failed on process `process`: this process stopped waiting for it."""

    def __init__(self, step: int, process: int):
        super().__init__(f"the save of step {step} failed on process {process}")
        self.step, self.process = step, process


class ProcessLost(FaultError):
    """Another process of the run was lost (the message names it)."""


def client():
    """jax's coordination-service client (orbax reaches it the same way: jax has no public
    handle), or None without jax.distributed."""
    from jax._src import distributed

    return distributed.global_state.client


def _get(store, key: str) -> Optional[str]:
    try:
        return store.key_value_try_get(key)
    except Exception:  # noqa: BLE001  (NOT_FOUND, or a store that cannot be reached)
        return None


class Watchdog:
    """Every `interval` seconds (a daemon thread) increments this process's counter in the
    store and reads everyone's; a peer whose counter has not moved for `timeout` seconds is
    lost (after `suspect`: for `quick` seconds), as is process 0 when the store cannot be
    reached for as long. `check` returns (process, why) or None; the thread reports it."""

    def __init__(self, store, process: int, count: int, timeout: float,
                 workdir: Optional[str] = None, verbose: bool = False):
        self.store, self.process, self.count = store, process, count
        self.timeout = float(timeout)
        # 30 beats per timeout (a dead peer's counter stops between two of them), at most
        # one RPC pair a second and at least one every 5 s per process.
        self.interval = min(max(self.timeout / 30, 1.0), 5.0)
        self.quick = min(self.timeout, max(5.0, 3 * self.interval))
        self.workdir, self.step, self.verbose = workdir, None, verbose
        self.leaving = False
        self.error: Optional[BaseException] = None    # what made this process suspect
        self._suspect_until = 0.0   # monotonic time: till then, a peer silent `quick` s is lost
        self._unreachable_since: Optional[float] = None
        now = time.monotonic()
        self._moved = {p: (None, now) for p in range(count) if p != process}
        self._thread = threading.Thread(target=self._run, name="bert_jax-watchdog",
                                        daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        # Once the process is leaving (atexit, before jax's own shutdown: they run last
        # registered first), it goes on beating for the others but judges no one: a peer
        # may still be finishing, and this process waits for it at jax's shutdown barrier.
        atexit.register(self.leave)
        return self

    def leave(self) -> None:
        self.leaving = True

    def _run(self) -> None:
        while True:
            time.sleep(self.interval)
            verdict = self.check(time.monotonic())
            if verdict is not None and not self.leaving:
                self.report(*verdict)

    def suspect(self, error: Optional[BaseException] = None) -> None:
        """A collective failed, or a barrier waits long: a peer may be gone. For the next
        `quick` seconds and two beats, a peer silent for `quick` seconds is lost (a live one
        beats on: its thread does not wait for its main thread)."""
        if error is not None:
            self.error = error
        self._suspect_until = time.monotonic() + self.quick + 2 * self.interval

    def check(self, now: float) -> Optional[tuple[int, str]]:
        limit = self.quick if now < self._suspect_until else self.timeout
        try:
            self.store.key_value_increment(f"{BEAT}{self.process}", 1)
            beats = dict(self.store.key_value_dir_get(BEAT))
        except Exception:  # noqa: BLE001  (process 0's service is gone)
            if self._unreachable_since is None:
                self._unreachable_since = now
            if self.process != 0 and now - self._unreachable_since >= limit:
                return 0, (f"the coordination service it hosts did not answer for "
                           f"{now - self._unreachable_since:.0f} s")
            return None
        self._unreachable_since = None
        named = _get(self.store, LOST)
        if named is not None and int(named) != self.process:
            return int(named), "named by another process"
        for peer, (last, since) in self._moved.items():
            value = beats.get(f"{BEAT}{peer}")
            if value != last:
                self._moved[peer] = (value, now)
            elif now - since >= limit:
                return peer, f"no heartbeat for {now - since:.0f} s"
        return None

    def report(self, peer: int, why: str) -> None:
        """Prints the one line, keeps the details in the log file, and leaves (exit 1)."""
        try:
            self.store.key_value_set(LOST, str(peer))
        except Exception:  # noqa: BLE001  (named already, or no store)
            pass
        log = self.write_log(peer, why)
        if self.verbose and self.error is not None:
            traceback.print_exception(self.error)
        _say("error: " + supervise.lost_line(peer, self.count, why, self.workdir, sys.argv,
                                             self.step, log))
        if self.process == 0 and self.count > 2:
            time.sleep(2 * self.interval)  # the others read the verdict in this process's store
        os._exit(ProcessLost.exit_code)

    def write_log(self, peer: int, why: str) -> Optional[str]:
        """The log file (the supervising parent's, else one in the temporary folder): the
        lost process and the traceback of the collective that failed, if one did."""
        path = os.environ.get(supervise.CHILD) or os.path.join(
            tempfile.gettempdir(), f"bert_jax-process_{self.process}-{os.getpid()}.log")
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} process {peer} lost ({why}) "
                        f"at step {self.step}\n")
                if self.error is not None:
                    f.write("".join(traceback.format_exception(self.error)))
            return path
        except OSError:
            return None


def _say(line: str) -> None:
    """`line` on stderr, above a progress bar if one is drawn."""
    try:
        from tqdm import tqdm

        tqdm.write(line, file=sys.stderr)
    except Exception:  # noqa: BLE001
        print(line, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()


# The process's one watchdog (one per process, like jax.distributed's own client state).
_WATCHDOG: Optional[Watchdog] = None


def start(timeout: float, workdir: Optional[str] = None, verbose: bool = False
          ) -> Optional[Watchdog]:
    """Starts this process's watchdog (several processes only; once)."""
    global _WATCHDOG
    import jax

    store = client()
    if _WATCHDOG is None and store is not None and jax.process_count() > 1:
        _WATCHDOG = Watchdog(store, jax.process_index(), jax.process_count(), timeout,
                             workdir, verbose).start()
    return _WATCHDOG


def watch(workdir: Optional[str] = None, step: Optional[int] = None) -> None:
    """What the lost line names: the run's workdir (a fine-tuning sweep: the run's own) and
    the last step this process finished."""
    if _WATCHDOG is not None:
        if workdir is not None:
            _WATCHDOG.workdir = workdir
        _WATCHDOG.step = step


# How a collective whose peer is gone fails (gloo on CPU, NCCL on GPU), whatever the type
# jax raises it as.
COLLECTIVE = re.compile(r"Gloo|NCCL|collective|Connection (?:reset|closed) by peer|heartbeat",
                        re.I)


def collective_failure(error: BaseException) -> bool:
    """Whether jax's runtime or a collective failed somewhere in `error`'s chain (gloo's
    "Connection reset by peer" when a peer is gone), even under one of our reports (a save
    that fails in orbax's collective barrier); a file system's error is not one."""
    import jax

    seen, e = set(), error
    while e is not None and id(e) not in seen:
        if not isinstance(e, (ReportedError, SaveFailedElsewhere)) and not (
                isinstance(e, OSError) and e.errno):
            if isinstance(e, jax.errors.JaxRuntimeError) or COLLECTIVE.search(str(e)):
                return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def suspect(error: BaseException) -> None:
    """Called where an error leaves the loop: if it is not a ReportedError (or jax's runtime
    failed under it) and several processes run, a peer may be lost: the watchdog decides
    within a few beats."""
    if _WATCHDOG is not None and (not isinstance(error, ReportedError)
                                  or collective_failure(error)):
        _WATCHDOG.suspect(error)


def explain(error: BaseException) -> None:
    """Before an error is shown that is not a ReportedError (a traceback), or one that jax's
    runtime failed under: with several processes, waits for the watchdog to find a lost
    process (it ends this one with its one line); returns when none is found (the error is
    shown: all processes stop on it alike)."""
    suspect(error)
    if _WATCHDOG is not None and _WATCHDOG.error is error:
        time.sleep(_WATCHDOG.quick + 3 * _WATCHDOG.interval)


def save_failed(step: int) -> None:
    """Marks the save of `step` failed by this process: the others' `save_barrier` of that
    step gives up at once."""
    import jax

    store = client()
    if store is not None and jax.process_count() > 1:
        try:
            store.key_value_set(f"{SAVE_FAILED}{step}", str(jax.process_index()))
        except Exception:  # noqa: BLE001  (marked already by another process)
            pass


def _step_of(key: str) -> Optional[int]:
    """The step of orbax's commit barrier key (`...async_write_complete.<step dir name>`)."""
    tail = key.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else None


_USES: dict[str, int] = {}     # key -> how many times this process has waited on it
_USES_LOCK = threading.Lock()


def save_barrier(*, key: str, timeout_ms: int) -> None:
    """orbax's barrier (AsyncOptions.barrier_sync_fn), through the store: every process
    writes its arrival and waits for all of them. A commit barrier raises
    SaveFailedElsewhere as soon as a missing process has marked the step failed
    (`save_failed`) or waits at a barrier that comes after this one (its save failed in the
    background: it went on to orbax's bookkeeping without committing); any barrier raises
    TimeoutError after `timeout_ms`. orbax reuses keys one save after another, in the same
    order on every process: the n-th use of a key is the same barrier everywhere."""
    import jax

    store, me, count = client(), jax.process_index(), jax.process_count()
    with _USES_LOCK:
        use = _USES.get(key, 0)
        _USES[key] = use + 1
    prefix = f"{BARRIER}{key}/{use}/"
    store.key_value_set(f"{AT}{me}", f"{use}#{key}", allow_overwrite=True)
    store.key_value_set(f"{prefix}{me}", "1")
    if use >= 2:
        # The arrival two uses back is no one's any more: a process here has passed the
        # previous use, which every process reached only after passing that one.
        try:
            store.key_value_delete(f"{BARRIER}{key}/{use - 2}/{me}")
        except Exception:  # noqa: BLE001
            pass
    commit = any(k in key for k in COMMIT_BARRIERS)
    began = time.monotonic()
    deadline = began + timeout_ms / 1000
    pause = 0.005
    while True:
        arrived = _arrivals(store, prefix)
        if len(arrived) >= count:
            return
        if _WATCHDOG is not None and time.monotonic() - began > _WATCHDOG.quick:
            _WATCHDOG.suspect()  # a missing process that has also stopped beating is lost
        if commit:
            failed = failed_elsewhere(store, key, prefix, set(range(count)) - arrived)
            if failed is not None:
                raise SaveFailedElsewhere(_step_of(key), failed)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count - len(arrived)} process(es) did not reach {key} "
                               f"within {timeout_ms / 1000:.0f} s (config.checkpoint.timeout)")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _arrivals(store, prefix: str) -> set[int]:
    return {int(k.rsplit("/", 1)[1]) for k, _ in store.key_value_dir_get(prefix)}


def failed_elsewhere(store, key: str, prefix: str, missing: set[int]) -> Optional[int]:
    """A process of `missing` whose part of the save of `key`'s step failed, or None."""
    step = _step_of(key)
    marked = _get(store, f"{SAVE_FAILED}{step}") if step is not None else None
    if marked is not None and int(marked) in missing:
        return int(marked)
    for p in sorted(missing):
        at = _get(store, f"{AT}{p}")
        if not at:
            continue
        use, other = at.split("#", 1)
        with _USES_LOCK:
            mine = _USES.get(other, 0)
        # p waits at the use-th use of `other`; this process has used it `mine` times so
        # far: p is past this barrier if its use of `other` is one this process has not
        # made yet (another commit barrier in flight is not such a proof), and if it is still
        # missing here once its place is read (one that passed wrote its arrival first).
        if (other != key and not any(k in other for k in COMMIT_BARRIERS) and int(use) >= mine
                and p not in _arrivals(store, prefix)):
            return p
    return None
