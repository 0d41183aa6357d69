"""Subprocess body of the multi-process test: one of N processes joined by
jax.distributed on localhost (XLA_FLAGS gives each its CPU devices). Trains the tiny
config for 5 steps on a data-parallel mesh over all processes' devices, in a shared
workdir; process 0 writes metrics.jsonl."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(process_id: int, num_processes: int, address: str, workdir: str) -> None:
    from bert_jax.train import runtime

    runtime.initialize("auto", address, num_processes, process_id)
    import jax

    from bert_jax.tasks import pretraining
    from tests.train.common import memory_data, tiny_config

    assert jax.process_count() == num_processes and jax.device_count() == 2 * num_processes
    config = tiny_config(steps=5, mesh=dict(data=-1, fsdp=1, tensor=1), checkpoint=dict(every=5))
    config.train.tensorboard = False
    pretraining.run(config, workdir, make_train_data=memory_data, make_eval_data=lambda c, w: None)
    print(f"process {process_id} done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
