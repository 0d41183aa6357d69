"""`train.init_checkpoint`: start a run from weights trained elsewhere.

    source = check(config)      # opened and checked before any tensor is read or compiled
    state, rng = warm_start(config, state, rng, abstract, shardings, tx, rng_sharding, source)

Three sources (opened by bert_jax.tasks.init_checkpoint, the opener fine-tuning uses too):
  * a model directory (bert_jax.convert.model_dir: `bert_config.json` + `params/`), e.g. a
    converted Google BERT, or a Hugging Face directory (config.json + weights): their
    subtrees ("bert", "mlm", "nsp", ...) replace ours where both exist; heads they lack
    keep their fresh init;
  * another run's WORKDIR (or its `checkpoints/`, or `checkpoints/<step>` for a step other
    than the latest): with `train.init_state="params"` the params only (fresh optimizer,
    step 0); with "full" also the optimizer state, step and RNG, so the schedule
    continues: phase 2 of the paper (length 512) after phase 1.
Every source's architecture is compared with config.model first, from its config alone
(`check_architecture`: one line naming each differing key, before any tensor is read);
then every shape is checked; a mismatch names the parameter and both shapes.
"""

from __future__ import annotations

import jax
import numpy as np

from bert_jax import paths
from bert_jax.errors import UserError
from bert_jax.models.params import stack_layers
from bert_jax.train import checkpoint as ckpt_lib
from bert_jax.train import state as state_lib

ARCH_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "type_vocab_size", "max_position_embeddings")


class ArchitectureError(UserError, ValueError):
    """An init checkpoint whose model has another architecture than the run's."""


def check_architecture(theirs, ours, what: str) -> None:
    """BertConfigs `theirs` (a checkpoint's) and `ours` (config.model) agree on every key
    that shapes a tensor; else an ArchitectureError naming each differing key."""
    diff = {k: (getattr(theirs, k), getattr(ours, k)) for k in ARCH_KEYS
            if getattr(theirs, k) != getattr(ours, k)}
    if diff:
        raise ArchitectureError(
            f"{what}: architecture differs from config.model (checkpoint, config): {diff}; "
            f"start from a checkpoint of this architecture, or set config.model to the "
            f"checkpoint's")


def check(config):
    """Opens config.train.init_checkpoint (its config only) and checks init_state and the
    architecture. Returns the bert_jax.tasks.init_checkpoint.InitSource to warm start from."""
    from bert_jax.tasks.init_checkpoint import open_init_checkpoint

    path = paths.resolve(config.train.init_checkpoint)
    mode = config.train.get("init_state", "params")
    if mode not in ("params", "full"):
        raise ValueError(f"config.train.init_state={mode!r}; expected 'params' or 'full'")
    source = open_init_checkpoint(path)
    if mode == "full" and source.kind != "workdir":
        kind = "a model directory" if source.kind == "model_dir" else "a Hugging Face directory"
        raise ValueError(f"config.train.init_state='full' needs a training workdir, but "
                         f"{path} is {kind} (params only)")
    check_architecture(source.config, state_lib.model_config(config),
                       f"config.train.init_checkpoint={path}")
    return source


def warm_start(config, state, rng, abstract, shardings, tx, rng_sharding, source=None):
    """Returns (state, rng) started from config.train.init_checkpoint (`source`: what
    `check(config)` returned; opened and checked here if not given)."""
    source = check(config) if source is None else source
    if source.kind != "workdir":
        return _from_params(source, config, state, tx, shardings), rng
    ckpt = ckpt_lib.Checkpointer(ckpt_lib.locate(source.path)[0], every=1, read_only=True)
    try:
        if config.train.get("init_state", "params") == "full":
            new_state, new_rng, _ = ckpt.restore(abstract, step=source.step,
                                                 rng_sharding=rng_sharding)
            return new_state, new_rng
        params = ckpt.restore_params(abstract.params, step=source.step)
    finally:
        ckpt.close()
    return state_lib.state_with_params(state, params, tx, shardings), rng


def _from_params(source, config, state, tx, shardings):
    """A model / Hugging Face directory's subtrees in place of ours (numpy, read now)."""
    path, loaded = source.path, source.params
    ours = state_lib.model_config(config)
    if ours.scan_layers:
        loaded = stack_layers(loaded, ours.num_hidden_layers)
    current = jax.tree_util.tree_map(np.asarray, jax.device_get(state.params))
    merged = dict(current)
    taken = []
    for key in current:
        if key in loaded:
            _check_shapes(loaded[key], current[key], f"{path}:{key}")
            merged[key] = loaded[key]
            taken.append(key)
    if "bert" not in taken:
        raise ValueError(f"config.train.init_checkpoint={path}: no 'bert' encoder params "
                         f"(top-level keys: {sorted(loaded)})")
    if jax.process_index() == 0:
        fresh = sorted(set(current) - set(taken))
        print(f"warm start: {taken} from {path}" + (f"; fresh init: {fresh}" if fresh else ""),
              flush=True)
    return state_lib.state_with_params(state, merged, tx, shardings)


def _check_shapes(loaded, current, where: str) -> None:
    lf = dict(jax.tree_util.tree_flatten_with_path(loaded)[0])
    cf = dict(jax.tree_util.tree_flatten_with_path(current)[0])
    if set(lf) != set(cf):
        missing = sorted(jax.tree_util.keystr(k) for k in set(cf) - set(lf))
        extra = sorted(jax.tree_util.keystr(k) for k in set(lf) - set(cf))
        raise ValueError(f"{where}: parameter names differ; missing {missing[:5]}, "
                         f"unexpected {extra[:5]}")
    for k, v in cf.items():
        if np.shape(lf[k]) != np.shape(v):
            raise ValueError(f"{where}{jax.tree_util.keystr(k)}: checkpoint shape "
                             f"{np.shape(lf[k])}, model shape {np.shape(v)}")
