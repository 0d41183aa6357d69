"""Subprocess body of the multi-process fine-tuning test: one of N processes joined by
jax.distributed on localhost (XLA_FLAGS gives each 2 CPU devices). Runs the tiny pair
fine-tune (tests/tasks/finetune_common.py) on a (data=2, fsdp=-1) mesh over every process's
devices, in a shared workdir; process 0 writes the files."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(process_id: int, num_processes: int, address: str, workdir: str) -> None:
    from bert_jax.train import runtime

    runtime.initialize("auto", address, num_processes, process_id)
    import jax

    from bert_jax.tasks import finetune
    from tests.tasks.finetune_common import tiny_pairs_config

    assert jax.process_count() == num_processes and jax.device_count() == 2 * num_processes
    summary = finetune.run(tiny_pairs_config(mesh=dict(data=2, fsdp=-1, tensor=1)), workdir,
                           progress=False)
    print(f"process {process_id} done: dev/accuracy_mean={summary['dev/accuracy_mean']}",
          flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
