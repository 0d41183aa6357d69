"""Subprocess body of the multi-device tests (XLA_FLAGS must give 8 CPU devices before
jax is imported). Trains the tiny config on several meshes, saves a checkpoint on
(data=8) and restores it onto (data=2, fsdp=4) and onto one device. Prints one JSON line:
{"losses": {mesh: [5 losses]}, "restore": {...}}."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(workdir: str) -> None:
    import jax
    import ml_collections
    import numpy as np

    from bert_jax import optim
    from bert_jax import sharding as sharding_lib
    from bert_jax.train import checkpoint as ckpt_lib
    from bert_jax.tasks import pretraining
    from bert_jax.tasks.pretraining import PretrainingTask
    from bert_jax.train import state as state_lib
    from bert_jax.train.config import total_steps
    from tests.train.common import memory_data, tiny_config

    assert jax.device_count() == 8, jax.devices()
    meshes = {"data8": dict(data=8, fsdp=1, tensor=1), "data2_fsdp4": dict(data=2, fsdp=4, tensor=1),
              "data2_tensor4": dict(data=2, fsdp=1, tensor=4)}
    out = {"losses": {}, "restore": {}}
    for name, mesh in meshes.items():
        config = tiny_config(steps=5, mesh=mesh, checkpoint=dict(every=5))
        config.train.tensorboard = False
        pretraining.run(config, os.path.join(workdir, name), make_train_data=memory_data,
                   make_eval_data=lambda c, w: None)
        with open(os.path.join(workdir, name, "metrics.jsonl")) as f:
            out["losses"][name] = [json.loads(line)["train/loss"] for line in f]

    # The data=8 checkpoint of step 5, restored onto other meshes.
    config = tiny_config(steps=5)
    saved = ckpt_lib.Checkpointer(os.path.join(workdir, "data8"), every=1)
    model = PretrainingTask(config, "").model
    tx = optim.make_optimizer(config.optimizer, config.schedule, total_steps(config))
    reference = None
    targets = {"data2_fsdp4": (dict(data=2, fsdp=4, tensor=1), jax.devices()),
               "one_device": (dict(data=1, fsdp=1, tensor=1), jax.devices()[:1]),
               "data8": (dict(data=8, fsdp=1, tensor=1), jax.devices())}
    for name, (mesh_cfg, devices) in targets.items():
        mesh = sharding_lib.make_mesh(ml_collections.ConfigDict(mesh_cfg), devices)
        rules = sharding_lib.rules_from_config(None)
        abstract, shardings = state_lib.state_shardings(model, tx, mesh, rules,
                                                    state_lib.dummy_inputs(16, 4))
        state, rng, _ = saved.restore(abstract, rng_sharding=sharding_lib.replicated(mesh))
        host = jax.tree_util.tree_map(np.asarray, jax.device_get(state))
        if reference is None:
            reference = host
        same = all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(host),
                                                        jax.tree_util.tree_leaves(reference)))
        placed = all(x.sharding == s for x, s in zip(jax.tree_util.tree_leaves(state),
                                                     jax.tree_util.tree_leaves(shardings)))
        kernel = state.params["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]
        out["restore"][name] = dict(
            step=int(host.step), equal_to_first=bool(same), on_target_shardings=bool(placed),
            kernel_devices=len(kernel.sharding.device_set),
            kernel_shard_shape=list(kernel.addressable_shards[0].data.shape),
            rng=np.asarray(jax.random.key_data(rng)).tolist())
    saved.close()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
