"""One process of a run of several, watched by a parent process that loads no JAX, so that
whatever ends it, the terminal gets one line and the exit code its kind (bert_jax.errors).

    if supervise.wanted(sys.argv):          # launch/train.py, before anything heavy loads
        sys.exit(supervise.run(sys.argv))   # the same command, as a child process

Why a parent: when the process hosting jax's coordination service (process 0) dies, or
jax's own heartbeat gives a process up, jax's distributed client ends every other process at
once with a C++ check failure, its stack and Python's fault dump (SIGABRT); nothing in the
process can stop that or print a line first. The parent runs the same command as its child
(CHILD set in its environment), passes SIGTERM and SIGHUP on to it (Ctrl-C reaches it from
the terminal), and dies with it (the child gets SIGKILL if the parent is killed). The
child's stderr (and its stdout, when both go to one place: in the order written) goes to a
log file whole, and to the terminal without C++ log lines and what follows a fatal one
(with --verbose: everything). A child ended by that abort becomes one line naming the lost
process (`lost_line`: the last complete checkpoint on disk, the command that resumes) and
exit code 1; another signal, one line and 128 + the signal.

The lost process's line, when the child can still print it (a process silent for its
heartbeat timeout, a collective that fails), comes from the child itself
(bert_jax.train.coordination), with the step it stopped at.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Optional

from etils import epath

CHILD = "BERT_JAX_SUPERVISED"     # in the child's environment: its log file
LOST_EXIT = 1                     # bert_jax.errors.FaultError.exit_code
# A C++ (absl / glog) log line: severity, date, time, thread, file:line] (absl's Python
# logging writes the same prefix with a .py file: those lines are shown).
NATIVE = re.compile(rb"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\s\]]+\.(?:cc|h|cpp|c):\d+\]")
# What a native abort writes after its first line (absl's stack, Python's fault dump).
DYING = (b"*** Check failure stack trace", b"Fatal Python error")
# jax's distributed client ending this process because the service reported an error.
ENDED_BY_JAX = b"Terminating process because the JAX distributed service detected fatal"


def on_tpu_vm() -> bool:
    """A Cloud TPU VM (one host of a slice or pod, or a single-host slice): TPU device
    files or the TPU runtime's environment. jax.distributed.initialize() then finds the
    other hosts by itself (and is harmless with a single host)."""
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return True
    return any(os.environ.get(k) for k in ("TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE",
                                           "TPU_WORKER_ID"))


def flag(argv: list[str], name: str) -> Optional[str]:
    """The last value of absl flag `--name` in `argv` (`--name=v` or `--name v`)."""
    value = None
    for i, arg in enumerate(argv[1:], 1):
        if arg == "--":
            break
        if arg.startswith(f"--{name}="):
            value = arg.split("=", 1)[1]
        elif arg == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def wanted(argv: list[str]) -> bool:
    """Several processes are asked for (a coordinator address, --distributed=on, or a TPU VM
    left on auto), and this is not the child already."""
    if os.environ.get(CHILD):
        return False
    mode = flag(argv, "distributed") or "auto"
    return mode == "on" or (mode == "auto" and bool(flag(argv, "coordinator_address")
                                                    or on_tpu_vm()))


def log_path(argv: list[str]) -> str:
    """This process's log file, in the temporary folder (a run's workdir may not exist yet,
    and a mistake must leave nothing in it)."""
    name = os.path.basename(os.path.normpath(flag(argv, "workdir") or "run")) or "run"
    return os.path.join(tempfile.gettempdir(),
                        f"bert_jax-{name}-process_{flag(argv, 'process_id') or 0}-"
                        f"{os.getpid()}.log")


def last_checkpoint(workdir: Optional[str]) -> Optional[str]:
    """WORKDIR/checkpoints/<newest step with a state/ item>, or None."""
    if not workdir:
        return None
    directory = epath.Path(workdir) / "checkpoints"
    try:
        steps = [int(p.name) for p in directory.iterdir()
                 if p.name.isdigit() and (p / "state").is_dir()]
    except OSError:
        return None
    return f"{workdir.rstrip('/')}/checkpoints/{max(steps)}" if steps else None


def command(argv: list[str]) -> str:
    return shlex.join([os.path.basename(sys.executable)] + list(argv))


def lost_line(peer: Optional[int], count: Optional[int], why: str, workdir: Optional[str],
              argv: list[str], step: Optional[int] = None, log: Optional[str] = None) -> str:
    """The one line of a process that stops because another one was lost: which, where
    this one stopped, the last complete checkpoint on disk and the command that resumes."""
    who = (f"process {peer}" if peer is not None else "another process") + (
        f" of {count}" if count else "")
    last = last_checkpoint(workdir)
    last = (f"last complete checkpoint: {last}" if last
            else "no complete checkpoint yet (the run starts again)")
    at = f" at step {step}" if step is not None else ""
    details = f" (details: {log})" if log else ""
    return (f"{who} was lost ({why}); this process stopped{at}, as every other does; {last}; "
            f"to resume, run the same command on every host again: {command(argv)}{details}")


def lost_process(text: bytes) -> tuple[Optional[int], str]:
    """(the lost process, why) from what jax wrote before its abort (`text`): the abort's
    own status first, then the errors logged before it."""
    if ENDED_BY_JAX in text:
        peer, why = lost_process(text[text.rindex(ENDED_BY_JAX) + len(ENDED_BY_JAX):])
        if peer is not None:
            return peer, why
    for pattern in (rb"stopped sending heartbeats\):\s*(?:/job:[\w-]+/(?:replica:\d+/)?"
                    rb"task:)?(\d+)", rb"Task (\d+) heartbeat timeout"):
        m = re.search(pattern, text)
        if m:
            return int(m.group(1)), "no heartbeat within jax's heartbeat timeout"
    if re.search(rb"Failed to send RPC to coordination service|leader task|Socket closed", text):
        return 0, "the coordination service it hosts stopped answering"
    return None, "jax's distributed service reported it"


class _Relay:
    """The child's stderr: all of it to the log file, to the terminal without native log
    lines and whatever follows a native abort (`show_all`: everything)."""

    def __init__(self, source: int, log, show_all: bool):
        self.source, self.log, self.show_all = source, log, show_all
        self.dying = False
        self.tail = b""        # the last 64 KiB, for the abort's message (lost_process)
        self._pending = b""
        self.thread = threading.Thread(target=self._run, name="stderr-relay", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        out = sys.stderr.buffer
        while True:
            chunk = os.read(self.source, 1 << 16)
            if not chunk:
                break
            self.log.write(chunk)
            self.log.flush()
            self.tail = (self.tail + chunk)[-(1 << 16):]
            shown = self._filter(chunk)
            if shown:
                out.write(shown)
                out.flush()
        if self._pending and not self.dying and (self.show_all
                                                 or not NATIVE.match(self._pending)):
            out.write(self._pending)
            out.flush()

    def _filter(self, chunk: bytes) -> bytes:
        """Whole lines (ending in \\n, or \\r for a progress bar) are decided one by one; a
        partial line is shown at once unless it could be a native log line's start. A native
        message's further lines come in the same write as its first: the rest of a chunk
        after a native line is hidden too, but for this program's own `error:` lines."""
        data = self._pending + chunk
        self._pending = b""
        shown, native = [], False
        for piece in re.split(rb"(?<=[\r\n])", data):
            if not piece:
                continue
            whole = piece.endswith((b"\n", b"\r"))
            if any(d in piece for d in DYING) or piece.startswith(b"F") and NATIVE.match(piece):
                self.dying = True
            native = native or bool(NATIVE.match(piece))
            if self.show_all:
                shown.append(piece)
            elif self.dying or (native and not piece.startswith(b"error: ")):
                continue
            elif not whole and re.match(rb"^[IWEF]\d{0,4}( |$)", piece[:6]):
                self._pending = piece   # wait for its end: a native line, or not
            else:
                shown.append(piece)
        return b"".join(shown)


def run(argv: list[str]) -> int:
    """Runs `argv` (this very command) as the child; returns the exit code to leave with."""
    log = log_path(argv)
    env = dict(os.environ, **{CHILD: log})

    def die_with_parent():  # Linux: the child gets SIGKILL when this process ends
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass

    show_all = (flag(argv, "verbose") not in (None, "false", "False", "0")
                or "--verbose" in argv[1:])
    # stdout and stderr going to one place (a terminal, `> log 2>&1`): the child's both
    # through the one pipe, in the order it wrote them (a progress bar on stderr is cleared
    # before a line on stdout and drawn again after it); else its stdout is its own.
    read, write = os.pipe()
    with open(log, "ab") as log_file:
        child = subprocess.Popen([sys.executable] + list(argv), env=env,
                                 stdout=write if _same_file(1, 2) else None, stderr=write,
                                 preexec_fn=die_with_parent)
        os.close(write)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda s, f: child.send_signal(s))
        # Ctrl-C reaches the child from the terminal itself (its process group).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        relay = _Relay(read, log_file, show_all)
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:
                continue
        relay.thread.join(timeout=10)
    if code >= 0:
        return code
    sig = -code
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = str(sig)
    if sig == signal.SIGABRT and ENDED_BY_JAX in relay.tail:
        peer, why = lost_process(relay.tail)
        count = flag(argv, "num_processes")
        line = lost_line(peer, int(count) if count and count.isdigit() else None, why,
                         flag(argv, "workdir"), argv, log=log)
        _say(f"error: {line}")
        return LOST_EXIT
    _say(f"error: the training process ended on signal {name} (details: {log})")
    return 128 + sig


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _say(line: str) -> None:
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)
