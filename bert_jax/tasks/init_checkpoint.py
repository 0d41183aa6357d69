"""`train.init_checkpoint`: where the pretrained encoder of a fine-tuning run (and the
weights of a pre-training warm start, bert_jax/train/warm_start.py) come from.

    source = open_init_checkpoint(path)      # config + vocab + shapes; no arrays read yet
    check_encoder(source, abstract.params["bert"])   # before any compile: names key + shapes
    state = load_encoder(source, state, tx, shardings)   # the encoder placed on the mesh

Three kinds of `path`:
  * one of our model directories (bert_config.json + params/: `python -m bert_jax.convert`
    output, or a fine-tuning run's best_model/),
  * a Hugging Face directory (config.json + model.safetensors / pytorch_model.bin),
  * one of our pre-training workdirs (WORKDIR or WORKDIR/checkpoints, written by
    launch/train.py, or WORKDIR/checkpoints/<step> for a step other than the latest): the
    latest (or that) step's params["bert"] and the run's `model` config
    (vocab: its data.vocab_file, if set). These are restored by orbax straight onto the
    fine-tuning mesh, each process reading only its shards (no host copy of the model).
Google TF checkpoints: convert first (`python -m bert_jax.convert from-tf`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Optional

import flax
import jax
import numpy as np

from bert_jax.models.config import BertConfig, from_config_dict
from bert_jax.models.params import stack_layers


@dataclasses.dataclass
class InitSource:
    """kind: "model_dir" | "hf" | "workdir". config: the checkpoint's model (read from its
    small files: no tensor is read when opening). params: the numpy tree (model_dir, hf; the
    encoder under "bert"), read on first use; step + shapes: the workdir checkpoint's step
    and the shapes of its params["bert"] leaves, by "/"-joined key."""

    path: str
    kind: str
    config: BertConfig
    vocab: Optional[str] = None
    read: Optional[Callable[[], dict]] = dataclasses.field(default=None, repr=False)
    step: Optional[int] = None
    shapes: Optional[dict[str, tuple]] = None

    @functools.cached_property
    def params(self) -> Optional[dict]:
        return self.read() if self.read is not None else None


def open_init_checkpoint(path: str) -> InitSource:
    """The config and vocabulary of `path`; its tensors are read only when `params` is first
    used (or, for a workdir, restored by `load_encoder`), so callers check the architecture
    (bert_jax.train.warm_start.check_architecture) and shapes first."""
    from bert_jax import paths
    from bert_jax.convert import model_dir

    path = paths.resolve(path)
    if model_dir.is_model_dir(path):
        config = BertConfig.from_json_file(os.path.join(path, model_dir.CONFIG_NAME))
        return InitSource(path, "model_dir", config, model_dir.dir_vocab(path),
                          read=lambda: model_dir.load_model_dir(path)[0])
    if paths.is_file(os.path.join(path, "config.json")):
        from bert_jax.convert.hf_files import hf_vocab, read_hf_config, read_hf_dir

        return InitSource(path, "hf", read_hf_config(path), hf_vocab(path),
                          read=lambda: read_hf_dir(path)[0])
    from bert_jax.train.checkpoint import locate

    if locate(path) is not None:
        return _open_workdir(path)
    raise FileNotFoundError(
        f"train.init_checkpoint={path!r} is neither a model directory (bert_config.json + "
        "params/), a Hugging Face directory (config.json + weights), nor a pre-training "
        "workdir (WORKDIR, WORKDIR/checkpoints or WORKDIR/checkpoints/<step>)")


def _open_workdir(path: str) -> InitSource:
    from bert_jax.train.checkpoint import open_run

    run = open_run(path, f"train.init_checkpoint={path}")
    shapes = {"/".join(str(getattr(k, "key", k)) for k in kp): tuple(v.shape)
              for kp, v in jax.tree_util.tree_flatten_with_path(run.params["bert"])[0]}
    return InitSource(path, "workdir", from_config_dict(run.config["model"]), run.vocab_file,
                      step=run.step, shapes=shapes)


def _flat_shapes(tree) -> dict[str, tuple]:
    return {"/".join(k): tuple(np.shape(v)) for k, v in
            flax.traverse_util.flatten_dict(flax.core.unfreeze(tree)).items()}


def _numpy_encoder(source: InitSource, scan_layers: bool, num_layers: int) -> dict:
    if "bert" not in source.params:
        raise ValueError(f"train.init_checkpoint={source.path}: no 'bert' encoder params "
                         f"(top-level keys: {sorted(source.params)})")
    bert = source.params["bert"]
    return stack_layers({"bert": bert}, num_layers)["bert"] if scan_layers else bert


def check_encoder(source: InitSource, abstract_bert: Any, scan_layers: bool,
                  num_layers: int) -> None:
    """Every encoder tensor the model expects (`abstract_bert`: ShapeDtypeStructs) exists in
    the checkpoint with the same shape; else a ValueError naming the key and both shapes.
    Cheap (shapes only): call it before compiling anything."""
    want = _flat_shapes(abstract_bert)
    if source.kind == "workdir":
        got = source.shapes
    else:
        got = _flat_shapes(_numpy_encoder(source, scan_layers, num_layers))
    missing = sorted(k for k in want if k not in got)
    if missing:
        raise ValueError(f"train.init_checkpoint={source.path}: encoder tensors missing: "
                         f"bert/{missing[0]} ... ({len(missing)} in all; the checkpoint has "
                         f"{sorted(got)[:5]} ...)")
    for k, shape in want.items():
        if tuple(got[k]) != tuple(shape):
            raise ValueError(
                f"train.init_checkpoint={source.path}: bert/{k} has shape {tuple(got[k])} in "
                f"the checkpoint, the model expects {tuple(shape)} (checkpoint model "
                f"hidden_size={source.config.hidden_size}, "
                f"num_hidden_layers={source.config.num_hidden_layers}, "
                f"intermediate_size={source.config.intermediate_size})")


def load_encoder(source: InitSource, state, tx, shardings, abstract, scan_layers: bool,
                 num_layers: int):
    """`state` (a fresh TrainState on the mesh) with params["bert"] from `source` and a fresh
    optimizer state; heads keep their fresh init. Shapes must have passed check_encoder."""
    if source.kind == "workdir":
        from bert_jax.train import checkpoint as ckpt_lib

        ckpt = ckpt_lib.Checkpointer(ckpt_lib.locate(source.path)[0], every=1,
                                     read_only=True)
        try:
            bert = ckpt.restore_params({"bert": abstract.params["bert"]},
                                       step=source.step)["bert"]
        finally:
            ckpt.close()
    else:
        bert = place_numpy(_numpy_encoder(source, scan_layers, num_layers),
                           abstract.params["bert"], shardings.params["bert"])
    params = {**state.params, "bert": bert}
    opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
    return state.replace(params=params, opt_state=opt_state)


def place_numpy(tree: Any, abstract: Any, shardings: Any) -> Any:
    """A host numpy tree -> jax.Arrays of `abstract`'s shapes and dtypes on `shardings` (the
    same tree structure). Every process holds the host copy; each builds only its
    addressable shards."""
    flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(tree))
    refs = flax.traverse_util.flatten_dict(abstract)
    places = flax.traverse_util.flatten_dict(shardings)
    return flax.traverse_util.unflatten_dict({
        k: jax.make_array_from_callback(
            ref.shape, places[k], lambda idx, x=np.asarray(flat[k], ref.dtype): x[idx])
        for k, ref in refs.items()})
