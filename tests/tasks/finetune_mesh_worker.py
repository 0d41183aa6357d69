"""Subprocess body of the fine-tuning mesh tests (XLA_FLAGS gives 8 CPU devices before jax
is imported): the tiny pair fine-tune (tests/tasks/finetune_common.py) on each mesh named
on the command line (data.fsdp.tensor, e.g. 2.2.2). Prints one line
RESULT {mesh: {"loss": [per step], "grad_norm": [per step], "dev": accuracy,
               "word_embeddings": sharding spec, "intermediate": shard shape}}."""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(workdir: str, meshes: list[str]) -> None:
    import jax

    from bert_jax.tasks import finetune
    from bert_jax.train import loop
    from tests.tasks.finetune_common import losses, tiny_pairs_config

    assert jax.device_count() == 8, jax.devices()
    out = {}
    for name in meshes:
        data, fsdp, tensor = map(int, name.split("."))
        config = tiny_pairs_config(mesh=dict(data=data, fsdp=fsdp, tensor=tensor))
        config.checkpoint.every = 1000  # one save (the end): orbax's first save on a mesh is slow
        seen = {}
        original = loop.build

        def spy(*args, **kwargs):
            programs = original(*args, **kwargs)
            params = programs.abstract.params["bert"]
            seen["word_embeddings"] = str(
                params["embeddings"]["word_embeddings"]["embedding"].sharding.spec)
            kernel = params["encoder"]["layer_0"]["intermediate"]["kernel"]
            seen["intermediate"] = list(kernel.sharding.shard_shape(kernel.shape))
            return programs

        loop.build = spy
        try:
            summary = finetune.run(config, os.path.join(workdir, name), progress=False)
        finally:
            loop.build = original
        run_dir = os.path.join(workdir, name, "run_0")
        loss, gnorm = losses(run_dir), losses(run_dir, "train/grad_norm")
        out[name] = dict(loss=[loss[s] for s in sorted(loss)],
                         grad_norm=[gnorm[s] for s in sorted(gnorm)],
                         dev=summary["dev/accuracy_mean"], **seen)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
