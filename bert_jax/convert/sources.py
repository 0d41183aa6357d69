"""Checkpoints opened without reading a tensor: where a run's weights come from
(`train.init_checkpoint`, the conversion commands' and feature extraction's --checkpoint),
and a training run's own saved steps.

    source = open_source(path)      # config, vocab, parameter shapes; params read on use

`path`: one of our model directories (bert_config.json + params/: `python -m
bert_jax.convert` output, a fine-tuning run's best_model/), a Hugging Face directory
(config.json + weights), or one of our training runs (WORKDIR, WORKDIR/checkpoints, or
WORKDIR/checkpoints/<step> for another step than the latest; a warm start restores its
params with orbax onto the mesh). A run's WORKDIR/checkpoints/<step> holds state/ (params,
opt_state, step, rng), data/ (each process's input position) and config/ (JSON).
Google TF checkpoints: convert first (`python -m bert_jax.convert from-tf`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bert_jax import paths
from bert_jax.convert import model_dir
from bert_jax.convert.hf_files import open_hf_dir
from bert_jax.data.checkpointing import InputStateHandler
from bert_jax.models.config import BertConfig, from_config_dict
from bert_jax.models.params import flat_shapes, stack_layers, unstack_layers


@dataclasses.dataclass
class InitSource:
    """kind: "model_dir" | "hf" | "workdir". config: the checkpoint's model (from its small
    files). params: the numpy tree (model_dir, hf; layers unscanned), read on first use;
    step: the workdir checkpoint's step; saved_shapes: a workdir's parameter shapes as
    saved (its own layer layout); task: what its heads were trained for
    (model_dir.task_record), if known; do_lower_case: its tokenizer's casing, if recorded
    (a task record's, a saved run's config)."""

    path: str
    kind: str
    config: BertConfig
    vocab: Optional[str] = None
    read: Optional[Callable[[], dict]] = dataclasses.field(default=None, repr=False)
    step: Optional[int] = None
    saved_shapes: Optional[dict[str, tuple]] = None
    task: Optional[dict] = None
    do_lower_case: Optional[bool] = None

    def __post_init__(self):
        if self.do_lower_case is None and (self.task or {}).get("do_lower_case") is not None:
            self.do_lower_case = bool(self.task["do_lower_case"])

    @functools.cached_property
    def params(self) -> Optional[dict]:
        return self.read() if self.read is not None else None

    def top_keys(self) -> list[str]:
        """The top-level parameter trees it holds ("bert", "mlm", "nsp", "classifier"...)."""
        if self.saved_shapes is not None:
            return sorted({k.split("/")[0] for k in self.saved_shapes})
        return sorted(self.params)

    def shapes(self, scan_layers: bool, num_layers: int) -> dict[str, tuple]:
        """Every tensor's shape by "/"-joined key, in the layer layout a model with
        `scan_layers` uses (a workdir: as saved; it restores only into its own layout).
        The layers are stacked in shape only (jax.eval_shape): nothing is copied."""
        if self.saved_shapes is not None:
            return self.saved_shapes
        params = self.params
        if scan_layers and "bert" in params:
            params = dict(params, bert=jax.eval_shape(
                lambda bert: stack_layers({"bert": bert}, num_layers)["bert"],
                params["bert"]))
        return flat_shapes(params)


def open_source(path: str, what: str = "train.init_checkpoint") -> InitSource:
    """The config and vocabulary of `path`; its tensors are read only when `params` is first
    used (a workdir's params in their saved layer layout; a warm start restores them with
    orbax onto the mesh instead), so callers check the architecture and shapes first. The
    kind is decided once (`source_kind`), then that kind's opener reads its small files."""
    path = paths.resolve(path)
    kind = source_kind(path)
    if kind is None:
        raise FileNotFoundError(
            f"{what}: {path} is neither a model directory (bert_config.json + params/), a "
            "Hugging Face directory (config.json + weights), nor a training run (WORKDIR, "
            "WORKDIR/checkpoints or WORKDIR/checkpoints/<step>)")
    return OPENERS[kind](path, what)


def source_kind(path: str) -> Optional[str]:
    """What `path` (resolved) holds, from which files are there (none is read):
    "model_dir", "hf" or "workdir" (in that order: a fine-tuning run's best_model/ is a
    model directory inside a workdir); None for none of these."""
    if model_dir.is_model_dir(path):
        return "model_dir"
    if paths.is_file(os.path.join(path, "config.json")):
        return "hf"
    return "workdir" if locate(path) is not None else None


def open_model_dir(path: str, what: str) -> InitSource:
    """A model directory (model_dir.open_model_dir, whose errors name the file); `what`:
    the openers' one signature."""
    return InitSource(path, "model_dir", **model_dir.open_model_dir(path)._asdict())


def open_hf(path: str, what: str) -> InitSource:
    """A Hugging Face directory (hf_files.open_hf_dir, whose errors name the file); `what`:
    the openers' one signature."""
    return InitSource(path, "hf", **open_hf_dir(path)._asdict())


def open_workdir(path: str, what: str) -> InitSource:
    """A training run's saved step (`open_run`): its params' shapes as saved, its model
    config less FP8, its vocabulary, task record and casing from its saved config."""
    run = open_run(path, f"{what}={path}")
    shapes = {"/".join(str(getattr(k, "key", k)) for k in kp): tuple(v.shape)
              for kp, v in jax.tree_util.tree_flatten_with_path(run.params)[0]}
    # The params alone leave a run: an FP8 run's scaling state (model.fp8) stays in
    # its checkpoints, and what starts from them computes without FP8 unless it asks.
    config = from_config_dict(run.config["model"]).replace(fp8=False)
    return InitSource(path, "workdir", config, run.vocab_file, read=run.read_params,
                      step=run.step, saved_shapes=shapes, task=run_task(run),
                      do_lower_case=run_casing(run.config))


# One opener per kind, each reading that kind's small files once.
OPENERS: dict[str, Callable[[str, str], InitSource]] = {
    "model_dir": open_model_dir, "hf": open_hf, "workdir": open_workdir}


def run_casing(config: dict) -> Optional[bool]:
    """The casing a saved run tokenized its text with: fine-tuning's tokenizer section, or
    pre-training's data section when it names a vocabulary; None when neither says."""
    tokenizer, data = config.get("tokenizer") or {}, config.get("data") or {}
    if tokenizer.get("do_lower_case") is not None:
        return bool(tokenizer["do_lower_case"])
    if data.get("vocab_file") and data.get("do_lower_case") is not None:
        return bool(data["do_lower_case"])
    return None


def run_task(run: "SavedRun") -> Optional[dict]:
    """The task record of a fine-tuning run (WORKDIR/run_<i>/task.json, written when the run
    starts, as its best_model/ records it); None for a pre-training run, whose heads say what
    they are, and for a run that has none."""
    if not (run.config.get("task") or {}).get("kind"):
        return None
    return model_dir.dir_task(run.workdir)


def load_model(path: str, what: str = "--checkpoint") -> tuple[dict, BertConfig, Optional[str]]:
    """(numpy params, layers unscanned; the config, unscanned; vocab file or None) of a
    model directory, a Hugging Face directory or a training run: what the conversion
    commands and feature extraction read."""
    source = open_source(path, what)
    config, params = unscanned(source)
    return params, config, source.vocab


def unscanned(source: InitSource) -> tuple[BertConfig, dict]:
    """(config, params) of `source` in the unscanned layout of a model directory."""
    config, params = source.config, source.params
    if source.kind == "workdir" and config.scan_layers:
        params = unstack_layers(params, config.num_hidden_layers)
    return config.replace(scan_layers=False), params


# --- a training run's saved checkpoints -----------------------------------------------

def plain(tree) -> dict:
    """A nested plain dict (FrozenDict and orbax's metadata mappings unwrapped)."""
    if hasattr(tree, "items"):
        return {k: plain(v) for k, v in tree.items()}
    return tree


def locate(path: str) -> Optional[tuple[str, Optional[int]]]:
    """A run's checkpoint named as WORKDIR, WORKDIR/checkpoints or WORKDIR/checkpoints/<step>
    -> (WORKDIR, step, None meaning the latest); None if `path` is none of these."""
    path = paths.resolve(path)
    parent, name = os.path.split(path)
    if os.path.basename(parent) == "checkpoints" and name.isdigit() and paths.is_dir(parent):
        return os.path.dirname(parent), int(name)
    for cand in (path, parent):
        if paths.is_dir(os.path.join(cand, "checkpoints")):
            return cand, None
    return None


def saved_steps(workdir: str) -> list[int]:
    """The steps saved under WORKDIR/checkpoints (folders named by a step with a state/
    item; temporary and set-aside folders are not steps), without opening a manager."""
    directory = epath.Path(paths.join(workdir, "checkpoints"))
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir()
                  if p.name.isdigit() and (p / "state").is_dir())


def pick_step(directory: str, steps: list[int], step: Optional[int], what: str) -> int:
    """`step` (None: the latest) if it is among the saved `steps` (orbax's list, less any
    step directory without a state/ item: an empty or foreign folder named like a step);
    else a FileNotFoundError naming `what`, the directory and the steps there are."""
    steps = [s for s in steps if paths.is_dir(os.path.join(directory, str(s), "state"))]
    if step is None:
        if not steps:
            raise FileNotFoundError(f"{what}: no checkpoint in {directory}")
        return max(steps)
    if step not in steps:
        raise FileNotFoundError(f"{what}: no checkpoint at step {step} in {directory}; "
                                f"saved steps: {sorted(steps) or 'none'}")
    return step


@dataclasses.dataclass
class SavedRun:
    """One saved step of a training run, opened by `open_run` without reading any array.
    config: the run's config as saved (a dict); params: orbax's metadata of the params
    tree (shape and dtype of every leaf)."""

    path: str
    workdir: str
    step: int
    config: dict
    params: Any

    @property
    def directory(self) -> str:
        return os.path.join(self.workdir, "checkpoints")

    @property
    def vocab_file(self) -> Optional[str]:
        """The run's data.vocab_file, if it names a file that (still) exists."""
        vocab = (self.config.get("data") or {}).get("vocab_file") or None
        return vocab if vocab and paths.is_file(vocab) else None

    def read_params(self) -> dict:
        """The params of this step as host numpy arrays (no optimizer state is read)."""
        item = {"params": jax.tree_util.tree_map(
            lambda a: np.zeros((0,), a.dtype), self.params)}
        args = jax.tree_util.tree_map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
        manager = reader(self.directory)
        try:
            restored = manager.restore(self.step, args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(item=item, restore_args=args,
                                             partial_restore=True)))
        finally:
            manager.close()
        return restored["state"]["params"]


def reader(directory: str) -> ocp.CheckpointManager:
    # Handlers named up front: a fresh manager cannot read an item's metadata without them.
    return ocp.CheckpointManager(
        directory, options=ocp.CheckpointManagerOptions(create=False),
        item_handlers={"state": ocp.PyTreeCheckpointHandler(),
                       "config": ocp.JsonCheckpointHandler(), "data": InputStateHandler()})


def open_run(path: str, what: str) -> SavedRun:
    """The run saved at `path` (WORKDIR, WORKDIR/checkpoints: the latest step;
    WORKDIR/checkpoints/<step>: that step): its config and its params' shapes. Errors name
    `what` (e.g. "train.init_checkpoint=...") and, for a missing step, the saved ones."""
    found = locate(path)
    if found is None:
        raise FileNotFoundError(f"{what}: {path} is not a training run (WORKDIR, "
                                f"WORKDIR/checkpoints or WORKDIR/checkpoints/<step>)")
    workdir, step = found
    directory = os.path.join(workdir, "checkpoints")
    manager = reader(directory)
    try:
        step = pick_step(directory, list(manager.all_steps()), step, what)
        config = manager.restore(step, args=ocp.args.Composite(
            config=ocp.args.JsonRestore()))["config"]
        meta = manager.item_metadata(step)["state"]
    finally:
        manager.close()
    where = f"{what} (step {step})"
    if not isinstance(config, dict) or "model" not in config:
        raise ValueError(f"{where}: the checkpoint's config has no 'model' section")
    try:
        params = meta["params"]
        params["bert"]
    except (KeyError, TypeError):
        raise ValueError(f"{where}: no params/bert (encoder) in the checkpoint") from None
    return SavedRun(path, workdir, step, config, params)


