"""Subprocess body of the multi-process fine-tuning test: one of N processes joined by
jax.distributed on localhost (XLA_FLAGS gives each 2 CPU devices). Runs the tiny pair
fine-tune (tests/tasks/finetune_common.py) on a (data=2, fsdp=-1) mesh over every process's
devices, in a shared workdir; process 0 writes the files. With FAIL_AT, process 1's
training input raises a DataError when asked for batch FAIL_AT (0-based); a ReportedError
ends the worker with `error <type>: <message>` and exit code 3."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(process_id: int, num_processes: int, address: str, workdir: str,
         fail_at: int | None = None) -> int:
    from bert_jax.train import runtime

    runtime.initialize("auto", address, num_processes, process_id)
    import jax

    from bert_jax.errors import ReportedError
    from bert_jax.tasks import finetune
    from bert_jax.tasks.inputs import FeatureBatches
    from bert_jax.tasks.readers import DataError
    from tests.tasks.finetune_common import tiny_pairs_config

    assert jax.process_count() == num_processes and jax.device_count() == 2 * num_processes
    if fail_at is not None and process_id == 1:
        next_batch = FeatureBatches.__next__

        def failing(self):
            if self.step == fail_at:
                raise DataError(f"batch {fail_at} of process 1 is unreadable")
            return next_batch(self)
        FeatureBatches.__next__ = failing
    config = tiny_pairs_config(steps=4 if fail_at is None else 6,
                               mesh=dict(data=2, fsdp=-1, tensor=1))
    try:
        summary = finetune.run(config, workdir, progress=False)
    except ReportedError as e:
        print(f"error {type(e).__name__}: {e}", flush=True)
        return 3
    print(f"process {process_id} done: dev/accuracy_mean={summary['dev/accuracy_mean']}",
          flush=True)
    return 0


if __name__ == "__main__":
    # worker.py PROCESS_ID ADDRESS NUM_PROCESSES WORKDIR [FAIL_AT]
    sys.exit(main(int(sys.argv[1]), int(sys.argv[3]), sys.argv[2], sys.argv[4],
                  int(sys.argv[5]) if len(sys.argv) > 5 else None))
