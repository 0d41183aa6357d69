"""Subprocess body of the slow fault tests: a tiny pre-training run in WORKDIR whose disk
"fills up" once the checkpoint of step 10 is complete (RLIMIT_FSIZE: any file write past
50 kB then fails with EFBIG, as a full disk fails with ENOSPC, inside tensorstore's own
writer threads). The save of step 20 fails in the background; the run must stop with one
CheckpointSaveError and nothing else on stderr but the interpreter's report of it."""

from __future__ import annotations

import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.train.common import MemorySource, tiny_config  # noqa: E402


class FullDiskAfter10(MemorySource):
    """The memory stream; from batch 11 on, 50 ms per batch (the save of step 10 finishes
    well before step 20 on a busy machine) and the file-size limit set as soon as
    checkpoints/10 is complete."""

    def __init__(self, batch_size: int, workdir: str):
        super().__init__(batch_size)
        self.done = os.path.join(workdir, "checkpoints", "10")
        self.limited = False

    def __next__(self):
        if self.index > 10:
            time.sleep(0.05)
            if not self.limited and os.path.isdir(self.done):
                resource.setrlimit(resource.RLIMIT_FSIZE,
                                   (50_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
                self.limited = True
        return super().__next__()


def main(workdir: str) -> None:
    from bert_jax.tasks import pretraining

    config = tiny_config(steps=40, checkpoint=dict(every=10, keep=5))
    config.train.tensorboard = False
    pretraining.run(config, workdir, make_train_data=lambda c, w: FullDiskAfter10(8, w),
               make_eval_data=lambda c, w: None)


if __name__ == "__main__":
    main(sys.argv[1])
