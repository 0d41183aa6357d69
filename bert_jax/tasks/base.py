"""What a fine-tuning task gives the training loop (GLUE, SQuAD, NER and multiple choice
implement it).

A loop needs, from the task and nothing else:

    task.model(bert_config)           -> flax module; called as
                                         model.apply({"params": p}, input_ids, input_mask,
                                                     segment_ids, deterministic=...)
    task.train_features(tokenizer)    -> dict of numpy arrays `<int32>[N, ...]`
    task.eval_sets(tokenizer)         -> [EvalSet]: dev (and test) features + raw examples
    task.loss(outputs, batch)         -> (scalar loss, metrics), pure jnp, jit-able; honours
                                         batch["example_weights"] (0 = padding row)
    task.keep(outputs, batch)         -> per-row arrays the host collects during eval
    task.evaluate(eval_set, kept)     -> {metric: float} (host, numpy); kept = the concatenated
                                         `keep` rows of every eval batch, padding rows removed
    task.write_predictions(eval_set, kept, out_dir) -> files written (predictions.json,
                                         GLUE submission TSVs, ...)
    task.main_metric                  -> the key of `evaluate` that picks the best restart
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import numpy as np


@dataclasses.dataclass
class EvalSet:
    """name: "dev", "dev_matched", "test", ...; labeled: False for test sets (predictions
    written, nothing scored); examples: the raw examples the features came from (row i of
    features belongs to examples[features["example_index"][i]]); extra: task data the
    scorer needs (e.g. the SQuAD json)."""

    name: str
    features: dict[str, np.ndarray]
    examples: Sequence[Any]
    labeled: bool = True
    extra: Optional[Mapping[str, Any]] = None


def model_inputs(batch: Mapping[str, Any]) -> tuple:
    """Positional inputs of every Bert* task model: (input_ids, attention_mask, token_type_ids)."""
    return batch["input_ids"], batch["input_mask"], batch["segment_ids"]


def collect(kept_batches: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenates the host copies of `task.keep` over eval batches and drops the padding
    rows (example_weights == 0), which eval_batches only ever puts at the end."""
    if not kept_batches:
        return {}
    out = {k: np.concatenate([np.asarray(b[k]) for b in kept_batches])
           for k in kept_batches[0]}
    real = out.pop("example_weights") > 0
    return {k: v[real] for k, v in out.items()}
