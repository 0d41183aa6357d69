r"""Fault drill: kill -9 a pre-training run at random moments, resume it each time, and
check that nothing is lost beyond one checkpoint interval and that the end is the end of
an uninterrupted run, bit for bit.

    python benchmarks/fault_drill.py [--kills=10] [--during_saves=3] [--every=20] \
        [--config=configs/bert_tiny.py] [--workdir=/tmp/fault_drill] [--seed=0]
    python benchmarks/fault_drill.py --processes=2 [--faults=12] [--every=20] ...

The second form runs the drill on several processes joined by jax.distributed: kill -9 of
one during a step or a save, SIGTERM to one, a save failing on one, each survivor's exit
time and line checked (benchmarks/pod_drill.py). The rest of this docstring is the first.

Runs `launch/train.py` (synthetic data, so the drill needs no corpus) once uninterrupted
as the reference, then the same command again and again in another workdir: `--kills`
launches are SIGKILLed from here, `--during_saves` of them as soon as a save's temporary
folder appears (orbax writes `<step>.orbax-checkpoint-tmp` and renames it when complete),
the others after a random delay (startup, compile and training alike), and a last launch
runs to the end. For each kill it records the newest complete checkpoint left on disk and
the last step logged; the next launch must resume from exactly that checkpoint (its
"resumed from" line), and the steps lost (last logged - resumed) must stay within one
interval (plus, for a kill during a save, the steps trained while that save was in
flight). A launch that fails on its own (exit code other than -9), resumes from anything
else, or skips a damaged checkpoint is a failed resume. At the end the final params and
every step's logged loss must equal the reference's bit for bit, and no temporary folder
may be left. Prints

    10 kills, 0 lost beyond one interval, 0 failed resumes
    3 of the kills during a save; ...; final state equal to the uninterrupted run: yes

and exits 1 if anything was lost, failed or differs. All launches share a persistent XLA
compilation cache, so a relaunch compiles nothing (same programs, same numerics).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from typing import Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import drill_runs as runs  # noqa: E402
from benchmarks.drill_runs import REPO  # noqa: E402


@dataclasses.dataclass
class Kill:
    mode: str                  # "random" | "save"
    launch: int
    reached: Optional[int]     # last step this launch logged before the kill (None: none)
    complete: Optional[int]    # newest complete checkpoint on disk after the kill
    save_started: Optional[int] = None  # the step of a save the kill interrupted
    resumed: Optional[int] = None       # where the next launch that started training began
    lost: int = 0

    @property
    def during_save(self) -> bool:
        return self.save_started is not None


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--during_saves", type=int, default=3)
    p.add_argument("--every", type=int, default=20, help="checkpoint.every (steps)")
    p.add_argument("--steps", type=int, default=0,
                   help="train.steps; 0: every * (2 * kills + 4), room for every kill")
    p.add_argument("--config", default="configs/bert_tiny.py")
    p.add_argument("--workdir", default="/tmp/fault_drill")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    p.add_argument("--processes", type=int, default=1,
                   help="> 1: the drill on that many processes (benchmarks/pod_drill.py)")
    p.add_argument("--faults", type=int, default=12,
                   help="--processes > 1: faults, the four kinds taking turns")
    p.add_argument("--heartbeat", type=float, default=60,
                   help="--processes > 1: config.train.heartbeat_timeout")
    p.add_argument("--exit_limit", type=float, default=90,
                   help="--processes > 1: seconds a survivor may take to exit after a fault")
    p.add_argument("--hang", type=float, default=300,
                   help="--processes > 1: seconds after a fault before a process counts as hung")
    return p.parse_args(argv)


def _launch(args, workdir, cache, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen(runs.command(args, workdir), cwd=REPO, env=runs.env(cache), stdout=log,
                            stderr=subprocess.STDOUT, text=True)
    return proc, log


def _final_params(workdir: str, step: int):
    import numpy as np
    import orbax.checkpoint as ocp
    import jax

    import warnings

    with warnings.catch_warnings(), ocp.PyTreeCheckpointer() as ckptr:
        warnings.simplefilter("ignore")  # "Sharding info not provided": host arrays wanted
        tree = ckptr.restore(os.path.join(workdir, "checkpoints", str(step), "state"))
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree["params"])]


def drill(args) -> int:
    """Runs the drill; prints the summary; returns the process exit code (0: all good)."""
    if args.during_saves > args.kills:
        raise SystemExit("--during_saves cannot exceed --kills")
    args.steps = args.steps or args.every * (2 * args.kills + 4)
    rng = random.Random(args.seed)
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    cache = os.path.join(args.workdir, "xla_cache")
    reference, work = os.path.join(args.workdir, "reference"), os.path.join(args.workdir, "run")

    t0 = time.time()
    proc, log = _launch(args, reference, cache, os.path.join(args.workdir, "reference.log"))
    started = runs.wait_first_step(proc, reference, 0, t0 + args.timeout)
    t1 = time.time()
    code = proc.wait(timeout=args.timeout)
    log.close()
    if code != 0 or not started:
        print(f"the reference run failed (exit {code}); see {args.workdir}/reference.log")
        return 1
    startup, step_time = t1 - t0, (time.time() - t1) / max(args.steps - 1, 1)
    print(f"reference: {args.steps} steps, startup {startup:.1f} s, {step_time * 1e3:.0f} ms "
          f"per step; checkpoint every {args.every} steps", flush=True)

    modes = ["save"] * args.during_saves + ["random"] * (args.kills - args.during_saves)
    rng.shuffle(modes)
    kills: list[Kill] = []
    unobserved: list[Kill] = []   # kills whose resume no launch has shown yet
    relaunch_startup = startup    # launch -> first step; relaunches reuse the compiled step
    failed: list[str] = []
    attempt = 0
    while True:
        attempt += 1
        mode = modes[len(kills)] if len(kills) < len(modes) else None
        offset = runs.size(work)
        log_path = os.path.join(args.workdir, f"launch_{attempt}.log")
        t_start = time.time()
        proc, log = _launch(args, work, cache, log_path)
        deadline = t_start + args.timeout
        if mode == "random":
            # Any moment of a launch: one kill in four while it starts up (imports, compile,
            # restore), the others while it trains, within two intervals of its first step.
            if rng.random() < 0.25:
                time.sleep(rng.uniform(0.1, 0.9) * relaunch_startup)
            elif runs.wait_first_step(proc, work, offset, deadline):
                relaunch_startup = min(relaunch_startup, time.time() - t_start)
                time.sleep(rng.uniform(0, 2 * args.every * step_time))
        elif mode == "save":
            # A save of this launch: a temporary folder appearing after its first step
            # (the launch removed any left by an earlier kill when it opened the manager).
            if runs.wait_first_step(proc, work, offset, deadline):
                relaunch_startup = min(relaunch_startup, time.time() - t_start)
                while proc.poll() is None and time.time() < deadline:
                    if runs.checkpoints(work)[1]:
                        break
                    time.sleep(0.001)
        kill = None
        if mode is not None and proc.poll() is None:
            tmp_seen = runs.checkpoints(work)[1]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            complete, tmp_left = runs.checkpoints(work)
            steps = runs.logged(work, offset)
            in_flight = sorted(set(tmp_seen) & set(tmp_left))
            kill = Kill(mode, attempt, max(steps) if steps else None,
                        complete[-1] if complete else None,
                        int(in_flight[-1].split(".")[0]) if in_flight and steps else None)
        code = proc.wait(timeout=max(deadline - time.time(), 1))
        log.close()
        text = open(log_path).read()
        if kill is None and code != 0:
            failed.append(f"launch {attempt} exited {code} (see {log_path})")
            break
        if "skipped:" in text:
            failed.append(f"launch {attempt} skipped a damaged checkpoint (see {log_path})")
        start = runs.start_step(text)
        if start is not None:
            # Every earlier kill not yet followed by a start resumes here (nothing was
            # saved in between): it must be from the newest complete checkpoint it left.
            for k in unobserved:
                k.resumed = start
                if start != (k.complete or 0):
                    failed.append(f"launch {attempt} started at step {start} after kill "
                                  f"{kills.index(k) + 1}, whose newest complete checkpoint "
                                  f"was {k.complete} (see {log_path})")
                k.lost = (k.reached - start) if k.reached is not None else 0
            unobserved = []
        if kill is None:
            break
        kills.append(kill)
        unobserved.append(kill)

    lost_beyond = []
    for k in kills:
        # Steps since the newest complete checkpoint: under one interval, plus the steps
        # trained while an interrupted save was in flight.
        allowed = args.every + ((k.reached - k.save_started) if k.during_save else 0)
        if k.lost > allowed or k.resumed != (k.complete or 0):
            lost_beyond.append(k)
    leftovers = runs.checkpoints(work)[1]
    want, got = runs.logged(reference), runs.logged(work)
    same_losses = want == got and sorted(got) == list(range(1, args.steps + 1))
    same_params = False
    if not failed and args.steps in runs.checkpoints(work)[0]:
        a, b = _final_params(reference, args.steps), _final_params(work, args.steps)
        same_params = len(a) == len(b) > 0 and all((x == y).all() for x, y in zip(a, b))
    during = sum(k.during_save for k in kills)
    print(f"{len(kills)} kills, {len(lost_beyond)} lost beyond one interval, "
          f"{len(failed)} failed resumes")
    worst = max((k.lost for k in kills), default=0)
    print(f"{during} of the kills during a save ({sum(k.mode == 'save' for k in kills)} aimed "
          f"at one); most steps lost by a kill: {worst} (interval {args.every}); temporary "
          f"folders left: {len(leftovers)}; final state equal to the uninterrupted run: "
          f"{'yes' if same_params and same_losses else 'NO'} (params and {len(want)} losses, "
          f"bit for bit)")
    for i, k in enumerate(kills, 1):
        where = f", during the save of step {k.save_started}" if k.during_save else ""
        at = f"step {k.reached}" if k.reached is not None else "start-up (no step yet)"
        print(f"  kill {i} ({k.mode}{where}) at {at}: newest complete checkpoint "
              f"{k.complete}, resumed from {k.resumed}, steps lost {k.lost}")
    for f in failed:
        print(f"  FAILED: {f}")
    ok = not lost_beyond and not failed and not leftovers and same_params and same_losses
    return 0 if ok else 1


if __name__ == "__main__":
    _flags = _args()
    if _flags.processes > 1:
        from benchmarks import pod_drill

        sys.exit(pod_drill.drill(_flags))
    sys.exit(drill(_flags))
