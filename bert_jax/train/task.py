"""What the one training loop asks of a task. Pre-training (bert_jax.tasks.pretraining) and
every fine-tuning task (bert_jax.tasks.base.FinetuneTask) implement it; the loop never
imports them: the launcher hands it its task. The loop owns everything around the model
(mesh, state, the jitted step, checkpoints, faults, evaluation schedule, logging); a task
owns the model, its input and its numbers.

`batch` maps feature names to global arrays `[batch, ...]` inside the step and to host-local
numpy `[batch / processes, ...]` outside it; every batch has input_ids and input_mask
(`[batch, length]` or `[batch, choices, length]`), which the real-token metrics read.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Protocol


@dataclasses.dataclass(frozen=True)
class Shape:
    """One example: `sequences` sequences (a multiple-choice example's choices) of `seq_len`
    tokens, `predictions` masked-LM outputs, with the NSP head or not (init, FLOPs, checks)."""

    seq_len: int
    sequences: int = 1
    predictions: int = 0
    nsp: bool = False


class Task(Protocol):
    title: str                  # in messages: "pre-training", "task.kind=glue", ...
    model: Any                  # the flax module; model_config: its BertConfig
    model_config: Any
    shape: Shape
    eval_prefix: Any            # str or tuple of the eval scalars' key prefixes ("eval/")
    train_examples: Optional[int]    # a finite training set's size (epochs); None: endless
    # Warm start: the opened bert_jax.convert.sources.InitSource or None, and the top-level
    # parameter trees taken from it (None: every one both have).
    init_source: Any
    init_keys: Optional[tuple[str, ...]]
    # What the weights compute under that no shape shows, {setting: value} (None: not
    # known; bert_jax.train.settings): a resume stops on a change from its checkpoint's.
    settings: dict

    def init_inputs(self) -> dict: ...              # model kwargs of one example (init)
    def inputs(self, batch) -> dict: ...            # batch -> model kwargs (in the step)
    def totals(self, batch) -> dict: ...            # the whole batch's denominators
    def sums(self, outputs, batch) -> dict: ...     # additive scalars of a (micro-)batch
    def loss(self, sums, totals): ...               # the loss: sums over totals
    def metrics(self, sums, totals) -> dict: ...    # "train/..." scalars beside the loss
    def eval_outputs(self, outputs, batch) -> dict: ...   # sums, or per-row arrays

    def train_data(self, config, workdir: str):
        """Host-local numpy batches of train.batch_size in all, with get_state / set_state
        / seek (exact resume); their input checked before anything compiles."""

    def evaluate(self, run: Callable[[dict], dict], step: int, workdir: str,
                 max_batches: int = -1) -> dict:
        """Scalars to log ({} when there is nothing to evaluate); `run` maps a host-local
        eval batch to the host copy of its eval_outputs. Process 0 writes its files."""

    def describe(self, summary: dict) -> list[str]: ...   # extra lines for the summary
