r"""A Cloud TPU slice from a laptop: create it, put the code on every worker, run
launch/train.py on all of them, read the logs, delete it. Each step is gcloud commands.

    python launch/tpu.py create --name=bert --zone=us-central2-b --accelerator_type=v4-32
    python launch/tpu.py setup --name=bert --zone=us-central2-b
    python launch/tpu.py train --name=bert --zone=us-central2-b --run=base \
        --config=configs/bert_base.py --workdir=gs://bucket/base --config.mesh.fsdp=-1
    python launch/tpu.py logs --name=bert --zone=us-central2-b --worker=0
    python launch/tpu.py status --name=bert --zone=us-central2-b
    python launch/tpu.py delete --name=bert --zone=us-central2-b

`create --queued` asks for a queued resource (waits for capacity; `status --queued` shows
its state); `--spot` or `--reserved` picks the capacity. `setup` copies this checkout (the
files git lists: tracked or not ignored) to ~/bert_jax on every worker, or clones
`--repo` at `--ref`, then runs `pip install -e .[tpu]` there. `train` starts the same
`python3 launch/train.py --config=... --workdir=...` (and every flag it does not know, as
is) on every worker, detached: its output goes to ~/bert_jax_logs/RUN.log on each worker,
copied every minute and at the end to WORKDIR/logs/RUN.worker-N.log when WORKDIR is gs://.
`--dry_run` prints the gcloud commands instead of running them.

A gcloud failure ends in one line, `error: <step>: gcloud failed: <gcloud's last line>`,
exit 1; a mistake in the flags in one line too, exit 2 (bert_jax.cli's convention; this
file imports nothing of bert_jax or jax, so that it runs from a bare checkout).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

CHECKOUT = Path(__file__).resolve().parents[1]
REMOTE_DIR = "bert_jax"            # on every worker, under the home directory
LOG_DIR = "bert_jax_logs"          # idem: <run>.log, one per worker (each has its own disk)
LOG_COPY_EVERY_S = 60
# The runtime (OS image) per TPU generation, for JAX: Cloud TPU's documented choices.
RUNTIME_VERSIONS = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5e": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}
# This worker's index in the slice (TPU VM metadata), else its host name.
WORKER_ID = ("$(curl -sf -H Metadata-Flavor:Google http://metadata.google.internal/"
             "computeMetadata/v1/instance/attributes/agent-worker-number || hostname)")
# The first line of the detached shell's script that `train` starts: that shell lives
# until the trainer ends and its log is copied, so `status` finds a run by it (and not
# another launch/train.py on the worker, nor a `logs --follow`).
RUN_MARK = "# launch/tpu.py run "


class Failed(Exception):
    """One line for the user and the exit code: 1 for gcloud's failure, 2 for a mistake."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, `error: ...`, exit 2."""

    def error(self, message):
        raise Failed(f"{self.prog.split()[-1]}: {message}", 2)


def runtime_version(accelerator_type: str) -> str:
    """The default runtime of an accelerator type such as v4-32 or v5litepod-16."""
    match = re.fullmatch(r"(v\d+[a-z]*)-\d+", accelerator_type)
    if not match:
        raise Failed(f"create: --accelerator_type={accelerator_type}: expected a type such "
                     f"as v4-32, v5litepod-16, v5p-8 or v6e-8", 2)
    generation = match.group(1)
    if generation not in RUNTIME_VERSIONS:
        raise Failed(f"create: no default runtime for {generation}; give --version "
                     f"(gcloud compute tpus versions list --zone=...)", 2)
    return RUNTIME_VERSIONS[generation]


# gcloud's own progress lines on stderr, which say nothing of a failure's cause.
_PROGRESS = re.compile(r"^(?:SSH|SCP): Attempting to connect to worker \d+\.\.\.$"
                       r"|^##### Command execution on worker (\d+) failed with exit status \d+")


def gcloud_message(stderr: str) -> str:
    """gcloud's own message of a failure, on one line: its last `ERROR:` block (the line
    and those after it, joined), else its last line, which an ssh command's remote
    command wrote; which workers failed, when gcloud said."""
    lines = [l.strip() for l in stderr.splitlines() if l.strip()]
    failed = [m.group(1) for m in map(_PROGRESS.match, lines) if m and m.group(1)]
    lines = [l for l in lines if not _PROGRESS.match(l)]
    errors = [i for i, l in enumerate(lines) if l.startswith("ERROR:")]
    message = " ".join(lines[errors[-1]:]).removeprefix("ERROR: ") if errors else (
        lines[-1] if lines else "")
    if failed:
        message += f" (worker{'s' if len(failed) > 1 else ''} {', '.join(failed)} failed)"
    return message


class Gcloud:
    """Runs (or, dry, prints) gcloud commands; a failure raises Failed naming the step."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run
        if not dry_run and shutil.which("gcloud") is None:
            raise Failed("gcloud is not on PATH: install the Google Cloud SDK "
                         "(https://cloud.google.com/sdk/docs/install), then run `gcloud init`",
                         2)

    def __call__(self, step: str, args: Sequence[str]) -> None:
        cmd = ["gcloud", *args]
        if self.dry_run:
            print(shlex.join(cmd), flush=True)
            return
        print(f"[{step}] {shlex.join(cmd)}", file=sys.stderr, flush=True)
        # stdout and stdin stay the terminal's (describe's output, ssh's prompts); stderr
        # is passed on as it comes (progress, prompts without a newline) and its end kept
        # for the error line.
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
        tail = b""
        while True:
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                break
            sys.stderr.buffer.write(chunk)
            sys.stderr.buffer.flush()
            tail = (tail + chunk)[-65536:]
        proc.stderr.close()
        if proc.wait() != 0:
            message = gcloud_message(tail.decode(errors="replace"))
            raise Failed(f"{step}: gcloud failed: {message or f'exit status {proc.returncode}'}")

    def comment(self, text: str) -> None:
        if self.dry_run:
            print(f"# {text}", flush=True)


def _where(args) -> list[str]:
    return ([f"--zone={args.zone}"] if args.zone else []) + (
        [f"--project={args.project}"] if args.project else [])


def _ssh(args, command: str, worker: str = "all") -> list[str]:
    return ["compute", "tpus", "tpu-vm", "ssh", args.name, *_where(args),
            f"--worker={worker}", f"--command={command}"]


def cmd_create(args, gcloud: Gcloud) -> None:
    version = args.version or runtime_version(args.accelerator_type)
    capacity = ["--spot"] if args.spot else ["--reserved"] if args.reserved else []
    if args.queued:
        gcloud("create", ["compute", "tpus", "queued-resources", "create", args.name,
                          f"--node-id={args.name}", *_where(args),
                          f"--accelerator-type={args.accelerator_type}",
                          f"--runtime-version={version}", *capacity])
        print(f"queued: `python launch/tpu.py status --queued --name={args.name}` shows its "
              f"state; run setup once it is ACTIVE", file=sys.stderr)
    else:
        gcloud("create", ["compute", "tpus", "tpu-vm", "create", args.name, *_where(args),
                          f"--accelerator-type={args.accelerator_type}",
                          f"--version={version}", *capacity])


def _git_files(source: Path) -> list[str]:
    """The files of a checkout worth copying: tracked, or untracked and not ignored (no
    virtual environment, data or build output)."""
    try:
        out = subprocess.run(["git", "-C", str(source), "ls-files", "-z", "--cached",
                              "--others", "--exclude-standard"], capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise Failed(f"setup: {source} is not a git checkout (git ls-files failed: "
                     f"{getattr(e, 'stderr', b'').decode(errors='replace').strip() or e}); "
                     f"give --source=<checkout> or --repo=<git URL>", 2) from e
    return sorted({f for f in out.decode().split("\0") if f})


def _stage(source: Path, files: list[str], into: Path) -> Path:
    root = into / REMOTE_DIR
    for name in files:
        src, dst = source / name, root / name
        if not os.path.lexists(src):  # deleted in the work tree, still in the index
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir() and not src.is_symlink():  # a submodule
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)
    return root


def cmd_setup(args, gcloud: Gcloud) -> None:
    here = f"~/{REMOTE_DIR}"
    install = f"cd {here} && python3 -m pip install --quiet -e {shlex.quote(f'.[{args.extras}]')}"
    if args.repo:
        checkout = f" && git -C {here} checkout --quiet {shlex.quote(args.ref)}" if args.ref else ""
        gcloud("setup: clone", _ssh(args, f"rm -rf {here} && git clone --quiet "
                                          f"{shlex.quote(args.repo)} {here}{checkout}"))
        gcloud("setup: install", _ssh(args, install))
        return
    source = Path(args.source).resolve()
    files = _git_files(source)
    with contextlib.ExitStack() as stack:
        if gcloud.dry_run:
            staged = Path("STAGING") / REMOTE_DIR
            gcloud.comment(f"STAGING: a temporary folder; STAGING/{REMOTE_DIR} holds the "
                           f"{len(files)} files git lists in {source}")
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bert_jax_setup_"))
            staged = _stage(source, files, Path(tmp))
        gcloud("setup: clean", _ssh(args, f"rm -rf {here}"))
        gcloud("setup: copy", ["compute", "tpus", "tpu-vm", "scp", "--recurse", str(staged),
                               f"{args.name}:{REMOTE_DIR}", *_where(args), "--worker=all"])
    gcloud("setup: install", _ssh(args, install))


def _train_script(run: str, trainer: list[str], workdir: str) -> str:
    """The shell command every worker runs: starts the trainer detached from the ssh
    session (setsid nohup, no terminal), its output in ~/bert_jax_logs/RUN.log, copied to
    the bucket while it runs and when it ends."""
    log = f'"$HOME/{LOG_DIR}/{run}.log"'
    lines = [RUN_MARK + run, "export PYTHONUNBUFFERED=1",
             f"{shlex.join(['python3', *trainer])} > {log} 2>&1 &",
             "pid=$!"]
    if workdir.startswith("gs://"):
        dest = f'{shlex.quote(workdir.rstrip("/") + "/logs/" + run)}".worker-$w.log"'
        copy = f"gcloud storage cp --quiet {log} {dest} > /dev/null 2>&1"
        lines += [f"w={WORKER_ID}", f"(while sleep {LOG_COPY_EVERY_S}; do {copy}; done) &",
                  "copier=$!"]
        # Killing the copier's sleep ends its loop (pkill -P: the copier's own children).
        lines += ["wait $pid; code=$?", "pkill -P $copier; kill $copier 2> /dev/null",
                  f'echo "launch/tpu.py: the trainer exited with status $code" >> {log}', copy]
    else:
        lines += ["wait $pid; code=$?",
                  f'echo "launch/tpu.py: the trainer exited with status $code" >> {log}']
    inner = "\n".join(lines)
    return (f"cd ~/{REMOTE_DIR} && mkdir -p ~/{LOG_DIR} && "
            f"setsid nohup bash -c {shlex.quote(inner)} > /dev/null 2>&1 < /dev/null &")


def cmd_train(args, gcloud: Gcloud) -> None:
    run = args.run or time.strftime("run-%Y%m%d-%H%M%S")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", run):
        raise Failed(f"train: --run={run}: use letters, digits, '.', '_' or '-'", 2)
    config_file = args.config.partition(":")[0]
    if not (CHECKOUT / config_file).is_file():
        # Every worker runs the path in its copy of this checkout: a typo would start a
        # trainer that fails on every host.
        raise Failed(f"train: --config={args.config}: no file {config_file} in {CHECKOUT} "
                     f"(a path relative to the checkout, e.g. configs/bert_base.py)", 2)
    if not args.workdir.startswith("gs://"):
        print(f"warning: --workdir={args.workdir} is not a bucket: each worker writes its "
              f"own disk, and the logs stay on the workers", file=sys.stderr)
    trainer = ["launch/train.py", f"--config={args.config}", f"--workdir={args.workdir}",
               *args.trainer_flags]
    gcloud("train", _ssh(args, _train_script(run, trainer, args.workdir)))
    print(f"{'would start' if gcloud.dry_run else 'started'} run {run}: python launch/tpu.py logs --name={args.name} --run={run} "
          f"--worker=0", file=sys.stderr)


def cmd_logs(args, gcloud: Gcloud) -> None:
    if args.run:
        pick = f'log="$HOME/{LOG_DIR}/{args.run}.log"'
    else:  # the newest run's
        pick = f'log=$(ls -t "$HOME/{LOG_DIR}"/*.log 2>/dev/null | head -n 1)'
    tail = "tail -F" if args.follow else "tail"
    gcloud("logs", _ssh(args, f'{pick}; if [ ! -f "$log" ]; then echo "no log '
                              f'{args.run or "yet"} in ~/{LOG_DIR}: start one with '
                              f'launch/tpu.py train" >&2; exit 1; fi; '
                              f'echo "== $log"; {tail} -n {args.lines} "$log"',
                        worker=str(args.worker)))


def cmd_status(args, gcloud: Gcloud) -> None:
    if args.queued:
        gcloud("status: describe", ["compute", "tpus", "queued-resources", "describe",
                                    args.name, *_where(args)])
    else:
        gcloud("status: describe", ["compute", "tpus", "tpu-vm", "describe", args.name,
                                    *_where(args)])
    # The brackets keep pgrep from matching the shell that runs this check, or its grep.
    mark = RUN_MARK.removeprefix("# ")
    mark = f"[{mark[0]}]{mark[1:]}"
    gcloud("status: workers", _ssh(
        args, f'w={WORKER_ID}; runs=$(pgrep -af "{mark}" | grep -o "{mark}[A-Za-z0-9._-]*" '
              f'| cut -d" " -f3 | sort -u | paste -sd" "); '
              f'if [ -n "$runs" ]; then echo "worker $w: training ($runs)"; '
              f'else echo "worker $w: no trainer"; fi'))


def cmd_delete(args, gcloud: Gcloud) -> None:
    if args.queued:  # --force: its TPU VMs too
        gcloud("delete", ["compute", "tpus", "queued-resources", "delete", args.name,
                          *_where(args), "--force", "--quiet"])
    else:
        gcloud("delete", ["compute", "tpus", "tpu-vm", "delete", args.name, *_where(args),
                          "--quiet"])


def parser() -> Parser:
    p = Parser(prog="launch/tpu.py", description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    common = Parser(add_help=False)
    common.add_argument("--name", required=True, help="the TPU (and queued resource) name")
    common.add_argument("--zone", help="e.g. us-central2-b (default: gcloud's compute/zone)")
    common.add_argument("--project", help="default: gcloud's project")
    common.add_argument("--dry_run", action="store_true",
                        help="print the gcloud commands, one per line, and run nothing")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=Parser)

    def add(name, fn, help_):
        s = sub.add_parser(name, parents=[common], help=help_, description=help_,
                           allow_abbrev=False)
        s.set_defaults(fn=fn)
        return s

    s = add("create", cmd_create, "create a TPU VM slice, or a queued resource")
    s.add_argument("--accelerator_type", required=True, help="v4-32, v5litepod-16, v5p-8, ...")
    s.add_argument("--version", help="the TPU runtime (default: "
                   + ", ".join(f"{g}: {v}" for g, v in RUNTIME_VERSIONS.items()) + ")")
    s.add_argument("--queued", action="store_true",
                   help="a queued resource: waits for capacity instead of failing")
    capacity = s.add_mutually_exclusive_group()
    capacity.add_argument("--spot", action="store_true", help="spot capacity (preemptible)")
    capacity.add_argument("--reserved", action="store_true", help="the project's reservation")

    s = add("setup", cmd_setup, f"put the code in ~/{REMOTE_DIR} on every worker, then "
                                f"pip install -e .[tpu] there")
    s.add_argument("--source", default=str(CHECKOUT),
                   help="the checkout to copy (default: this one); the files git lists")
    s.add_argument("--repo", help="clone this git URL instead of copying a checkout")
    s.add_argument("--ref", help="with --repo: the branch, tag or commit (default: the "
                                 "repository's default branch)")
    s.add_argument("--extras", default="tpu", help="pip extras to install (default: tpu)")

    s = add("train", cmd_train, "run launch/train.py on every worker, detached; every flag "
                                "not listed here goes to launch/train.py as is")
    s.add_argument("--config", required=True, help="launch/train.py's --config")
    s.add_argument("--workdir", required=True,
                   help="launch/train.py's --workdir: a gs:// bucket every worker writes")
    s.add_argument("--run", help=f"the log's name, ~/{LOG_DIR}/RUN.log (default: the time)")

    s = add("logs", cmd_logs, "print the end of a worker's log")
    s.add_argument("--worker", type=int, default=0, help="which worker (default: 0)")
    s.add_argument("--run", help="which run (default: the newest)")
    s.add_argument("--lines", type=int, default=100, help="how many lines (default: 100)")
    s.add_argument("--follow", action="store_true", help="keep printing (tail -F)")

    s = add("status", cmd_status, "describe the TPU (or queued resource) and say which "
                                  "workers run the trainer")
    s.add_argument("--queued", action="store_true", help="describe the queued resource")

    s = add("delete", cmd_delete, "delete the TPU (no prompt)")
    s.add_argument("--queued", action="store_true",
                   help="delete the queued resource and its TPU VMs")

    # `--help` shows every sub-command's flags, not only their names.
    p.epilog = "sub-commands:\n" + "".join(
        "  " + choice.format_usage().removeprefix("usage: ") for choice in sub.choices.values())
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        # `train ... -- --flag` is accepted too: what follows `--` is launch/train.py's.
        after = argv[argv.index("--") + 1:] if "--" in argv else []
        argv = argv[:argv.index("--")] if "--" in argv else argv
        args, unknown = parser().parse_known_args(argv)
        if args.command != "train" and (unknown or after):
            raise Failed(f"{args.command}: unrecognized arguments: {' '.join(unknown + after)}", 2)
        args.trainer_flags = unknown + after
        if args.command == "setup" and args.ref and not args.repo:
            raise Failed("setup: --ref needs --repo (a copied checkout is copied as it is)", 2)
        args.fn(args, Gcloud(args.dry_run))
    except Failed as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
