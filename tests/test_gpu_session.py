"""benchmarks/gpu_session.sh, the 15-minute GPU session, checked on CPU: the script parses
(bash -n), its dry run (GPU_SESSION_DRY=1) writes the three files a call brings back, and
every command it would run on the GPU takes the flags and config keys it is given (a flag
renamed since the script was written fails here, not in the session's device minutes)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import tarfile

from tests.conftest import REPO, load_script

SCRIPT = REPO / "benchmarks" / "gpu_session.sh"


def _dry_run(tmp_path, part: str) -> tuple[str, str]:
    env = dict(os.environ, GPU_SESSION_DRY="1", OUT=str(tmp_path / "out"),
               GPU_SESSION_WORK=str(tmp_path / "work"))
    proc = subprocess.run(["bash", str(SCRIPT), part], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "out"
    return (out / f"session{part}.log").read_text(), (out / f"summary{part}.txt").read_text()


def _commands(log: str) -> dict:
    """{step: argv} of the '== HH:MM:SS step (limit N s): command' lines."""
    found = re.findall(r"^== \S+ (\w+) \(limit (\d+) s\): (.*)$", log, re.M)
    return {name: (int(limit), shlex.split(cmd)) for name, limit, cmd in found}


def test_the_script_parses():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_dry_runs_write_three_files_a_call_and_plan_the_budget(tmp_path):
    steps = {}
    for part in ("1", "2"):
        log, summary = _dry_run(tmp_path, part)
        commands = _commands(log)
        steps.update(commands)
        for name in commands:
            assert re.search(rf"^{name}: \d+ s, exit 0$", summary, re.M), summary
        assert summary.rstrip().endswith(f"part {part} done")
        with tarfile.open(tmp_path / "out" / f"files{part}.tar.gz") as tar:
            tar.getmembers()
    assert list(steps) == ["attention_masks", "attention_sweep", "suite1", "suite2",
                           "train_py", "pytest_fp8"]
    assert sorted(os.listdir(tmp_path / "out")) == [
        f"{kind}{part}.{ext}" for kind, ext in (("files", "tar.gz"), ("session", "log"),
                                                 ("summary", "txt")) for part in "12"]
    # The limits: each call's steps, with the setup and the summary (10 s each), within the
    # timeout_s the script's header gives its call (the run tool's limit is 600).
    limits = {name: limit for name, (limit, _) in steps.items()}
    text = SCRIPT.read_text()
    timeouts = [int(t) for t in re.findall(r'gpu_session\.sh \d", carry=\[".whl"\], '
                                           r'timeout_s=(\d+)\)', text)]
    assert len(timeouts) == 2 and max(timeouts) <= 600, timeouts
    for timeout, names in zip(timeouts, (("attention_masks", "attention_sweep", "suite1"),
                                         ("suite2", "train_py", "pytest_fp8"))):
        assert 20 + sum(limits[n] for n in names) <= timeout, (timeout, names)
    # The suite's deadlines leave its table time inside the step's limit.
    for name in ("suite1", "suite2"):
        argv = steps[name][1]
        deadline = float(next(a for a in argv if a.startswith("--deadline_s=")).split("=")[1])
        assert deadline + 15 <= limits[name], (name, deadline)


def test_every_command_takes_its_flags(tmp_path):
    steps = {}
    for part in ("1", "2"):
        steps.update(_commands(_dry_run(tmp_path, part)[0]))
    load_script("benchmarks/gpu_suite.py")  # puts benchmarks/ on sys.path
    suite = importlib.import_module("gpu.suite")
    p = suite.parser("")
    for name in ("suite1", "suite2"):
        argv = steps[name][1]
        assert argv[:2] == ["python3", "benchmarks/gpu_suite.py"], argv
        args = p.parse_args(argv[2:])
        cases = suite.resolve_args(p, args)
        variants = suite.parse_variants(args.variants, cases)
        assert variants and all(only <= set(cases) for _, _, only in variants), variants
    assert steps["suite1"][1][2:] and "--skip_mask_check" in steps["suite1"][1]

    sweep = steps["attention_sweep"][1]
    assert sweep[:2] == ["python3", "benchmarks/attention_sweep.py"]
    names = next(a for a in sweep if a.startswith("--shapes=")).split("=")[1].split(",")
    sweep_module = importlib.import_module("attention_sweep")
    assert set(names) <= set(sweep_module.SHAPES)

    train = steps["train_py"][1]
    assert train[:3] == ["python3", "launch/train.py", "--config=configs/bert_large.py"]
    assert not any(a.startswith("--config.model.dtype") for a in train)  # auto, as documented
    from bert_jax.train.config import load_config

    overrides = {}
    for a in (a[len("--config."):] for a in train if a.startswith("--config.")):
        key, value = a.split("=", 1)
        overrides[key] = int(value) if value.lstrip("-").isdigit() else value
    config = load_config("configs/bert_large.py", overrides)  # unknown keys raise
    assert config.data.source == "synthetic" and config.model.dtype == "auto"

    pytest_argv = steps["pytest_fp8"][1]
    for path in (a for a in pytest_argv if a.startswith("tests/")):
        assert (REPO / path).exists(), path

