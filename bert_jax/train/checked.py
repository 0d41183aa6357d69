"""A run config's checks, in one place, run once per run before anything is read or built:

    checked = check(config)        # a ConfigError naming the key, else the values below
    loop.train(config, workdir, task, checked=checked)

`check` refuses what fails without data or a model (the shared sections' keys, the
checkpoint interval and timeouts, the warm start's resize rules and init_state, the
micro-batches, the steps or epochs, a fine-tuning config's evaluation and init_state, the
optimizer, the warmup ratio, the mesh, and the batch sizes against the mesh's batch
shards). It hands back what
later stages take instead of reading and checking the raw config again: the mesh and its
rules, the batch's and the replicated sharding, the checkpoint interval, the micro-batches
and the resize rules.

A fine-tuning sweep (bert_jax.tasks.finetune) checks its config once and hands the same
`Checked` to each of its runs: a run changes schedule.lr and train.seed only, which no check
reads and nothing here derives from.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bert_jax import optim
from bert_jax import sharding as sharding_lib
from bert_jax.models.config import ConfigError
from bert_jax.train.config import check_sections, check_steps
from bert_jax.train.warm_start import Resize


@dataclasses.dataclass(frozen=True)
class Checked:
    """What a checked config gives the run.

    mesh: the `jax.sharding.Mesh` (data, fsdp, tensor) of config.mesh; rules: its logical
    axis rules; batch_sharding: a batch array's NamedSharding (dimension 0 over the mesh
    axes the rules give "batch"); replicated: a NamedSharding on every device (scalars, the
    RNG key); checkpoint_every: N > 0 saves every N steps and at the end, 0 at the end only;
    accum_steps: micro-batches per optimizer step (train.batch_size / accum_steps rows
    each; those rows and an eval batch's divide into the batch's shards); resize:
    train.init_extend_positions / init_extend_vocab's rules (no vocabulary: a pre-training
    task adds its own)."""

    mesh: Any
    rules: Any
    batch_sharding: Any
    replicated: Any
    checkpoint_every: int
    accum_steps: int
    resize: Resize


def check(config) -> Checked:
    """Every check of `config` that needs neither data nor a model: the run's own keys
    first, then what the optimizer refuses, then the devices (the mesh and the batch shards
    it gives); the first failure is a ConfigError naming the key."""
    every, resize, accum, eval_rows = _check_keys(config)
    optim.check_optimizer(config.optimizer)
    optim.warmup_steps(config.schedule, 1)  # a warmup_ratio out of [0, 1]
    mesh = sharding_lib.make_mesh(config.mesh)
    rules = sharding_lib.rules_from_config(config.mesh)
    batch_sharding = sharding_lib.batch_sharding(mesh, rules)
    shards = int(np.prod([mesh.shape[a] for a in sharding_lib.batch_mesh_axes(mesh, rules)]))
    sizes = {"batch_size": int(config.train.batch_size) // accum, "eval_batch_size": eval_rows}
    for key, size in sizes.items():
        if size % shards:
            what = (f"config.train.{key}={size}" if key == "eval_batch_size" or accum == 1
                    else f"the micro-batch size {size} (config.train.batch_size / "
                         f"accum_steps={accum})")
            raise ConfigError(f"{what} is not divisible by the {shards} batch shards of "
                              f"mesh {dict(mesh.shape)}")
    return Checked(mesh=mesh, rules=rules, batch_sharding=batch_sharding,
                   replicated=sharding_lib.replicated(mesh), checkpoint_every=every,
                   accum_steps=accum, resize=resize)


def _check_keys(config) -> tuple[int, Resize, int, int]:
    """The checks of the config's own keys: the sections' names, checkpoint.every, the
    timeouts, the warm start's rules, the batch's micro-batches, the steps (or epochs) and a
    fine-tuning config's evaluation. Returns (checkpoint_every, resize, accum_steps,
    eval_batch_size)."""
    check_sections(config)
    every = int(config.checkpoint.every)
    if every < 0:
        raise ConfigError(f"config.checkpoint.every={every}: expected N > 0 (save every N "
                          f"steps and at the end) or 0 (save at the end only)")
    for key in ("checkpoint.timeout", "train.heartbeat_timeout"):
        section, name = key.split(".")
        value = config[section].get(name, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"config.{key}={value!r}: expected a number of seconds > 0")
    resize = Resize.from_config(config.train)  # an unknown rule
    if config.train.init_state not in ("params", "full"):
        raise ConfigError(f"config.train.init_state={config.train.init_state!r}; expected "
                          f"'params' or 'full'")
    accum = int(config.train.accum_steps)
    batch_size = int(config.train.batch_size)
    if accum < 1:
        raise ConfigError(f"config.train.accum_steps={accum}: expected a positive number of "
                          f"micro-batches per step")
    if batch_size % accum:
        raise ConfigError(f"config.train.batch_size={batch_size} is not divisible by "
                          f"config.train.accum_steps={accum}")
    finetuning = "task" in config  # launch/train.py tells the two apart so
    if config.train.do_train:  # (predicting trains no step)
        check_steps(config, finite=finetuning)  # fine-tuning's epochs count its training set
    if finetuning:
        if int(config.train.eval_steps) >= 0:
            raise ConfigError(f"config.train.eval_steps={config.train.eval_steps}: "
                              f"fine-tuning scores every example of its eval sets; leave it "
                              f"at -1")
        if config.train.init_state != "params":
            raise ConfigError(f"config.train.init_state={config.train.init_state!r}: "
                              f"fine-tuning takes the encoder's params only ('params')")
    return every, resize, accum, int(config.train.eval_batch_size) or batch_size
