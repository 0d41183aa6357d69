"""The sections of a run config (pre-training and every fine-tuning task share them), with
the paper's defaults, the keys that moved, and loading a config from Python.

    config.train       batch_size, eval_batch_size, steps or epochs, seed, accum_steps,
                       log_every, eval_every, eval_steps, init_checkpoint, init_state,
                       init_extend_positions, init_extend_vocab, accept_setting_changes,
                       random_init, do_train, skip_nonfinite, deterministic, tensorboard,
                       profile_steps, profile_start, heartbeat_timeout
    config.schedule    lr, warmup_steps (< 0: warmup_ratio of the steps), warmup_ratio, decay,
                       power, end_lr, total_steps (-1: the run's steps), decay_from
    config.optimizer   name (adamw | lamb), b1, b2, eps, weight_decay, clip_norm, layer_decay,
                       bias_correction
    config.mesh        data, fsdp, tensor (one may be -1: the rest of the devices), rules
    config.checkpoint  every (0: at the end only), keep, keep_period, async_save, timeout
    config.sweep       fine-tuning: lrs, restarts, save_best_model, delete_finished

Pre-training configs add `model` and `data` (their recipes:
bert_jax.tasks.pretraining.recipes); fine-tuning configs `task`, `tokenizer`,
`model_overrides` and `sweep` (bert_jax.tasks.registry). This module holds the sections,
loading and checking, no recipe. `load_config("configs/bert_tiny.py",
{"train.steps": 100})` does from Python what launch/train.py does: get_config(arg), locked,
with dotted overrides; an unknown key is an error, a moved one names its new place.
"""

from __future__ import annotations

import difflib
import glob
import importlib.util
import math
import os
from typing import Any, Mapping, Optional, Sequence

import ml_collections

from bert_jax.errors import UserError
from bert_jax.models.config import ConfigError
from bert_jax.sharding import DEFAULT_RULES


def optimizer_config(**overrides) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(dict(
        name="adamw", b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, clip_norm=1.0,
        layer_decay=1.0,
        # False: Adam without bias correction, google-research/bert's optimizer.
        bias_correction=True))
    c.update(overrides)
    return c


def schedule_config(**overrides) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(dict(
        lr=1e-4, warmup_steps=10_000, warmup_ratio=0.0, decay="linear", power=1.0,
        end_lr=0.0, total_steps=-1,
        # "peak": decay over the steps after warmup (Hugging Face); "start": over all steps
        # from step 0, the warmup replacing it while it lasts (google-research/bert).
        decay_from="peak"))
    c.update(overrides)
    return c


def train_config(**overrides) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(dict(
        batch_size=256,          # GLOBAL examples per optimizer step (every process's share)
        eval_batch_size=0,       # GLOBAL; 0: batch_size
        steps=1_000_000,         # > 0: optimizer steps; <= 0: from epochs
        epochs=0.0,              # passes over a finite training set (fine-tuning)
        seed=0,
        # Micro-batches per optimizer step: batch_size is the large batch, each micro-batch
        # is batch_size / accum_steps (scanned inside one jitted step).
        accum_steps=1,
        log_every=100,
        eval_every=10_000,       # > 0: every N steps and at the end; 0: at the end; < 0: never
        eval_steps=-1,           # eval batches per evaluation; -1: the whole eval set
        # Warm start: a model directory (bert_jax.convert), a Hugging Face directory, or
        # another run's workdir. Fine-tuning: the pretrained encoder.
        init_checkpoint="",
        # What to take from a workdir init_checkpoint: "params", or "full" = params,
        # optimizer state, step and RNG (phase 2 continuing phase 1's schedule).
        init_state="params",
        # Shape changes a warm start takes on purpose ("": refused): a longer
        # model.max_position_embeddings ("repeat": new rows repeat the learned table) and a
        # larger vocabulary extending the checkpoint's ("mean": a new entry's row is the
        # mean of its pieces' rows under the old vocabulary). bert_jax/train/warm_start.py.
        init_extend_positions="",
        init_extend_vocab="",
        # A warm start or resume whose model settings that shape no tensor (hidden_act,
        # layer_norm_eps, pre_ln, rotary bases, local attention, the tokenizer's casing)
        # differ from the checkpoint's stops before the first step, naming each; True
        # trains with the config's (bert_jax/train/settings.py).
        accept_setting_changes=False,
        random_init=False,       # fine-tuning control run: the architecture, fresh weights
        do_train=True,           # fine-tuning: False evaluates / predicts init_checkpoint
        skip_nonfinite=False,    # False: stop naming the step; True: skip that update
        deterministic=False,     # True: no dropout (tests, debugging)
        tensorboard=True,        # event files under WORKDIR/tensorboard (metrics.jsonl always)
        # jax.profiler trace of `profile_steps` steps (0: none), starting `profile_start`
        # steps after this (re)start, on process 0, into WORKDIR/profile: TensorBoard's
        # profile tab or xprof.
        profile_steps=0,
        profile_start=5,
        # Several processes: one silent this long (seconds; its process or host died) stops
        # every other one, each in one line (bert_jax/train/coordination.py).
        heartbeat_timeout=60,
    ))
    c.update(overrides)
    return c


def sweep_config(**overrides) -> ml_collections.ConfigDict:
    """Fine-tuning's restarts x learning rates (bert_jax.tasks.finetune): the paper's
    several random restarts on small sets, best on dev."""
    c = ml_collections.ConfigDict(dict(
        lrs=(),                  # learning rates to try, e.g. (5e-5, 3e-5, 2e-5); (): schedule.lr
        restarts=1,              # seeds train.seed .. train.seed + restarts - 1 per rate
        save_best_model=True,    # WORKDIR/best_model: the best run as a model directory
        delete_finished=True,    # drop run_<i>/checkpoints once its results are recorded
    ))
    c.update(overrides)
    return c


def mesh_config(**overrides) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(dict(
        data=-1, fsdp=1, tensor=1,
        rules=[list(r) if isinstance(r[1], tuple) else list(r) for r in DEFAULT_RULES]))
    c.update(overrides)
    return c


def checkpoint_config(**overrides) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(dict(
        every=1000,      # > 0: every N steps and at the end; 0: at the end only (as eval_every)
        keep=3, keep_period=0, async_save=True,
        timeout=300))    # seconds a save may take, its wait for every process included
    c.update(overrides)
    return c


def add_training_sections(config: ml_collections.ConfigDict, *, optimizer=None, schedule=None,
                          train=None, mesh=None, checkpoint=None) -> ml_collections.ConfigDict:
    """Adds the five shared sections (each from the dict of overrides given) to `config`."""
    config.optimizer = optimizer_config(**(optimizer or {}))
    config.schedule = schedule_config(**(schedule or {}))
    config.train = train_config(**(train or {}))
    config.mesh = mesh_config(**(mesh or {}))
    config.checkpoint = checkpoint_config(**(checkpoint or {}))
    return config


def check_steps(config, finite: bool) -> None:
    """train.steps > 0, or train.epochs > 0 over a `finite` training set (fine-tuning); a
    ConfigError otherwise (pre-training reads an endless stream: epochs do not apply)."""
    steps = int(config.train.steps)
    epochs = float(config.train.get("epochs", 0.0))
    if steps <= 0 and (epochs <= 0 or not finite):
        raise ConfigError(
            f"config.train.steps={steps} and train.epochs={epochs}: set train.steps > 0"
            + (" or train.epochs > 0" if finite else
               " (pre-training reads an endless stream: epochs do not apply)"))


def run_steps(config, train_examples: Optional[int] = None) -> int:
    """The optimizer steps of a run: train.steps if > 0, else train.epochs passes over
    `train_examples` (a finite training set: fine-tuning) of train.batch_size each."""
    check_steps(config, finite=train_examples is not None)
    steps = int(config.train.steps)
    if steps > 0:
        return steps
    epochs = float(config.train.get("epochs", 0.0))
    return max(1, int(math.ceil(train_examples * epochs / int(config.train.batch_size))))


def total_steps(config, steps: Optional[int] = None) -> int:
    """The steps the learning-rate schedule spans: schedule.total_steps if > 0 (two phases
    under one schedule), else the run's steps (`steps`, default train.steps)."""
    t = int(config.schedule.get("total_steps", -1))
    if t > 0:
        return t
    return int(config.train.steps) if steps is None else int(steps)


# Keys that moved: their old place -> the new one (an old config names the move in one line).
RENAMED = {
    "data.batch_size": "train.batch_size",
    "data.eval_batch_size": "train.eval_batch_size",
    "train.max_steps": "train.steps",
    "train.num_epochs": "train.epochs",
    "train.num_restarts": "sweep.restarts",
    "train.save_best_model": "sweep.save_best_model",
    "schedule.lr_grid": "sweep.lrs",
    "checkpoint.delete_finished": "sweep.delete_finished",
}

# The shared sections and their keys: a config file that sets another key in one of them
# (an unlocked ConfigDict takes anything) fails here instead of running without it.
SECTIONS = {"train": train_config, "schedule": schedule_config,
            "optimizer": optimizer_config, "mesh": mesh_config,
            "checkpoint": checkpoint_config, "sweep": sweep_config}


def check_sections(config: ml_collections.ConfigDict, spec: str = "the config") -> None:
    """Every key of the shared sections is one the code reads: a ConfigError names a key
    that moved (with its new place) or an unknown one (with the closest existing key)."""
    for section, make in SECTIONS.items():
        if section in config:
            known = make()
            for key in config[section].keys():
                if key not in known:
                    _unknown(f"{section}.{key}", spec,
                             [f"{section}.{k}" for k in known.keys()] + config_keys(config))
    for key in ("batch_size", "eval_batch_size"):
        if key in config.get("data", {}):
            _unknown(f"data.{key}", spec, [])


class ConfigFileError(UserError, FileNotFoundError):
    """`--config=FILE` (or load_config's spec) names no file."""


def config_path(spec: str, repo_fallback: bool) -> str:
    """The file of "configs/<name>.py[:arg]" (relative to the working directory, or with
    `repo_fallback` to this repository); ConfigFileError listing the configs if none."""
    path = spec.partition(":")[0]
    if os.path.isfile(path):
        return path
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if repo_fallback and os.path.isfile(os.path.join(repo, path)):
        return os.path.join(repo, path)
    known = sorted(glob.glob(os.path.join(repo, "configs", "*.py")))
    raise ConfigFileError(
        f"config file {path} not found (in {os.getcwd()}"
        + (f" nor under {repo}" if repo_fallback else "") + "); the configs are "
        + ", ".join(os.path.relpath(k, repo) for k in known))


def config_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    """Every dotted key of `config`, sections and leaves ("train", "train.steps", ...)."""
    keys = []
    for name, value in config.items():
        keys.append(prefix + name)
        if isinstance(value, ml_collections.ConfigDict):
            keys += config_keys(value, f"{prefix}{name}.")
    return keys


def check_key(config: ml_collections.ConfigDict, key: str, spec: str) -> None:
    """ConfigError naming `key` unless `config` has it: a key that moved names its new
    place (RENAMED), another the closest existing key."""
    node = config
    for part in key.split("."):
        if "[" in part:  # an indexed field (ml_collections parses those itself)
            return
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            break
        node = node[part]
    else:
        return
    _unknown(key, spec, config_keys(config), sections=sorted(config.keys()))


def _unknown(key: str, spec: str, keys: list[str], sections=()) -> None:
    if key in RENAMED:
        raise ConfigError(f"{spec}: config.{key} is now config.{RENAMED[key]}")
    keys = [k for k in keys if k != key]
    # The same name in another section first (optimizer.lr -> schedule.lr), then spelling.
    same_name = [k for k in keys if k.rsplit(".", 1)[-1] == key.rsplit(".", 1)[-1]]
    close = (difflib.get_close_matches(key, same_name, n=1, cutoff=0.0) if same_name
             else difflib.get_close_matches(key, keys, n=1, cutoff=0.6))
    hint = (f"did you mean {close[0]!r}?" if close else
            f"the sections are {', '.join(sections)}" if sections else "not a config key")
    raise ConfigError(f"{spec}: unknown config key {key!r} ({hint})")


def load_config(spec: str, overrides: Optional[Mapping[str, Any]] = None
                ) -> ml_collections.ConfigDict:
    """`spec` = "configs/<name>.py[:arg]" (relative to the working directory, else to this
    repository) -> its get_config(arg), locked as launch/train.py locks it, with `overrides`
    ({"train.steps": 100, ...}) applied. An unknown key is a ConfigError naming the file,
    the key and the closest existing key, as `--config.<key>` is on the command line."""
    path = config_path(spec, repo_fallback=True)
    arg = spec.partition(":")[2]
    module_spec = importlib.util.spec_from_file_location(
        "bert_jax_config_" + os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    check_sections(config, spec)
    config.lock()
    for key, value in (overrides or {}).items():
        check_key(config, key, spec)
        config.update_from_flattened_dict({key: value})
    return config


def check_config_flag(argv: Sequence[str], name: str = "config") -> None:
    """What launch/train.py's `--config=FILE[:arg] --config.a.b=v` flags get wrong, as one
    ConfigError (bert_jax.cli runs this when flag parsing fails): the file missing, or an
    override key that the config does not have (with the closest one)."""
    spec, keys = None, []
    for arg in argv[1:]:
        if arg == "--":
            break
        if arg.startswith(f"--{name}="):
            spec = arg.split("=", 1)[1]
        elif arg.startswith(f"--{name}."):
            keys.append(arg[len(name) + 3:].split("=", 1)[0])
    if spec is None:
        return
    config_path(spec, repo_fallback=False)  # ml_collections looks in the working directory
    if not keys:
        return
    config = load_config(spec)
    for key in keys:
        check_key(config, key, spec)
