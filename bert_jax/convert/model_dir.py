"""A model directory: the portable form of a trained or imported BERT.

    DIR/bert_config.json   BertConfig (original keys + ours)
    DIR/params/            orbax checkpoint of the unscanned parameter tree:
                           {"bert": encoder, and any heads: "mlm", "nsp", "classifier", ...}
    DIR/vocab.txt          optional: the vocabulary the model was trained with
    DIR/task.json          optional: what the heads were trained for (`task_record`):
                           {"kind", "labels", "do_lower_case"}; `to-hf` picks the
                           transformers class, label names and casing from it

`python -m bert_jax.convert from-tf|from-hf|from-workdir` writes one; `train.init_checkpoint`
and `launch/extract_features.py` read one (bert_jax.convert.sources, which also reads a
Hugging Face directory or a training run where a model directory is expected).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bert_jax import paths
from bert_jax.models.config import BertConfig
from bert_jax.models.params import unstack_layers

CONFIG_NAME = "bert_config.json"
PARAMS_NAME = "params"
VOCAB_NAME = "vocab.txt"
TASK_NAME = "task.json"
TASK_KINDS = ("pretraining", "glue", "ner", "squad", "choice")


def task_record(kind: str, labels: Optional[Sequence[str]] = None,
                do_lower_case: Optional[bool] = None, name: str = "") -> dict:
    """DIR/task.json's content. kind: "pretraining" (MLM / NSP heads, or none), "glue" (a sequence
    classifier; labels None = a one-output regression such as STS-B), "ner" (a classifier
    per token), "squad" (span start / end), "choice" (one score per choice); labels: the
    class names in the order of the head's outputs; do_lower_case: the tokenizer's casing
    (None: not known); name: the task's own name (e.g. "mrpc"), informative only."""
    if kind not in TASK_KINDS:
        raise ValueError(f"task kind {kind!r}; expected one of {list(TASK_KINDS)}")
    return {"kind": kind, "name": name or "",
            "labels": None if labels is None else [str(x) for x in labels],
            "do_lower_case": None if do_lower_case is None else bool(do_lower_case)}


class Opened(NamedTuple):
    """A checkpoint opened from its small files, no tensor read: config (its BertConfig),
    vocab (its vocabulary file or None), task (its `task_record` or None), read (a callable
    returning its numpy params, layers unscanned). What each source kind's opener returns
    (`open_model_dir`, hf_files.open_hf_dir)."""

    config: BertConfig
    vocab: Optional[str]
    task: Optional[dict]
    read: Callable[[], dict]


def open_model_dir(path: str) -> Opened:
    """Model directory `path` (is_model_dir) from its small files: bert_config.json, and
    vocab.txt and task.json when there."""
    config = BertConfig.from_json_file(os.path.join(path, CONFIG_NAME))
    return Opened(config, dir_vocab(path), dir_task(path), lambda: load_model_dir(path)[0])


def is_model_dir(path: str) -> bool:
    return paths.is_file(os.path.join(path, CONFIG_NAME)) and paths.is_dir(
        os.path.join(path, PARAMS_NAME))


def save_model_dir(path: str, params: Any, config: BertConfig,
                   vocab_file: Optional[str] = None, task: Optional[dict] = None) -> None:
    """Writes params (unscanned or scanned: stored unscanned) + config (+ vocab, + the
    task record of `task_record`).
    Written under a temporary name and renamed, so a crash never leaves a half model dir.
    `path` may be local or a URI (gs://...)."""
    path = paths.resolve(path)
    if paths.exists(path):
        raise FileExistsError(f"{path} already exists; refusing to overwrite a model directory")
    tmp = path + ".tmp"
    paths.rmtree(tmp)
    paths.makedirs(tmp)
    # The small files first: a task record that is not one, or a vocabulary that is not
    # there, fails before the params are written.
    if task:
        write_task(tmp, task)
    # No FP8 scaling state travels in a model directory (it is training state): its
    # config says so, and whatever loads it computes without FP8.
    config.replace(scan_layers=False, fp8=False).to_json_file(paths.join(tmp, CONFIG_NAME))
    if vocab_file:
        paths.copy_file(vocab_file, paths.join(tmp, VOCAB_NAME))
    if config.scan_layers:
        params = unstack_layers(params, config.num_hidden_layers)
    params = _to_numpy(params)
    # Host numpy, written by the calling process alone: with several processes the others
    # must not be waited for (fine-tuning's best_model/ is written by process 0 only).
    me = jax.process_index()
    alone = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
    with ocp.StandardCheckpointer(multiprocessing_options=alone) as ckptr:
        ckptr.save(paths.join(tmp, PARAMS_NAME), params)
        ckptr.wait_until_finished()
    paths.rename(tmp, path)


def write_task(directory: str, task: dict) -> None:
    """DIR/task.json (`task_record`'s fields): in a model directory, or in a fine-tuning
    run's workdir, where `bert_jax.convert.sources` reads it back for the run's heads."""
    epath.Path(paths.join(directory, TASK_NAME)).write_text(
        json.dumps(task_record(**task), indent=2, sort_keys=True) + "\n")


def dir_vocab(path: str) -> Optional[str]:
    """DIR/vocab.txt of a model directory, if there is one."""
    vocab = os.path.join(path, VOCAB_NAME)
    return vocab if paths.is_file(vocab) else None


def dir_task(path: str) -> Optional[dict]:
    """DIR/task.json of a model directory (`task_record`'s fields), if there is one."""
    where = paths.join(path, TASK_NAME)
    if not paths.is_file(where):
        return None
    with paths.open_text(where) as f:
        d = json.load(f)
    try:
        return task_record(**d)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def load_model_dir(path: str) -> tuple[dict, BertConfig]:
    """Returns (params as numpy, unscanned; config). Errors name the directory."""
    if not is_model_dir(path):
        raise FileNotFoundError(
            f"{path} is not a model directory: expected {CONFIG_NAME} and {PARAMS_NAME}/ in it")
    config = BertConfig.from_json_file(os.path.join(path, CONFIG_NAME))
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(paths.join(path, PARAMS_NAME))
    return _to_numpy(params), config


def _to_numpy(tree):
    return jax.tree_util.tree_map(np.asarray, tree)
