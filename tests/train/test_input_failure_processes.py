"""A shard that fails mid-run on one of two processes stops both at the same step, with the
last good step saved, each in one error; repaired, the run resumes exactly
(bert_jax.train.loop._InputGate). Before, the failing process stopped to save while the
other went into the next step's collectives: both hung, nothing was saved. A file that
fails the check before compiling, on one process only, stops both there
(bert_jax.train.runtime.agree)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.data import fixtures
from tests.data.test_corrupt_midrun import cut_last_record
from tests.train.common import LENGTH, PREDICTIONS, launch_processes
from tests.train.conftest import REPO, read_losses, subprocess_env

WORKER = str(REPO / "tests/train/input_failure_worker.py")


def _launch(workdir, pattern, steps) -> list[tuple[int, str]]:
    return [(rc, out + err) for rc, out, err in launch_processes(
        WORKER, (workdir, pattern, steps), subprocess_env(devices=1), REPO)]


@pytest.mark.slow  # three launches of two processes: ~100 s on a quiet machine
def test_a_shard_failing_on_one_process_stops_both_and_resumes_exactly(tmp_path):
    (tmp_path / "data").mkdir()
    paths, _ = fixtures.write_files(tmp_path / "data", 2, 40, seq=LENGTH, preds=PREDICTIONS)
    pattern = str(tmp_path / "data" / "*.tfrecord")
    intact = open(paths[1], "rb").read()

    reference = tmp_path / "reference"
    assert [rc for rc, _ in _launch(reference, pattern, 12)] == [0, 0]

    offset, good = cut_last_record(paths[1])  # process 1 reads shard 1
    run = tmp_path / "run"
    start = time.monotonic()
    (rc0, out0), (rc1, out1) = _launch(run, pattern, 12)
    assert time.monotonic() - start < 200
    assert (rc0, rc1) == (3, 3), out0[-3000:] + out1[-3000:]
    # 40 records per process, windows of 16 records in batches of 4: two windows (8
    # steps) are good, the third meets the cut record.
    assert (f"error CorruptShardError: corrupt or truncated input shard {paths[1]}: truncated "
            f"record at byte {offset}") in out1, out1[-3000:]
    assert "Saved step 8, the last good one" in out1
    assert ("error InputFailedElsewhere: the input of process 1 failed (its log names the "
            "file and what to do); every process stopped at step 8. Saved step 8") in out0, \
        out0[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == ["8"]

    open(paths[1], "wb").write(intact)  # repaired: the same command goes on from step 8
    assert [rc for rc, _ in _launch(run, pattern, 12)] == [0, 0]
    want, got = read_losses(reference), read_losses(run)
    assert sorted(got) == list(range(1, 13))
    np.testing.assert_array_equal([got[s] for s in range(1, 13)],
                                  [want[s] for s in range(1, 13)])


@pytest.mark.slow  # one launch of two processes: ~25 s on a quiet machine
def test_a_file_failing_the_check_on_one_process_stops_both_before_compiling(tmp_path):
    (tmp_path / "good").mkdir()
    (tmp_path / "long").mkdir()
    fixtures.write_files(tmp_path / "good", 1, 40, seq=LENGTH, preds=PREDICTIONS)
    long, _ = fixtures.write_files(tmp_path / "long", 1, 40, seq=2 * LENGTH, preds=PREDICTIONS)
    pattern = f"{tmp_path / 'good' / '*.tfrecord'},{tmp_path / 'long' / '*.tfrecord'}"
    start = time.monotonic()
    (rc0, out0), (rc1, out1) = _launch(tmp_path / "run", pattern, 4)  # process 1: long
    assert time.monotonic() - start < 120
    assert (rc0, rc1) == (3, 3), out0[-3000:] + out1[-3000:]
    assert "error DataCheckError:" in out1 and long[0] in out1, out1[-3000:]
    assert ("error InputFailedElsewhere: the input check of process 1 failed (its log names "
            "the file and what to do)") in out0, out0[-3000:]
    assert "compiled the train step" not in out0 + out1
