"""Subprocess body of the input-failure test: one of 2 processes joined by jax.distributed,
training the tiny config on TFRecords (process p reads shard p). Exits 0 when done, 3 after
printing `error <type>: <message>` when training raised a ReportedError."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(process_id: int, address: str, workdir: str, pattern: str, steps: int) -> int:
    from bert_jax.train import runtime

    runtime.initialize("auto", address, 2, process_id)
    from bert_jax.errors import ReportedError
    from bert_jax.tasks import pretraining
    from tests.data.test_corrupt_midrun import midrun_config

    config = midrun_config(pattern, steps)
    config.mesh.update(dict(data=-1, fsdp=1, tensor=1))
    config.train.log_every = 1
    try:
        pretraining.run(config, workdir, make_eval_data=lambda c, w: None)
    except ReportedError as e:
        print(f"error {type(e).__name__}: {e}", flush=True)
        return 3
    print(f"process {process_id} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
