"""Subprocess body of the process-count test (test_layout_processes.py): one of N
processes (N = 1: no jax.distributed) training the tiny config up to `steps` in a shared
workdir, data-parallel over every device, the in-memory batch source.

Before training, if the workdir has a checkpoint, it restores it explicitly onto this
run's mesh and compares step, params, optimizer state and RNG bit for bit with
WORKDIR/dump.npz (what the previous run, with another process count, left); then the loop
resumes by itself. After training, process 0 writes the final checkpoint's state to
WORKDIR/dump.npz. Prints one line `RESULT {json}`.

    python layout_worker.py PROCESS_ID NUM_PROCESSES ADDRESS|- WORKDIR STEPS
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _host_state(checkpointer, abstract, rep, data_iterator=None):
    """The checkpoint's (state, rng) on this mesh, gathered to host numpy leaves."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    state, rng, _ = checkpointer.restore(abstract, data_iterator, rng_sharding=rep)
    leaves = jax.tree_util.tree_leaves(state) + [jax.random.key_data(rng)]
    return [np.asarray(multihost_utils.process_allgather(x, tiled=True)) for x in leaves]


def main(process_id: int, num_processes: int, address: str, workdir: str, steps: int):
    if num_processes > 1:
        from bert_jax.train import runtime

        runtime.initialize("auto", address, num_processes, process_id)
    import jax
    import numpy as np

    from bert_jax import optim
    from bert_jax import sharding as sharding_lib
    from bert_jax.train import checkpoint as ckpt_lib
    from bert_jax.tasks import pretraining
    from bert_jax.tasks.pretraining import PretrainingTask
    from bert_jax.train import state as state_lib
    from bert_jax.train.config import total_steps
    from tests.train.common import memory_data, tiny_config

    assert jax.process_count() == num_processes
    config = tiny_config(steps=steps, mesh=dict(data=-1, fsdp=1, tensor=1),
                         checkpoint=dict(every=1000))
    config.train.tensorboard = False
    mesh = sharding_lib.make_mesh(config.mesh)
    rules = sharding_lib.rules_from_config(config.mesh)
    model = PretrainingTask(config, "").model
    tx = optim.make_optimizer(config.optimizer, config.schedule, total_steps(config))
    abstract, _ = state_lib.state_shardings(model, tx, mesh, rules,
                                                    state_lib.dummy_inputs(16, 4))
    rep = sharding_lib.replicated(mesh)
    dump = os.path.join(workdir, "dump.npz")
    result = {"devices": jax.device_count(), "processes": jax.process_count()}

    ckpt = ckpt_lib.Checkpointer(workdir, every=1)
    if ckpt.latest_step() is not None:
        source = memory_data(config, workdir)
        leaves = _host_state(ckpt, abstract, rep, source)
        with np.load(dump) as saved:
            before = [saved[f"leaf_{i}"] for i in range(len(saved.files))]
        result["restored"] = dict(
            step=int(leaves[0]), leaves=len(leaves),
            equal=len(leaves) == len(before) and all(
                a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(leaves, before)),
            exact=bool(ckpt.data_restore.exact), position=ckpt.data_restore.position,
            next_batch=source.index)
    ckpt.close()

    pretraining.run(config, workdir, make_train_data=memory_data, make_eval_data=lambda c, w: None)

    ckpt = ckpt_lib.Checkpointer(workdir, every=1)
    leaves = _host_state(ckpt, abstract, rep)
    ckpt.close()
    if jax.process_index() == 0:
        np.savez(dump + ".tmp.npz", **{f"leaf_{i}": x for i, x in enumerate(leaves)})
        os.replace(dump + ".tmp.npz", dump)
    result["final_step"] = int(leaves[0])
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
