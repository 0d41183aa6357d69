"""Fine-tuning on a device mesh gives the single-device numbers: the tiny pair fine-tune in
a subprocess with 8 simulated CPU devices, against the same run on one device."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax.traverse_util import flatten_dict

from tests.tasks.conftest import REPO
from tests.train.common import launch_processes
from tests.tasks.finetune_common import losses


def _run_meshes(tmp_path, meshes: list[str]) -> dict:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        [sys.executable, str(REPO / "tests/tasks/finetune_mesh_worker.py"), str(tmp_path),
         *meshes], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-6000:]
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def _check(out: dict, reference_run) -> None:
    run_dir = reference_run[0] / "run_0"
    ref_loss, ref_gnorm = losses(run_dir), losses(run_dir, "train/grad_norm")
    ref_loss = [ref_loss[s] for s in range(1, 5)]
    ref_gnorm = [ref_gnorm[s] for s in range(1, 5)]
    # The updates must move the loss well beyond the tolerance, or the match says little.
    assert max(ref_loss) - min(ref_loss) > 1e-2, ref_loss
    with open(reference_run[0] / "metrics.jsonl") as f:
        ref_dev = [json.loads(line) for line in f][0]["dev/accuracy"]
    for mesh, got in out.items():
        np.testing.assert_allclose(got["loss"], ref_loss, rtol=1e-4, err_msg=mesh)
        np.testing.assert_allclose(got["grad_norm"], ref_gnorm, rtol=1e-4, err_msg=mesh)
        # Same predictions up to a near-tie or two among the 200 dev pairs.
        assert abs(got["dev"] - ref_dev) <= 0.01, (mesh, got["dev"], ref_dev)


def test_mesh_data_fsdp_tensor_matches_one_device(tmp_path, reference_run):
    """One mesh using all three axes (2 x 2 x 2): ~30 s of compiles in the subprocess."""
    out = _run_meshes(tmp_path, ["2.2.2"])
    _check(out, reference_run)
    # intermediate kernel [embed 32, mlp 64]: embed over fsdp=2, mlp over tensor=2; the
    # 30,522-row vocabulary splits evenly over tensor=2.
    assert out["2.2.2"]["intermediate"] == [16, 32]
    assert out["2.2.2"]["word_embeddings"] == "P('tensor', 'fsdp')"


@pytest.mark.slow  # three meshes, each compiling init, train and eval steps: ~1-2 min
def test_meshes_match_one_device(tmp_path, reference_run):
    out = _run_meshes(tmp_path, ["8.1.1", "2.4.1", "2.1.4"])
    _check(out, reference_run)
    assert out["2.4.1"]["intermediate"] == [8, 64]
    assert out["2.1.4"]["intermediate"] == [32, 16]
    # 30,522 rows do not split over tensor=4: that dimension stays whole (sharding.fit_sharding).
    assert out["2.1.4"]["word_embeddings"] == "P(None, 'fsdp')"


def _launch(workdir, *extra) -> list[tuple[int, str, str]]:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return launch_processes(str(REPO / "tests/tasks/finetune_process_worker.py"),
                            ("2", workdir, *extra), env, REPO, timeout=600)


@pytest.mark.slow  # two processes, each importing and compiling: ~1 min
def test_two_processes_match_one_device(tmp_path, reference_run):
    for rc, stdout, stderr in _launch(tmp_path):
        assert rc == 0, stderr[-6000:]
        assert "done" in stdout
    got, want = losses(tmp_path / "run_0"), losses(reference_run[0] / "run_0")
    np.testing.assert_allclose([got[s] for s in range(1, 5)], [want[s] for s in range(1, 5)],
                               rtol=1e-4)
    # Process 0 alone wrote the run's record and the summary; every dev pair predicted once.
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r.get("run") for r in records] == [0, None] and records[1]["summary"]
    preds = (tmp_path / "run_0" / "dev_predictions-dev.tsv").read_text().splitlines()
    assert len(preds) == 201
    # best_model/ holds the run's params, gathered from both hosts' shards: the final
    # checkpoint's, leaf for leaf (stored unscanned).
    from bert_jax.convert.model_dir import load_model_dir
    from bert_jax.models.params import unstack_layers

    best, best_config = load_model_dir(str(tmp_path / "best_model"))
    state_dir = str(tmp_path / "run_0" / "checkpoints" / "4" / "state")
    with ocp.PyTreeCheckpointer() as ckptr:  # saved sharded over 2 processes: as numpy
        as_numpy = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                          ckptr.metadata(state_dir).item_metadata.tree)
        final = ckptr.restore(state_dir, args=ocp.args.PyTreeRestore(
            restore_args=as_numpy))["params"]
    if "layers" in final["bert"]["encoder"]:
        final = unstack_layers(final, best_config.num_hidden_layers)
    got, want = flatten_dict(best), flatten_dict(final)
    assert sorted(got) == sorted(want) and len(want) > 10
    for key in want:
        np.testing.assert_array_equal(got[key], np.asarray(want[key]), err_msg="/".join(key))
    # Both processes saved their data position in the (kept) final checkpoint.
    data_dir = tmp_path / "run_0" / "checkpoints" / "4" / "data"
    assert sorted(p.name for p in data_dir.iterdir() if p.suffix == ".npz") == [
        "process_0-of-2.npz", "process_1-of-2.npz"]


@pytest.mark.slow  # two processes, each importing and compiling: ~1 min
def test_input_failing_on_one_process_stops_both_at_the_same_step(tmp_path):
    """The loop's input gate in a fine-tuning run: process 1's input fails when asked for
    batch 3; both processes stop after step 3's void step at the same step, each with one
    error, with step 3 (the last good one) saved, instead of process 0 waiting in the next
    step's collectives."""
    (rc0, out0, err0), (rc1, out1, err1) = _launch(tmp_path, 3)
    assert (rc0, rc1) == (3, 3), err0[-3000:] + err1[-3000:]
    assert ("error DataError: batch 3 of process 1 is unreadable Saved step 3, the last good "
            "one: the same command resumes from it.") in out1, out1[-3000:]
    assert ("error InputFailedElsewhere: the input of process 1 failed (its log names the "
            "file and what to do); every process stopped at step 3. Saved step 3") in out0, \
        out0[-3000:]
    assert sorted(os.listdir(tmp_path / "run_0" / "checkpoints")) == ["2", "3"]
