"""launch/slurm.sbatch under a fake SLURM: a fake `srun` on PATH records its arguments and
environment; the script asks for one task per node with all of its GPUs, runs
launch/train.py with --distributed=on, the config, workdir and extra flags, and lets each
process see every GPU of its node."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "launch" / "slurm.sbatch"

FAKE_SRUN = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["FAKE_SRUN_LOG"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(),
               "env": {{k: v for k, v in os.environ.items()
                       if k.startswith(("SLURM_", "JAX_", "PYTHONUNBUFFERED"))}}}}, f)
"""

SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
             "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_GPUS_ON_NODE": "4",
             "SLURM_SUBMIT_DIR": str(REPO)}


def sbatch(tmp_path, *args, **env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    log = tmp_path / "srun.json"
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    full.update(SLURM_ENV, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                FAKE_SRUN_LOG=str(log))
    full.update(env)
    full = {k: v for k, v in full.items() if v is not None}
    r = subprocess.run(["bash", str(SCRIPT), *args], env=full, capture_output=True, text=True,
                       cwd=tmp_path, timeout=60)
    return r, (json.loads(log.read_text()) if log.exists() else None)


def test_the_script_parses():
    r = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_one_task_per_node_with_all_its_gpus():
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", SCRIPT.read_text(), re.M))
    assert directives["ntasks-per-node"] == "1"
    assert int(directives["gpus-per-node"]) >= 1
    assert directives["signal"].startswith("TERM@")  # the trainer saves on SIGTERM


def test_srun_runs_the_trainer_with_distributed_on(tmp_path):
    r, call = sbatch(tmp_path, "--config.train.steps=100", "--config.mesh.fsdp=-1",
                     CONFIG="configs/bert_large.py", WORKDIR="/shared/large",
                     EXTRA_FLAGS="--config.model.dtype=bfloat16 --verbose")
    assert r.returncode == 0, r.stderr
    assert call["argv"] == [
        "--ntasks-per-node=1", "--kill-on-bad-exit=1", "python", "launch/train.py",
        "--config=configs/bert_large.py", "--workdir=/shared/large", "--distributed=on",
        "--config.model.dtype=bfloat16", "--verbose", "--config.train.steps=100",
        "--config.mesh.fsdp=-1"]
    assert call["cwd"] == str(REPO)  # the submit folder, not sbatch's spool copy
    env = call["env"]
    assert env["JAX_LOCAL_DEVICE_IDS"] == "0,1,2,3"  # every GPU of the node, not one
    assert env["SLURM_JOB_NUM_NODES"] == "2" and env["SLURM_JOB_ID"] == "4242"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert "2 nodes x 4 GPUs, config configs/bert_large.py, workdir /shared/large" in r.stdout


def test_defaults_and_python(tmp_path):
    r, call = sbatch(tmp_path, WORKDIR="gs://bucket/base", PYTHON="/opt/venv/bin/python",
                     SLURM_GPUS_ON_NODE="8")
    assert r.returncode == 0, r.stderr
    assert call["argv"][2:] == ["/opt/venv/bin/python", "launch/train.py",
                                "--config=configs/bert_base.py", "--workdir=gs://bucket/base",
                                "--distributed=on"]
    assert call["env"]["JAX_LOCAL_DEVICE_IDS"] == "0,1,2,3,4,5,6,7"


def test_without_workdir_it_stops_before_srun(tmp_path):
    r, call = sbatch(tmp_path, WORKDIR=None)
    assert r.returncode != 0
    assert call is None
    assert "set WORKDIR" in r.stderr


def test_the_trainer_takes_the_flags_the_script_passes():
    """--distributed=on is a flag of launch/train.py (what the script relies on)."""
    text = (REPO / "launch" / "train.py").read_text()
    assert re.search(r'DEFINE_enum\(\s*"distributed", "auto", \["auto", "on", "off"\]', text)


def test_jax_reads_the_local_device_ids_the_script_sets(monkeypatch):
    """Under SLURM, jax.distributed.initialize() gives each process the GPU of its local
    rank only; with JAX_LOCAL_DEVICE_IDS, which the script sets, every GPU of the node.
    (Stopped once the parameters are settled, before any connection.)"""
    pytest.importorskip("jax")
    from jax._src import clusters, distributed

    for key, value in {**SLURM_ENV, "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_NTASKS": "2",
                       "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}.items():
        monkeypatch.setenv(key, value)
    detect = clusters.ClusterEnv.auto_detect_unset_distributed_params

    class Settled(Exception):
        pass

    def stop(*args):
        raise Settled(detect(*args))

    monkeypatch.setattr(clusters.ClusterEnv, "auto_detect_unset_distributed_params", stop)

    def settled():
        with pytest.raises(Settled) as e:
            distributed.State().initialize()
        return e.value.args[0]

    monkeypatch.delenv("JAX_LOCAL_DEVICE_IDS", raising=False)
    assert settled()[1:] == (2, 1, [0])  # one GPU per process
    monkeypatch.setenv("JAX_LOCAL_DEVICE_IDS", "0,1,2,3")
    address, count, index, devices = settled()
    assert (address, count, index, devices) == (f"gpu01:{4242 % 4096 + 61440}", 2, 1,
                                                [0, 1, 2, 3])
