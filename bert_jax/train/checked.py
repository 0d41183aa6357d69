"""A run config's checks, in one place, run once per run before anything is read or built:

    checked = check(config)        # a ConfigError naming the key, else the values below
    loop.train(config, workdir, task, checked=checked)

`check` refuses what fails without data (the shared sections' keys, the checkpoint
interval and timeouts, the warm start's resize rules and init_state, the micro-batches, the
steps or epochs, a fine-tuning config's evaluation and init_state; a fine-tuning config's
model: its init checkpoint, opened from its small files, the model it gives with
config.model_overrides, the casing and the vocabulary; then the optimizer, the warmup ratio,
the mesh, and the batch sizes against the mesh's batch shards). It hands back what later
stages take instead of reading and checking the raw config again: the fine-tuning model and
its source, the mesh and its rules, the batch's and the replicated sharding, the checkpoint
interval, the micro-batches and the resize rules.

A fine-tuning sweep (bert_jax.tasks.finetune) checks its config once and hands the same
`Checked` to each of its runs: a run changes schedule.lr and train.seed only, which no check
reads and nothing here derives from.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import numpy as np

from bert_jax import optim
from bert_jax import sharding as sharding_lib
from bert_jax.convert.sources import InitSource, open_source
from bert_jax.models.config import BertConfig, ConfigError, from_config_dict
from bert_jax.train import settings
from bert_jax.train.config import check_sections, check_steps
from bert_jax.train.warm_start import Resize


class RunModel(NamedTuple):
    """A fine-tuning run's model: `config`, the BertConfig it trains (the checkpoint's, or
    config.model, plus config.model_overrides); `source`, train.init_checkpoint opened (None
    without one, or with train.random_init); `vocab`, the vocabulary it tokenizes with
    (tokenizer.vocab_file, else the checkpoint's)."""

    config: BertConfig
    source: Optional[InitSource]
    vocab: str


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
    task adds its own); model: a fine-tuning config's RunModel (None for pre-training, whose
    task reads config.model and opens its warm start unless the run resumes)."""

    mesh: Any
    rules: Any
    batch_sharding: Any
    replicated: Any
    checkpoint_every: int
    accum_steps: int
    resize: Resize
    model: Optional[RunModel] = None


def check(config) -> Checked:
    """Every check of `config` that needs no data: the run's own keys first, then a
    fine-tuning run's model (`run_model`), then what the optimizer refuses, then the devices
    (the mesh and the batch shards it gives); the first failure is an error naming the key
    (or the checkpoint's file)."""
    every, resize, accum, eval_rows = _check_keys(config)
    model = run_model(config) if "task" in config else None
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
                   accum_steps=accum, resize=resize, model=model)


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

def run_model(config) -> RunModel:
    """A fine-tuning config's model: train.init_checkpoint opened (its small files alone),
    its config plus config.model_overrides checked against the config (`check_model`), and
    the vocabulary; predicting (train.do_train=False) takes a fine-tuned checkpoint."""
    source = None
    if config.train.init_checkpoint:
        source = open_source(config.train.init_checkpoint)
        bert_config = source.config
    else:
        bert_config = from_config_dict(config.model)
    vocab = config.tokenizer.vocab_file or (source.vocab if source is not None else None)
    bert_config = bert_config.replace(**{k: v for k, v in config.model_overrides.to_dict().items()
                                         if v is not None})
    check_model(config, source, bert_config)
    if not config.train.do_train:
        require_task_checkpoint(source, f"task.kind={config.task.kind}",
                                bool(config.train.random_init))
    if not vocab and not config.train.init_checkpoint:
        raise ConfigError(
            "no train.init_checkpoint given: fine-tuning starts from a pretrained encoder; "
            "pass --config.train.init_checkpoint=<model dir | Hugging Face dir | pre-training "
            "WORKDIR> (python -m bert_jax.convert from-tf|from-hf|from-workdir makes a model "
            "dir), or --config.tokenizer.vocab_file=vocab.txt to train config.model from "
            "scratch")
    if not vocab:
        raise ConfigError(f"train.init_checkpoint={config.train.init_checkpoint} has no "
                          f"vocabulary (vocab.txt): set --config.tokenizer.vocab_file")
    if config.train.random_init:  # the control run: same architecture, no weights
        source = None
    return RunModel(bert_config, source, vocab)


def require_task_checkpoint(source: Optional[InitSource], task_name: str,
                            random_init: bool = False) -> None:
    """Predicting (train.do_train=False) takes a checkpoint that may hold a task head: not
    none, not a pre-training run."""
    if source is None or random_init:
        raise ConfigError(
            "train.do_train=False predicts with a fine-tuned model: set train.init_checkpoint "
            "to it (e.g. a fine-tuning run's best_model/)"
            + (", and drop train.random_init" if random_init else ""))
    if source.kind == "workdir":
        raise ConfigError(
            f"train.init_checkpoint={source.path} is a pre-training run: it has no {task_name} "
            f"head to predict with (train.do_train=False); fine-tune it first and pass that "
            f"run's best_model/")


def check_model(config, source: Optional[InitSource], used: BertConfig) -> None:
    """The run's model (`used`) is the checkpoint's config (or `config.model`) plus
    `config.model_overrides`: a ConfigError names a setting that would be dropped without a
    word (a changed `config.model` key the run does not use, or a layout override a
    pre-training workdir, restored as saved, cannot honour)."""
    where = (f"train.init_checkpoint={config.train.init_checkpoint}" if source is not None
             else "config.model")
    if source is not None:  # the casing its vocabulary was trained with (settings.py)
        settings.check({settings.CASING: source.do_lower_case},
                       {settings.CASING: bool(config.tokenizer.do_lower_case)}, where,
                       bool(config.train.get("accept_setting_changes", False)),
                       keys={settings.CASING: "tokenizer.do_lower_case"})
    if (source is not None and source.kind == "workdir"
            and used.scan_layers != source.config.scan_layers):
        raise ConfigError(
            f"{where}: config.model_overrides.scan_layers={used.scan_layers} but the workdir "
            f"was saved with scan_layers={source.config.scan_layers}, the layout it restores "
            f"into; leave model_overrides.scan_layers unset")
    defaults = BertConfig().to_dict()
    final = used.to_dict()
    ignored = sorted(k for k, v in config.model.to_dict().items()
                     if k in defaults and v != defaults[k] and v != final[k])
    if ignored:
        shown = ", ".join(f"config.model.{k}={config.model[k]!r} (the run uses {final[k]!r})"
                          for k in ignored)
        origin = ("the checkpoint's config plus config.model_overrides" if source is not None
                  else "config.model plus config.model_overrides, which wins")
        raise ConfigError(
            f"{where}: the model is {origin}, so {shown} would be ignored; set run-time "
            f"options such as dropout, dropout_rng, dtype or remat as "
            f"config.model_overrides.<key>"
            + (", or clear train.init_checkpoint to train this architecture from scratch"
               if source is not None else ""))
