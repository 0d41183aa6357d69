"""launch/tpu.py against a fake `gcloud` on PATH that records its arguments (one JSON line
per call) and fails on demand: each sub-command runs the right gcloud commands in the right
order, a failure ends in one `error:` line naming the step and gcloud's message, --dry_run
runs nothing. The remote command of `train` is run too, by a local bash, to check that its
quoting holds and that it leaves the trainer running detached with its log."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

TPU = str(REPO / "launch" / "tpu.py")
WHERE = ["--zone=us-central2-b", "--project=proj"]

FAKE_GCLOUD = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
record = {{"argv": args}}
if args[:4] == ["compute", "tpus", "tpu-vm", "scp"]:  # the staged copy is gone afterwards
    src = args[5]
    record["files"] = sorted(os.path.relpath(os.path.join(d, f), src)
                             for d, _, fs in os.walk(src) for f in fs)
with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
    f.write(json.dumps(record) + "\\n")
fail = os.environ.get("FAKE_GCLOUD_FAIL")
if fail and " ".join(args).startswith("compute tpus " + fail):
    print("Using zone us-central2-b", file=sys.stderr)
    print("ERROR: (gcloud.compute.tpus." + fail.replace(" ", ".") + ") PERMISSION_DENIED: "
          "quota exceeded for TPUS_PER_PROJECT", file=sys.stderr)
    sys.exit(1)
if args[:2] == ["storage", "cp"]:
    sys.exit(0)
print("gcloud ok")
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """PATH with the fake gcloud first; returns a function that reads its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(FAKE_GCLOUD)
    gcloud.chmod(gcloud.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "gcloud_calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GCLOUD_LOG", str(log))
    monkeypatch.delenv("FAKE_GCLOUD_FAIL", raising=False)

    def calls(full=False):
        if not log.exists():
            return []
        records = [json.loads(line) for line in log.read_text().splitlines()]
        return records if full else [r["argv"] for r in records]

    return calls


def tpu(*args, fail=None, path=None):
    env = dict(os.environ)
    if fail:
        env["FAKE_GCLOUD_FAIL"] = fail
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, TPU, *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)


def ssh(worker, command):
    return ["compute", "tpus", "tpu-vm", "ssh", "bert", *WHERE, f"--worker={worker}",
            f"--command={command}"]


INSTALL = "cd ~/bert_jax && python3 -m pip install --quiet -e '.[tpu]'"


def test_create_a_tpu_vm(fake):
    r = tpu("create", "--name=bert", *WHERE, "--accelerator_type=v4-32")
    assert r.returncode == 0, r.stderr
    assert fake() == [["compute", "tpus", "tpu-vm", "create", "bert", *WHERE,
                       "--accelerator-type=v4-32", "--version=tpu-ubuntu2204-base"]]


def test_create_a_queued_resource_with_spot_capacity(fake):
    r = tpu("create", "--queued", "--spot", "--name=bert", *WHERE,
            "--accelerator_type=v5litepod-16")
    assert r.returncode == 0, r.stderr
    assert fake() == [["compute", "tpus", "queued-resources", "create", "bert",
                       "--node-id=bert", *WHERE, "--accelerator-type=v5litepod-16",
                       "--runtime-version=v2-alpha-tpuv5-lite", "--spot"]]


@pytest.mark.parametrize("accelerator, version", [
    ("v2-8", "tpu-ubuntu2204-base"), ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e")])
def test_create_picks_the_runtime_of_the_generation(fake, accelerator, version):
    assert tpu("create", "--name=bert", *WHERE, f"--accelerator_type={accelerator}",
               "--reserved").returncode == 0
    assert fake()[0][-2:] == [f"--version={version}", "--reserved"]


def test_create_with_an_explicit_version_and_unknown_generation(fake):
    assert tpu("create", "--name=bert", *WHERE, "--accelerator_type=v9-8",
               "--version=my-runtime").returncode == 0
    assert fake()[0][-1] == "--version=my-runtime"
    r = tpu("create", "--name=bert", *WHERE, "--accelerator_type=v9-8")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: create: no default runtime for v9; give --version "
        "(gcloud compute tpus versions list --zone=...)"]
    assert len(fake()) == 1  # nothing more was run


def _checkout(tmp_path):
    """A small git checkout: tracked, untracked and ignored files."""
    src = tmp_path / "checkout"
    (src / "launch").mkdir(parents=True)
    (src / "launch" / "train.py").write_text("print('train')\n")
    (src / "setup.cfg").write_text("[metadata]\nname = x\n")
    (src / ".gitignore").write_text(".venv/\n*.tfrecord\n")
    for cmd in (["init", "-q"], ["add", "-A"],
                ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(src), *cmd], check=True)
    (src / "notes.md").write_text("untracked, not ignored\n")
    (src / ".venv").mkdir()
    (src / ".venv" / "big.bin").write_text("ignored\n")
    (src / "data.tfrecord").write_text("ignored\n")
    return src


def test_setup_copies_the_files_git_lists_then_installs(fake, tmp_path):
    src = _checkout(tmp_path)
    r = tpu("setup", "--name=bert", *WHERE, f"--source={src}")
    assert r.returncode == 0, r.stderr
    calls = fake(full=True)
    assert [c["argv"] for c in calls] == [
        ssh("all", "rm -rf ~/bert_jax"),
        ["compute", "tpus", "tpu-vm", "scp", "--recurse", calls[1]["argv"][5], "bert:bert_jax",
         *WHERE, "--worker=all"],
        ssh("all", INSTALL)]
    staged = calls[1]["argv"][5]
    assert staged.endswith("/bert_jax") and not os.path.exists(staged)  # removed after
    assert calls[1]["files"] == [".gitignore", "launch/train.py", "notes.md", "setup.cfg"]


def test_setup_from_a_git_ref(fake):
    r = tpu("setup", "--name=bert", *WHERE, "--repo=https://example.com/bert jax.git",
            "--ref=v1.0", "--extras=tpu,tensorboard")
    assert r.returncode == 0, r.stderr
    assert fake() == [
        ssh("all", "rm -rf ~/bert_jax && git clone --quiet 'https://example.com/bert jax.git' "
                   "~/bert_jax && git -C ~/bert_jax checkout --quiet v1.0"),
        ssh("all", "cd ~/bert_jax && python3 -m pip install --quiet -e '.[tpu,tensorboard]'")]


def test_setup_refuses_a_folder_that_is_not_a_checkout(fake, tmp_path):
    r = tpu("setup", "--name=bert", *WHERE, f"--source={tmp_path}")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: setup: {tmp_path} is not a git "
                                                   f"checkout"), r.stderr
    assert fake() == []


TRAIN = ["train", "--name=bert", *WHERE, "--run=base", "--config=configs/bert_base.py",
         "--workdir=gs://bucket/base", "--config.mesh.fsdp=-1", "--config.train.steps", "10"]


def test_train_runs_the_same_command_on_every_worker(fake):
    r = tpu(*TRAIN)
    assert r.returncode == 0, r.stderr
    (call,) = fake()
    assert call[:8] == ssh("all", "")[:8]
    command = call[8].removeprefix("--command=")
    assert command.startswith("cd ~/bert_jax && mkdir -p ~/bert_jax_logs && setsid nohup bash "
                              "-c ")
    assert command.endswith(" > /dev/null 2>&1 < /dev/null &")
    inner = shlex.split(command)[11]  # the detached script
    assert ("python3 launch/train.py --config=configs/bert_base.py --workdir=gs://bucket/base "
            "--config.mesh.fsdp=-1 --config.train.steps 10 > \"$HOME/bert_jax_logs/base.log\" "
            "2>&1 &") in inner.splitlines()
    assert "gs://bucket/base/logs/base\".worker-$w.log\"" in inner
    assert "started run base" in r.stderr


def test_train_takes_the_trainer_flags_after_a_double_dash(fake):
    r = tpu("train", "--name=bert", *WHERE, "--run=base", "--config=configs/bert_tiny.py",
            "--workdir=gs://b/w", "--", "--config.train.steps=5", "--run=not_ours")
    assert r.returncode == 0, r.stderr
    assert ("python3 launch/train.py --config=configs/bert_tiny.py --workdir=gs://b/w "
            "--config.train.steps=5 --run=not_ours >") in fake()[0][8]


def _fake_tools(tmp_path):
    """python3 (prints its arguments, sleeps), curl (the worker's index) for a worker."""
    bin_dir = tmp_path / "worker_bin"
    bin_dir.mkdir()
    for name, body in (("python3", 'echo "trainer $*"; sleep 3; echo done; exit 3'),
                       ("curl", "echo 3")):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/bash\n{body}\n")
        tool.chmod(0o755)
    return bin_dir


def test_the_train_command_runs_detached_and_logs(fake, tmp_path):
    """The remote command as a worker's shell runs it: it returns at once, the trainer
    runs on with its output in ~/bert_jax_logs/RUN.log, and the log goes to the bucket."""
    assert tpu(*TRAIN).returncode == 0
    command = fake()[0][8].removeprefix("--command=")
    home = tmp_path / "home"
    (home / "bert_jax").mkdir(parents=True)
    env = dict(os.environ, HOME=str(home),
               PATH=f"{_fake_tools(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    start = time.monotonic()
    subprocess.run(["bash", "-c", command], env=env, check=True, timeout=30,
                   cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert time.monotonic() - start < 2  # detached: the trainer sleeps 3 s
    log = home / "bert_jax_logs" / "base.log"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and fake()[-1][0] != "storage":
        time.sleep(0.1)
    assert log.read_text().splitlines() == [
        "trainer launch/train.py --config=configs/bert_base.py --workdir=gs://bucket/base "
        "--config.mesh.fsdp=-1 --config.train.steps 10", "done",
        "launch/tpu.py: the trainer exited with status 3"]
    assert fake()[-1] == ["storage", "cp", "--quiet", str(log),
                          "gs://bucket/base/logs/base.worker-3.log"]


def test_train_with_a_local_workdir_warns_and_copies_nothing(fake):
    r = tpu("train", "--name=bert", *WHERE, "--run=r", "--config=configs/bert_tiny.py",
            "--workdir=/tmp/w")
    assert r.returncode == 0, r.stderr
    assert "warning: --workdir=/tmp/w is not a bucket" in r.stderr
    assert "storage cp" not in fake()[0][8]


def test_train_needs_config_and_workdir(fake):
    r = tpu("train", "--name=bert", *WHERE, "--config=configs/bert_tiny.py")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: train: the following arguments are required: --workdir"]
    assert fake() == []


def test_train_refuses_a_config_that_is_not_in_the_checkout(fake):
    r = tpu("train", "--name=bert", *WHERE, "--config=configs/nope.py:x", "--workdir=gs://b/w")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: train: --config=configs/nope.py:x: no file configs/nope.py in {REPO} (a path "
        "relative to the checkout, e.g. configs/bert_base.py)"]
    assert fake() == []  # nothing started on any worker


def test_logs_status_delete(fake):
    assert tpu("logs", "--name=bert", *WHERE, "--worker=2", "--run=base", "--lines=20",
               "--follow").returncode == 0
    assert tpu("status", "--name=bert", *WHERE).returncode == 0
    assert tpu("status", "--queued", "--name=bert", *WHERE).returncode == 0
    assert tpu("delete", "--name=bert", *WHERE).returncode == 0
    assert tpu("delete", "--queued", "--name=bert", *WHERE).returncode == 0
    calls = fake()
    assert calls[0] == ssh("2", 'log="$HOME/bert_jax_logs/base.log"; if [ ! -f "$log" ]; then '
                                'echo "no log base in ~/bert_jax_logs: start one with '
                                'launch/tpu.py train" >&2; exit 1; fi; echo "== $log"; '
                                'tail -F -n 20 "$log"')
    assert calls[1] == ["compute", "tpus", "tpu-vm", "describe", "bert", *WHERE]
    assert calls[2][:8] == ssh("all", "")[:8] and "pgrep -af" in calls[2][8]
    assert calls[3] == ["compute", "tpus", "queued-resources", "describe", "bert", *WHERE]
    assert calls[4] == calls[2]
    assert calls[5:] == [["compute", "tpus", "tpu-vm", "delete", "bert", *WHERE, "--quiet"],
                         ["compute", "tpus", "queued-resources", "delete", "bert", *WHERE,
                          "--force", "--quiet"]]


def test_the_status_command_finds_the_trainer(fake, tmp_path):
    """The workers' check, run by a local bash: "training" only while a run that `train`
    started is on (not the check's own shell, whose command line names the pattern)."""
    assert tpu("status", "--name=bert", *WHERE).returncode == 0
    assert tpu(*TRAIN).returncode == 0
    check, train = (c[8].removeprefix("--command=") for c in fake()[1:3])
    home = tmp_path / "home"
    (home / "bert_jax").mkdir(parents=True)
    env = dict(os.environ, HOME=str(home),
               PATH=f"{_fake_tools(tmp_path)}{os.pathsep}{os.environ['PATH']}")

    def status():
        return subprocess.run(["bash", "-c", check], env=env, capture_output=True,
                              text=True).stdout

    assert status() == "worker 3: no trainer\n"
    subprocess.run(["bash", "-c", train], env=env, check=True, cwd=tmp_path)
    assert status() == "worker 3: training (base)\n"  # the fake trainer runs for 3 s
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and status() != "worker 3: no trainer\n":
        time.sleep(0.2)
    assert status() == "worker 3: no trainer\n"
    assert "exited with status 3" in (home / "bert_jax_logs" / "base.log").read_text()


@pytest.mark.parametrize("args, fail, step", [
    (["create", "--accelerator_type=v4-8"], "tpu-vm create", "create"),
    (["create", "--queued", "--accelerator_type=v4-8"], "queued-resources create", "create"),
    (["setup", "--repo=https://example.com/b.git"], "tpu-vm ssh", "setup: clone"),
    (["train", "--config=configs/bert_tiny.py", "--workdir=gs://b/w"], "tpu-vm ssh", "train"),
    (["logs"], "tpu-vm ssh", "logs"),
    (["status"], "tpu-vm describe", "status: describe"),
    (["status", "--queued"], "queued-resources describe", "status: describe"),
    (["delete"], "tpu-vm delete", "delete"),
    (["delete", "--queued"], "queued-resources delete", "delete"),
])
def test_a_gcloud_failure_is_one_line_naming_the_step(fake, args, fail, step):
    r = tpu(*args, "--name=bert", *WHERE, fail=fail)
    assert r.returncode == 1
    errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert errors == [f"error: {step}: gcloud failed: (gcloud.compute.tpus.{fail.replace(' ', '.')}"
                      f") PERMISSION_DENIED: quota exceeded for TPUS_PER_PROJECT"]
    assert r.stderr.splitlines()[-1] == errors[0]
    assert len(fake()) == 1  # stopped at the failed step


def test_setup_stops_at_the_failed_copy(fake, tmp_path):
    r = tpu("setup", "--name=bert", *WHERE, f"--source={_checkout(tmp_path)}",
            fail="tpu-vm scp")
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1].startswith("error: setup: copy: gcloud failed: "
                                                "(gcloud.compute.tpus.tpu-vm.scp) ")
    assert [c[3] for c in fake()] == ["ssh", "scp"]  # no install after it


def test_gcloud_message_of_a_remote_command_on_several_workers():
    sys.path.insert(0, str(REPO / "launch"))
    try:
        import tpu as launcher
    finally:
        sys.path.pop(0)
    stderr = ("SSH: Attempting to connect to worker 0...\nSSH: Attempting to connect to "
              "worker 1...\nno log yet in ~/bert_jax_logs\n##### Command execution on worker 1 "
              "failed with exit status 1. Continuing.\n")
    assert launcher.gcloud_message(stderr) == "no log yet in ~/bert_jax_logs (worker 1 failed)"
    assert launcher.gcloud_message("ERROR: (gcloud.x) Error parsing [tpu].\nThe [tpu] "
                                   "resource is not properly specified.\n") == (
        "(gcloud.x) Error parsing [tpu]. The [tpu] resource is not properly specified.")


def test_dry_run_prints_the_commands_and_runs_nothing(fake, tmp_path):
    r = tpu("create", "--queued", "--name=bert", *WHERE, "--accelerator_type=v4-32", "--dry_run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "gcloud compute tpus queued-resources create bert --node-id=bert --zone=us-central2-b "
        "--project=proj --accelerator-type=v4-32 --runtime-version=tpu-ubuntu2204-base"]
    r = tpu("setup", "--name=bert", *WHERE, f"--source={_checkout(tmp_path)}", "--dry_run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# STAGING: a temporary folder") and "4 files" in lines[0]
    assert [shlex.split(l)[1:] for l in lines[1:]] == [
        ssh("all", "rm -rf ~/bert_jax"),
        ["compute", "tpus", "tpu-vm", "scp", "--recurse", "STAGING/bert_jax", "bert:bert_jax",
         *WHERE, "--worker=all"],
        ssh("all", INSTALL)]
    for sub in (["logs"], ["status"], ["delete", "--queued"]):
        r = tpu(*sub, "--name=bert", *WHERE, "--dry_run")
        assert r.returncode == 0 and r.stdout.startswith("gcloud compute tpus "), r
    assert fake() == []
    # The printed command is the one that runs (its script spans lines, quoted).
    r = tpu(*TRAIN, "--dry_run")
    assert fake() == []
    assert tpu(*TRAIN).returncode == 0
    assert shlex.split(r.stdout) == ["gcloud", *fake()[0]]


def test_without_gcloud_one_line_says_to_install_it(tmp_path):
    r = tpu("status", "--name=bert", path=str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "error: gcloud is not on PATH: install the Google Cloud SDK "
        "(https://cloud.google.com/sdk/docs/install), then run `gcloud init`"]
    r = tpu("status", "--name=bert", "--dry_run", path=str(tmp_path))  # no gcloud needed
    assert r.returncode == 0 and r.stdout.startswith("gcloud compute tpus tpu-vm describe")


def test_help_lists_every_sub_commands_flags():
    r = tpu("--help")
    assert r.returncode == 0
    for flag in ("--accelerator_type", "--queued", "--spot", "--reserved", "--repo", "--ref",
                 "--source", "--config", "--workdir", "--run", "--worker", "--follow",
                 "--dry_run"):
        assert flag in r.stdout, flag


def test_the_launcher_imports_neither_jax_nor_bert_jax():
    code = (f"import runpy, sys; runpy.run_path({TPU!r}, run_name='not_main'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'bert_jax')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stderr


def test_the_docs_commands_run_dry(fake):
    """docs/clusters.md's launch/tpu.py commands, as written, with --dry_run."""
    from tests.test_docs import commands

    found = [shlex.split(c) for c in commands(REPO / "docs" / "clusters.md")
             if c.startswith("launch/tpu.py ")]
    assert [argv[1] for argv in found] == ["create", "setup", "train", "logs", "delete"]
    for argv in found:
        r = tpu(*argv[1:], "--dry_run")
        assert r.returncode == 0, (argv, r.stderr)
        printed = [l for l in r.stdout.splitlines() if not l.startswith("# STAGING")]
        assert shlex.split("\n".join(printed))[:3] == ["gcloud", "compute", "tpus"], r.stdout
    assert fake() == []
