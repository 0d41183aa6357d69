"""Pre-training as a task of the one loop (bert_jax.train.loop): BertForPreTraining, the
masked-LM (+ NSP) loss over the original feature format (bert_jax.data.pretrain describes
the batches, packed rows included), its input (TFRecords, raw text or synthetic batches) and
its exact evaluation.

    summary = run(config, workdir)      # launch/train.py for configs without a task section
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.convert.sources import saved_steps
from bert_jax.convert.sources import open_source
from bert_jax.models.bert import BertForPreTraining
from bert_jax.models.config import ConfigError, from_config_dict
from bert_jax.tasks.pretraining import data as data_lib
from bert_jax.tasks.pretraining.loss import pretraining_loss
from bert_jax.train import loop, settings
from bert_jax.train.checked import check
from bert_jax.train.state import dummy_inputs
from bert_jax.train.task import Shape
from bert_jax.train.warm_start import Resize, check_warm_start

# Packed rows' extra model inputs: batch features of BertForPreTraining's argument names.
PACKED_INPUTS = ("sequence_ids", "position_ids", "next_sentence_positions")


def model_inputs(batch: Mapping[str, jax.Array]) -> dict:
    """Original feature names (+ packed rows' features, when present) -> BertForPreTraining
    keyword arguments."""
    out = dict(input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
               token_type_ids=batch["segment_ids"],
               masked_lm_positions=batch["masked_lm_positions"])
    out.update({name: batch[name] for name in PACKED_INPUTS if name in batch})
    return out


def totals(batch) -> dict:
    """The whole batch's denominators: "mlm", the real masked tokens, and "nsp", the NSP
    examples (rows, or the sequences of packed rows); filler rows (example_weights 0) left
    out."""
    w = batch["masked_lm_weights"].astype(jnp.float32)
    ex = batch.get("example_weights")
    ex = None if ex is None else ex.astype(jnp.float32)
    if ex is not None:
        w = w * ex[:, None]
    if "next_sentence_weights" in batch:  # packed rows: one NSP slot per sequence
        nw = batch["next_sentence_weights"].astype(jnp.float32)
        n = jnp.sum(nw if ex is None else nw * ex[:, None])
    elif ex is not None:
        n = jnp.sum(ex)
    else:
        n = jnp.asarray(batch["input_ids"].shape[0], jnp.float32)
    return {"mlm": jnp.maximum(jnp.sum(w), 1e-5), "nsp": jnp.maximum(n, 1e-5)}


class PretrainingTask:
    """Pre-training under `config`; make_train_data / make_eval_data(config, workdir)
    replace bert_jax.tasks.pretraining.data's input (tests feed batches from memory)."""

    title = "pre-training"
    eval_prefix = "eval/"
    init_keys = None          # a warm start takes every tree both have (encoder and heads)
    train_examples = None     # an endless stream: train.steps, never epochs

    def __init__(self, config, workdir: str, make_train_data: Optional[Callable] = None,
                 make_eval_data: Optional[Callable] = None):
        if not config.train.do_train or config.train.random_init:
            raise ConfigError("config.train.do_train / random_init apply to fine-tuning "
                              "configs (a task section); pre-training always trains")
        self.config = config
        self.model_config = from_config_dict(config.model)
        self.model = BertForPreTraining(self.model_config,
                                        nsp=bool(config.model.get("nsp", True)))
        self.shape = Shape(seq_len=int(config.data.max_seq_length),
                           predictions=int(config.data.max_predictions_per_seq),
                           nsp=self.model.nsp)
        self.make_train_data = make_train_data or data_lib.make_train_data
        self.make_eval_data = make_eval_data or data_lib.make_eval_data
        # What the weights compute under that no shape shows (bert_jax.train.settings):
        # the model's settings and, when the run tokenizes with a vocabulary, its casing.
        self.settings = dict(settings.model_settings(self.model_config), **{
            settings.CASING: bool(config.data.get("do_lower_case", True))
            if data_lib.vocab_file(config) else None})
        self.init_changes: list[str] = []   # settings a warm start changes on purpose
        self.init_source = None
        # Shape changes a warm start may make (a longer position table, a larger vocabulary).
        self.init_resize = Resize.from_config(config.train, data_lib.vocab_file(config),
                                              bool(config.data.get("do_lower_case", True)))
        # A warm start's source is opened and its architecture checked now, from its config
        # alone: a mismatch costs no data, no init and no tensor read. A run that resumes
        # has its own checkpoints instead.
        if config.train.init_checkpoint and not saved_steps(workdir):
            self.init_source = open_source(config.train.init_checkpoint,
                                           "config.train.init_checkpoint")
            what = f"config.train.init_checkpoint={self.init_source.path}"
            check_warm_start(self.init_source, self.model_config, what, self.init_resize)
            self.init_changes = settings.check(
                dict(settings.model_settings(self.init_source.config),
                     **{settings.CASING: self.init_source.do_lower_case}),
                self.settings, what, bool(config.train.get("accept_setting_changes", False)),
                keys={settings.CASING: "data.do_lower_case"})

    # --- the step side (jnp) ------------------------------------------------------------

    def init_inputs(self) -> dict:
        return dummy_inputs(self.shape.seq_len, self.shape.predictions)

    def inputs(self, batch) -> dict:
        return model_inputs(batch)

    def totals(self, batch) -> dict:
        return totals(batch)

    def sums(self, outputs, batch) -> dict:
        mlm_logits, nsp_logits = outputs
        _, m = pretraining_loss(mlm_logits, nsp_logits, batch)
        return {k: v for k, v in m.items() if k.endswith(("_sum", "_count", "_correct"))}

    def loss(self, sums, totals) -> jax.Array:
        loss = sums["mlm_loss_sum"] / totals["mlm"]
        if "nsp_loss_sum" in sums:
            loss = loss + sums["nsp_loss_sum"] / totals["nsp"]
        return loss

    def metrics(self, sums, totals) -> dict:
        out = {"train/mlm_loss": sums["mlm_loss_sum"] / totals["mlm"],
               "train/mlm_acc": sums["mlm_correct"] / totals["mlm"]}
        if "nsp_loss_sum" in sums:
            out["train/nsp_loss"] = sums["nsp_loss_sum"] / totals["nsp"]
            out["train/nsp_acc"] = sums["nsp_correct"] / totals["nsp"]
        return out

    def eval_outputs(self, outputs, batch) -> dict:
        return self.sums(outputs, batch)

    # --- the host side --------------------------------------------------------------------

    def train_data(self, config, workdir: str):
        return self.make_train_data(config, workdir)

    def evaluate(self, run: Callable, step: int, workdir: str, max_batches: int = -1) -> dict:
        batches = self.make_eval_data(self.config, workdir)
        return {} if batches is None else evaluate(run, batches, max_batches)

    def describe(self, summary: dict) -> list[str]:
        if "eval/mlm_acc" in summary and "eval/mlm_acc_majority" in summary:
            return [f"eval MLM accuracy {summary['eval/mlm_acc']:.4f} vs. most-frequent-token "
                    f"baseline {summary['eval/mlm_acc_majority']:.4f}"]
        return []


def evaluate(run: Callable[[dict], dict], batches: Iterable[dict], max_batches: int = -1
             ) -> dict:
    """eval/{loss, mlm_loss, mlm_acc, nsp_loss, nsp_acc} over `batches` (exact: sums over
    the whole set, filler examples weighted 0; `run` maps a host batch to the host copy of
    its sums), plus eval/mlm_acc_majority: the accuracy of always predicting the most
    frequent masked token of this eval set, the baseline a model must beat."""
    sums: dict[str, float] = {}
    label_counts: dict[int, float] = {}
    n = 0
    for batch in batches:
        if 0 <= max_batches <= n:
            break
        for k, v in run(batch).items():
            sums[k] = sums.get(k, 0.0) + float(v)
        w = np.asarray(batch["masked_lm_weights"], np.float64)
        if "example_weights" in batch:
            w = w * np.asarray(batch["example_weights"], np.float64)[:, None]
        ids = np.asarray(batch["masked_lm_ids"]).reshape(-1)
        for i, c in zip(*np.unique(ids[w.reshape(-1) > 0], return_counts=True)):
            label_counts[int(i)] = label_counts.get(int(i), 0.0) + float(c)
        n += 1
    if not sums:
        return {}
    mlm_count = max(sums["mlm_count"], 1e-5)
    out = {"eval/mlm_loss": sums["mlm_loss_sum"] / mlm_count,
           "eval/mlm_acc": sums["mlm_correct"] / mlm_count,
           "eval/mlm_acc_majority": (max(label_counts.values()) / mlm_count
                                     if label_counts else 0.0),
           "eval/examples": sums.get("nsp_count", float("nan")),
           "eval/masked_tokens": sums["mlm_count"]}
    out["eval/loss"] = out["eval/mlm_loss"]
    if "nsp_count" in sums:
        nsp_count = max(sums["nsp_count"], 1e-5)
        out["eval/nsp_loss"] = sums["nsp_loss_sum"] / nsp_count
        out["eval/nsp_acc"] = sums["nsp_correct"] / nsp_count
        out["eval/loss"] += out["eval/nsp_loss"]
    if jax.process_count() > 1:
        # Each process saw its own eval shard: the majority baseline above is per-process;
        # the other sums are global (they came out of the jitted step).
        out.pop("eval/mlm_acc_majority")
    return out


def run(config, workdir: str, *, make_train_data: Optional[Callable] = None,
        make_eval_data: Optional[Callable] = None, **kwargs) -> dict:
    """Pre-trains (or resumes) in `workdir`; the run's summary. kwargs: loop.train's
    (after_save, after_step, progress)."""
    checked = check(config)  # before the warm start's source is opened
    task = PretrainingTask(config, workdir, make_train_data, make_eval_data)
    return loop.train(config, workdir, task, checked=checked, **kwargs).summary
