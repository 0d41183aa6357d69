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

Pre-training configs add `model` and `data`; fine-tuning configs `task`, `tokenizer`,
`model_overrides` and `sweep` (bert_jax.tasks.registry). `load_config("configs/bert_tiny.py",
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
from bert_jax.models.config import ConfigError, model_config
from bert_jax.sharding import DEFAULT_RULES
from bert_jax.data.pretrain import data_config


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


def checkpoint_every(config) -> int:
    """config.checkpoint.every as the loop reads it: N > 0 saves every N steps, 0 saves at
    the end only (a SIGTERM saves in either case); a negative value is a ConfigError (a run
    that never saves could not resume)."""
    every = int(config.checkpoint.every)
    if every < 0:
        raise ConfigError(f"config.checkpoint.every={every}: expected N > 0 (save every N "
                          f"steps and at the end) or 0 (save at the end only)")
    return every


def add_training_sections(config: ml_collections.ConfigDict, *, optimizer=None, schedule=None,
                          train=None, mesh=None, checkpoint=None) -> ml_collections.ConfigDict:
    """Adds the five shared sections (each from the dict of overrides given) to `config`."""
    config.optimizer = optimizer_config(**(optimizer or {}))
    config.schedule = schedule_config(**(schedule or {}))
    config.train = train_config(**(train or {}))
    config.mesh = mesh_config(**(mesh or {}))
    config.checkpoint = checkpoint_config(**(checkpoint or {}))
    return config


def run_steps(config, train_examples: Optional[int] = None) -> int:
    """The optimizer steps of a run: train.steps if > 0, else train.epochs passes over
    `train_examples` (a finite training set: fine-tuning) of train.batch_size each."""
    steps = int(config.train.steps)
    if steps > 0:
        return steps
    epochs = float(config.train.get("epochs", 0.0))
    if epochs <= 0 or train_examples is None:
        raise ConfigError(
            f"config.train.steps={steps} and train.epochs={epochs}: set train.steps > 0"
            + ("" if train_examples is None else " or train.epochs > 0")
            + ("" if train_examples is not None else
               " (pre-training reads an endless stream: epochs do not apply)"))
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


# The paper's pre-training schedule: 1M steps, 90% at length 128, the last 10% at 512.
PAPER_TOTAL_STEPS = 1_000_000
PAPER_PHASE1_STEPS = 900_000


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


def paper_pretraining_config(name: str, arg, model: ml_collections.ConfigDict,
                             mesh: dict) -> ml_collections.ConfigDict:
    """A full run config with the paper's recipe for `model` (batch 256, Adam lr 1e-4,
    10k warmup, linear decay over 1M steps). `arg` picks the phase: None / "phase1" = the
    first 900k steps at length 128 (20 MLM slots); "phase2" = the last 100k at length 512
    (80 slots), continuing phase 1's optimizer state, step and schedule."""
    if arg not in (None, "", "phase1", "phase2"):
        raise ValueError(f"configs/{name}.py: unknown argument {arg!r}; use phase1 or phase2")
    phase2 = arg == "phase2"
    config = ml_collections.ConfigDict()
    config.model = model
    config.model.nsp = True
    config.data = data_config(
        max_seq_length=512 if phase2 else 128, max_predictions_per_seq=80 if phase2 else 20)
    return add_training_sections(
        config,
        schedule=dict(lr=1e-4, warmup_steps=10_000, decay="linear",
                      total_steps=PAPER_TOTAL_STEPS),
        train=dict(batch_size=256,
                   steps=PAPER_TOTAL_STEPS if phase2 else PAPER_PHASE1_STEPS, log_every=100,
                   eval_every=10_000, eval_steps=100,
                   init_state="full" if phase2 else "params"),
        mesh=mesh,
        checkpoint=dict(every=5_000, keep=3, keep_period=100_000))


MODERNBERT_ARGS = (None, "", "long", "tiny")
# ModernBERT's context extension (Warner et al., 2024, section 2.2.3): 300B tokens at length
# 8,192 (250B at a constant 3e-4, then 50B decaying), the global layers' RoPE base raised
# from 10,000 to 160,000.
MODERNBERT_LONG_TOKENS = 300e9
MODERNBERT_LONG_LR = 3e-4


def modernbert_pretraining_config(name: str, arg, model: ml_collections.ConfigDict,
                                  batch_size: int, steps: int,
                                  lr: float = 8e-4) -> ml_collections.ConfigDict:
    """A ModernBERT-style pre-training run for `model`: masked LM only (no NSP), 30% of the
    tokens masked on the fly (dynamic masking), AdamW at ModernBERT's betas. `arg`:

    None: phase 1, `steps` at length 1,024, batch `batch_size`, peak rate `lr`, RoPE base
    10,000 on every layer (ModernBERT's first phase).
    "long": its context extension at length 8,192, continuing phase 1 (point
    train.init_checkpoint at phase 1's workdir): the global layers' RoPE base 160,000, a
    batch of batch_size / 8 rows (the same tokens per step), 300B tokens, 3e-4. It takes
    phase 1's params only (train.init_state="params": a fresh optimizer and step count),
    as its rate, batch and length are its own. Rotary models have no position table, so
    the two phases' tensors are the same; no train.init_extend_positions.
    "tiny": `model` cut to 4 layers of width 128 at length 128, trained like
    configs/bert_tiny.py on the sample corpus in minutes on a CPU.

    The optimizer is AdamW with a warmup and a linear decay, not ModernBERT's StableAdamW
    and warmup-stable-decay schedule; the warmups are ours."""
    if arg not in MODERNBERT_ARGS:
        raise ValueError(f"configs/{name}.py: unknown argument {arg!r}; use long or tiny")
    config = ml_collections.ConfigDict()
    config.model = model
    config.model.nsp = False
    if arg == "tiny":
        # Layer 0 and 3 global, 1 and 2 local with a window (16 each side) shorter than
        # the rows, so both kinds of layer are exercised.
        config.model.update(vocab_size=30522, hidden_size=128, num_hidden_layers=4,
                            num_attention_heads=2, intermediate_size=192,
                            max_position_embeddings=512, local_attention=32)
        config.data = data_config(max_seq_length=128, max_predictions_per_seq=40,
                                  dynamic_masking=True, masked_lm_prob=0.3,
                                  shuffle_buffer=2000, num_parallel_reads=4)
        return add_training_sections(
            config, optimizer=dict(b2=0.98),
            schedule=dict(lr=1.5e-3, warmup_steps=100, decay="linear"),
            train=dict(batch_size=8, eval_batch_size=64, steps=2400, log_every=50,
                       eval_every=0, eval_steps=-1, deterministic=True),
            checkpoint=dict(every=800, keep=2))
    long = arg == "long"
    length = 8192 if long else 1024
    if long:
        batch_size = max(1, batch_size // 8)
        steps = int(round(MODERNBERT_LONG_TOKENS / (batch_size * length), -3))
        lr = MODERNBERT_LONG_LR
    else:
        config.model.rope_theta = 10_000.0   # phase 1's base; "long" raises it to 160,000
    config.data = data_config(max_seq_length=length,
                              max_predictions_per_seq=int(math.ceil(0.3 * length)),
                              dynamic_masking=True, masked_lm_prob=0.3)
    return add_training_sections(
        config, optimizer=dict(b1=0.9, b2=0.98, eps=1e-6, weight_decay=1e-5),
        schedule=dict(lr=lr, warmup_steps=1_000 if long else 3_000, decay="linear"),
        train=dict(batch_size=batch_size, steps=steps, log_every=100, eval_every=10_000,
                   eval_steps=100, init_state="params"),
        mesh=dict(data=-1, fsdp=1, tensor=1),
        checkpoint=dict(every=5_000, keep=3, keep_period=100_000))


def modernbert_model(**shapes) -> ml_collections.ConfigDict:
    """The `model` section of a ModernBERT-style encoder of the given shapes: rotary
    positions (base 160,000 on global layers, 10,000 on local ones), GeGLU, no biases,
    pre-LN without layer 0's attention LayerNorm, a final LayerNorm, no token types, no
    pooler, a global layer every third with a 128-token window on the others, no dropout,
    LayerNorm epsilon 1e-5, ModernBERT's init (scaled output projections)."""
    return model_config(**dict(
        dict(vocab_size=50368, max_position_embeddings=8192, type_vocab_size=0,
             hidden_act="gelu", ffn_type="geglu", position_embedding="rotary",
             rope_theta=160_000.0, local_rope_theta=10_000.0, use_bias=False,
             norm_bias=False, pre_ln=True, layer0_attention_norm=False, pooler=False,
             global_attn_every_n_layers=3, local_attention=128, layer_norm_eps=1e-5,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
             init_scheme="modernbert"), **shapes))
