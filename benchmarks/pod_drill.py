r"""The fault drill on several processes (`benchmarks/fault_drill.py --processes=2`): one
run of K local processes joined by jax.distributed, faulted again and again, restarted each
time, and compared with an uninterrupted run of the same K processes.

Each launch starts the K processes of `launch/train.py` (synthetic data, a fresh
coordinator port) and injects one fault, the kinds taking turns in a shuffled order:

    kill       kill -9 of a random process while it trains (a random moment of its steps)
    kill_save  kill -9 of a random process while a save is in flight (its temporary folder)
    term       SIGTERM to one random process (a maintenance event reaching one host)
    save_fail  the save of a coming checkpoint step fails on one random process
               (launch/train.py --debug_fail_save_at_step: no space left on device)

then waits for every process to end. A survivor (every process but a killed one) must exit
within `--exit_limit` seconds of the fault (a save_fail: of that step's save) with its exit
code (kill: 1, term: 0, save_fail: 1) and one line on its terminal: `error: ...` (the lost
process, or the failed save) or `preempted: saved step N on all K processes`, the same N on
every process; no traceback, no native log line or stack. The next launch must resume from
the newest complete checkpoint left, and the steps lost (the last step logged before the
fault - that checkpoint) must stay within one interval (plus, for a kill during a save or a
failed save, the steps trained since that save began). A last launch runs to the end: every
step's loss and the final params must equal the uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Optional

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import drill_runs as runs  # noqa: E402
from benchmarks.drill_runs import REPO  # noqa: E402

KINDS = ("kill", "kill_save", "term", "save_fail")
CODES = {"kill": 1, "kill_save": 1, "term": 0, "save_fail": 1}
# A traceback, a native abort's stack, or a native (C++) log line.
NOISE = re.compile(r"Traceback \(most recent call last\)|Check failure|Fatal Python error|"
                   r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+\.(?:cc|h|cpp|c):\d+\]", re.M)


@dataclasses.dataclass
class Fault:
    kind: str
    victim: int
    launch: int
    at: Optional[int] = None          # last step logged before the fault
    complete: Optional[int] = None    # newest complete checkpoint after the launch ended
    since: Optional[int] = None       # the step of the save in flight / that failed
    resumed: Optional[int] = None     # where the next launch started
    exits: dict = dataclasses.field(default_factory=dict)   # process -> (code, seconds)
    problems: list = dataclasses.field(default_factory=list)

    @property
    def lost(self) -> int:
        return (self.at - self.resumed) if self.at is not None and self.resumed is not None \
            else 0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(args, workdir: str, env: dict, logs: str, extra: dict) -> list:
    """K processes of launch/train.py: [(Popen, log path)]."""
    port, procs = _port(), []
    for i in range(args.processes):
        cmd = runs.command(args, workdir) + [
            f"--coordinator_address=localhost:{port}", f"--num_processes={args.processes}",
            f"--process_id={i}", "--config.mesh.data=-1",
            f"--config.train.heartbeat_timeout={args.heartbeat}"] + extra.get(i, [])
        path = f"{logs}_p{i}.log"
        log = open(path, "w")
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log,
                                       stderr=subprocess.STDOUT), path))
        log.close()
    _RUNNING[:] = [p for p, _ in procs]
    return procs


def _final_params(workdir: str, step: int) -> list:
    """The params saved at `step`, as host arrays (saved by several processes: read without
    their shardings)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # files only: no accelerator wanted
    from bert_jax.convert.sources import open_run

    import jax

    params = open_run(os.path.join(workdir, "checkpoints", str(step)), "drill").read_params()
    return jax.tree_util.tree_leaves(params)


def _lines_of(kind: str, text: str) -> list[str]:
    """The fault's lines a process showed (stdout and stderr share the log file, and a
    progress bar's redraw may follow a line on the same line of the file)."""
    mark = "preempted: " if kind == "term" else "error: "
    return [x for x in re.split(r"[\r\n]", text) if x.startswith(mark)]


_RUNNING: list = []   # the processes of the launch in flight, ended if the drill stops early


def drill(args) -> int:
    """Runs the drill on `args.processes` processes; prints its table; 0 when all is well."""
    try:
        return _drill(args)
    finally:
        for p in _RUNNING:
            if p.poll() is None:
                p.kill()   # its training child follows it (bert_jax.supervise)


def _drill(args) -> int:
    faults_n = args.faults
    args.steps = args.steps or args.every * (2 * faults_n + 4)
    rng = random.Random(args.seed)
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    env = runs.env(os.path.join(args.workdir, "xla_cache"))
    reference, work = os.path.join(args.workdir, "reference"), os.path.join(args.workdir, "run")

    t0 = time.time()
    procs = _launch(args, reference, env, os.path.join(args.workdir, "reference"), {})
    started = runs.wait_first_step(procs[0][0], reference, 0, t0 + args.timeout)
    t1 = time.time()
    codes = [p.wait(timeout=args.timeout) for p, _ in procs]
    if codes != [0] * args.processes or not started:
        print(f"the reference run failed (exit codes {codes}); see {args.workdir}/reference_p*")
        return 1
    args.step_time = (time.time() - t1) / max(args.steps - 1, 1)
    print(f"reference: {args.processes} processes, {args.steps} steps, startup {t1 - t0:.0f} s, "
          f"{args.step_time * 1e3:.0f} ms per step; checkpoint every {args.every} steps",
          flush=True)

    kinds = [KINDS[i % len(KINDS)] for i in range(faults_n)]
    rng.shuffle(kinds)
    faults: list[Fault] = []
    pending: list[Fault] = []   # faults whose resume no launch has shown yet
    failed: list[str] = []
    launch = 0
    while True:
        launch += 1
        kind = kinds[len(faults)] if len(faults) < len(kinds) else None
        offset = runs.size(work)
        start_guess = max(runs.checkpoints(work)[0], default=0)
        fault = Fault(kind, rng.randrange(args.processes), launch) if kind else None
        extra = {}
        if kind == "save_fail":  # the first or second save of this launch
            fault.since = (start_guess // args.every + rng.randint(1, 2)) * args.every
            extra = {fault.victim: [f"--debug_fail_save_at_step={fault.since}"]}
        logs = os.path.join(args.workdir, f"launch_{launch}")
        procs = _launch(args, work, env, logs, extra)
        deadline = time.time() + args.timeout
        t_fault = None
        first = runs.wait_first_step(procs[0][0], work, offset, deadline)
        if kind in ("kill", "term") and first:  # within the launch's first two intervals
            time.sleep(rng.uniform(0.1, 2) * args.every * args.step_time)
        elif kind == "kill_save" and first:
            while time.time() < deadline and all(p.poll() is None for p, _ in procs):
                tmp = runs.checkpoints(work)[1]
                if tmp:
                    fault.since = int(tmp[-1].split(".")[0])
                    break
                time.sleep(0.002)
        elif kind == "save_fail":
            while time.time() < deadline and all(p.poll() is None for p, _ in procs):
                if fault.since in runs.logged(work, offset):
                    break
                time.sleep(0.01)
            t_fault = time.time()
        if kind in ("kill", "kill_save", "term"):
            victim = procs[fault.victim][0]
            if victim.poll() is None:
                victim.send_signal(signal.SIGKILL if kind.startswith("kill") else signal.SIGTERM)
            t_fault = time.time()
        # Every process ends: the time each takes after the fault, or a hang.
        ends: dict[int, float] = {}
        limit = (t_fault or time.time()) + args.hang if kind else deadline
        while len(ends) < len(procs) and time.time() < limit:
            for i, (p, _) in enumerate(procs):
                if i not in ends and p.poll() is not None:
                    ends[i] = time.time()
            time.sleep(0.05)
        hung = [i for i in range(len(procs)) if i not in ends]
        for i in hung:
            procs[i][0].kill()
            procs[i][0].wait()
        steps = runs.logged(work, offset)
        texts = [open(path, errors="replace").read() for _, path in procs]
        start = next((s for s in (runs.start_step(t) for t in texts) if s is not None), None)
        for f in pending:  # the earlier faults resume here
            f.resumed = start
            if start is not None and start != (f.complete or 0):
                f.problems.append(f"resumed at {start}, newest complete checkpoint "
                                  f"{f.complete}")
            if start is None:
                f.problems.append(f"launch {launch} did not start training")
        pending = []
        if any("skipped:" in t for t in texts):
            failed.append(f"launch {launch} skipped a damaged checkpoint")
        if fault is None:  # the last launch runs to the end
            codes = [p.returncode for p, _ in procs]
            if hung or codes != [0] * len(procs):
                failed.append(f"the last launch ended with {codes} (hung: {hung})")
            break
        fault.at = max(steps) if steps else None
        fault.complete = max(runs.checkpoints(work)[0], default=None)
        for i, (p, _) in enumerate(procs):
            if kind.startswith("kill") and i == fault.victim:
                continue
            seconds = ends[i] - t_fault if i in ends and t_fault else None
            fault.exits[i] = (p.returncode, seconds)
            lines = _lines_of(kind, texts[i])
            if i in hung:
                fault.problems.append(f"process {i} hung")
            elif p.returncode != CODES[kind]:
                fault.problems.append(f"process {i} exited {p.returncode}")
            if seconds is not None and seconds > args.exit_limit:
                fault.problems.append(f"process {i} took {seconds:.0f} s")
            if len(lines) != 1 or NOISE.search(texts[i].replace('\r', '\n')):
                fault.problems.append(f"process {i} showed {len(lines)} line(s)"
                                      + (" and a traceback or native log" if
                                         NOISE.search(texts[i].replace('\r', '\n')) else ""))
        if kind == "term":
            said = {re.sub(r"\D+", " ", x).split()[0] for t in texts for x in _lines_of(kind, t)}
            if len(said) != 1:
                fault.problems.append(f"the processes saved different steps: {sorted(said)}")
        faults.append(fault)
        pending.append(fault)

    lost_beyond, problems = [], []
    for f in faults:
        allowed = args.every + ((f.at - f.since) if f.since is not None and f.at is not None
                                and f.kind in ("kill_save", "save_fail") else 0)
        if f.lost > allowed:
            lost_beyond.append(f)
        problems += [f"fault {faults.index(f) + 1} ({f.kind}): {p}" for p in f.problems]
    want, got = runs.logged(reference), runs.logged(work)
    same_losses = want == got and sorted(got) == list(range(1, args.steps + 1))
    same_params = False
    if args.steps in runs.checkpoints(work)[0] and args.steps in runs.checkpoints(reference)[0]:
        a, b = _final_params(reference, args.steps), _final_params(work, args.steps)
        same_params = len(a) == len(b) > 0 and all((x == y).all() for x, y in zip(a, b))
    hangs = sum(any("hung" in p for p in f.problems) for f in faults)
    exits = [s for f in faults for _, s in f.exits.values() if s is not None]
    resumes = sum(any(p.startswith(("resumed", "launch")) for p in f.problems) for f in faults)
    print(f"{len(faults)} faults on {args.processes} processes "
          f"({', '.join(f'{sum(f.kind == k for f in faults)} {k}' for k in KINDS)}): "
          f"{resumes + len(failed)} failed resumes, {len(lost_beyond)} lost beyond one "
          f"interval, {hangs} hangs; slowest survivor exit {max(exits, default=0):.1f} s "
          f"(limit {args.exit_limit:.0f} s)")
    print(f"final state equal to the uninterrupted run: "
          f"{'yes' if same_losses and same_params else 'NO'} (params and {len(want)} losses, "
          f"bit for bit); temporary folders left: {len(runs.checkpoints(work)[1])}")
    print("| # | fault | process | last step | newest checkpoint | resumed | lost | exits "
          "(code, s) |")
    print("|---|---|---|---|---|---|---|---|")
    for i, f in enumerate(faults, 1):
        shown = ", ".join(f"p{p}: {c}, {s:.1f}" if s is not None else f"p{p}: {c}"
                          for p, (c, s) in sorted(f.exits.items()))
        since = f" (save {f.since})" if f.since is not None else ""
        print(f"| {i} | {f.kind}{since} | {f.victim} | {f.at} | {f.complete} | {f.resumed} | "
              f"{f.lost} | {shown} |")
    for p in problems + failed:
        print(f"  PROBLEM: {p}")
    ok = (not problems and not failed and not lost_beyond and same_losses and same_params
          and not runs.checkpoints(work)[1])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit("run benchmarks/fault_drill.py --processes=2")
