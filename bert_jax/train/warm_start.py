"""`train.init_checkpoint`: start a run from weights trained elsewhere.

Two sources:
  * a model directory (bert_jax.convert.model_dir: `bert_config.json` + `params/`), e.g. a
    converted Google or Hugging Face BERT: its subtrees ("bert", "mlm", "nsp", ...) replace
    ours where both exist; heads it lacks keep their fresh init;
  * another run's WORKDIR (or its `checkpoints/`, or `checkpoints/<step>` for a step other
    than the latest): with `train.init_state="params"` the params only (fresh optimizer,
    step 0); with "full" also the optimizer state, step and RNG, so the schedule
    continues: phase 2 of the paper (length 512) after phase 1.
Every shape is checked first; a mismatch names the parameter and both shapes.
"""

from __future__ import annotations

import jax
import numpy as np

from bert_jax import paths
from bert_jax.convert import model_dir
from bert_jax.models.params import stack_layers
from bert_jax.train import checkpoint as ckpt_lib
from bert_jax.train import state as state_lib

ARCH_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "type_vocab_size", "max_position_embeddings")


def warm_start(config, state, rng, abstract, shardings, tx, rng_sharding):
    """Returns (state, rng) started from config.train.init_checkpoint."""
    path = paths.resolve(config.train.init_checkpoint)
    mode = config.train.get("init_state", "params")
    if mode not in ("params", "full"):
        raise ValueError(f"config.train.init_state={mode!r}; expected 'params' or 'full'")
    if model_dir.is_model_dir(path):
        if mode == "full":
            raise ValueError(f"config.train.init_state='full' needs a training workdir, but "
                             f"{path} is a model directory (params only)")
        return _from_model_dir(path, config, state, tx, shardings), rng
    found = ckpt_lib.locate(path)
    if found is None:
        raise FileNotFoundError(
            f"config.train.init_checkpoint={path}: neither a model directory "
            f"({model_dir.CONFIG_NAME} + {model_dir.PARAMS_NAME}/) nor a training workdir "
            f"(WORKDIR, WORKDIR/checkpoints or WORKDIR/checkpoints/<step>)")
    run, step = found
    ckpt = ckpt_lib.Checkpointer(run, every=1)
    try:
        step = ckpt_lib.pick_step(ckpt.directory, ckpt.all_steps(), step,
                                  f"config.train.init_checkpoint={path}")
        if mode == "full":
            new_state, new_rng, _ = ckpt.restore(abstract, step=step, rng_sharding=rng_sharding)
            return new_state, new_rng
        params = ckpt.restore_params(abstract.params, step=step)
    finally:
        ckpt.close()
    return state_lib.state_with_params(state, params, tx, shardings), rng


def _from_model_dir(path: str, config, state, tx, shardings):
    loaded, loaded_cfg = model_dir.load_model_dir(path)
    ours = state_lib.model_config(config)
    diff = {k: (getattr(loaded_cfg, k), getattr(ours, k)) for k in ARCH_KEYS
            if getattr(loaded_cfg, k) != getattr(ours, k)}
    if diff:
        raise ValueError(
            f"config.train.init_checkpoint={path}: architecture differs from config.model "
            f"(checkpoint, config): {diff}")
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
