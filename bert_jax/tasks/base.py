"""What every fine-tuning task (GLUE, SQuAD, NER, multiple choice) shares: the side the one
training loop sees (bert_jax.train.task.Task), built from what each task defines:

    head(bert_config)          the flax module (model(input_ids=, attention_mask=,
                               token_type_ids=, deterministic=))
    read(split), _features(split, examples, tokenizer), eval_sets(tokenizer)
                               the data: features `<int32>[N, ...]` and EvalSets
    objective(outputs, batch)  (loss, metrics with "loss_sum" and "correct"), jnp; honours
                               batch["example_weights"] (0 = filler); weight(batch): what
                               the loss is a mean over (examples; NER: labelled words)
    keep(outputs, batch)       per-row arrays the host collects during eval
    score(eval_set, kept)      {metric: float}; write_predictions(eval_set, kept, out_dir)
    main_metric                the key of `score` that picks the best restart

The driver (bert_jax.tasks.finetune) calls `prepare(...)` with the model, the features and
the warm-start source before the loop runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.tasks.inputs import FeatureBatches, eval_batches, num_rows
from bert_jax.train import settings
from bert_jax.train.state import dummy_inputs
from bert_jax.train.task import Shape


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


def collect(kept_batches: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenates the host copies of `task.keep` over eval batches and drops the filler
    rows (example_weights == 0), which eval_batches only ever puts at the end."""
    if not kept_batches:
        return {}
    out = {k: np.concatenate([np.asarray(b[k]) for b in kept_batches])
           for k in kept_batches[0]}
    real = out.pop("example_weights") > 0
    return {k: v[real] for k, v in out.items()}


class FinetuneTask:
    """The loop's side of a fine-tuning task (the methods of bert_jax.train.task.Task)."""

    init_keys = ("bert",)     # the pretrained encoder; the head starts fresh
    main_metric = "accuracy"

    def prepare(self, config, bert_config, train_features, eval_sets: list[EvalSet],
                init_source=None) -> None:
        self.title = f"task.kind={config.task.kind}"
        self.model_config = bert_config
        self.model = self.head(bert_config)
        self.train_features, self.eval_data = train_features, eval_sets
        self.train_examples = num_rows(train_features) if train_features else None
        some = train_features or (eval_sets[0].features if eval_sets else None)
        if some is None:  # predicting: the params' shapes do not depend on the length
            self.shape = Shape(seq_len=int(config.task.max_seq_length))
        else:
            ids = some["input_ids"]
            self.shape = Shape(seq_len=int(ids.shape[-1]),
                               sequences=int(np.prod(ids.shape[1:-1], dtype=np.int64)))
        self.eval_prefix = tuple(f"{e.name}/" for e in eval_sets)
        self.eval_batch_size = (int(config.train.eval_batch_size)
                                or int(config.train.batch_size))
        self.init_source = init_source
        # The model is its checkpoint's (check(config) compared its settings): a resume
        # compares the casing the text is tokenized with.
        self.settings = {settings.CASING: bool(config.tokenizer.do_lower_case)}

    def train_features(self, tokenizer):
        """The training split's features (a task's `_features(split, examples, tokenizer)`
        of its `read("train")`)."""
        return self._features("train", self.read("train"), tokenizer)

    # --- the step side (jnp) ------------------------------------------------------------

    def weight(self, batch) -> jax.Array:
        return jnp.sum(batch["example_weights"].astype(jnp.float32))

    def init_inputs(self) -> dict:
        return dummy_inputs(self.shape.seq_len, None)

    def inputs(self, batch) -> dict:
        return dict(input_ids=batch["input_ids"], attention_mask=batch["input_mask"],
                    token_type_ids=batch["segment_ids"])

    def totals(self, batch) -> dict:
        return {"count": jnp.maximum(self.weight(batch), 1e-5)}

    def sums(self, outputs, batch) -> dict:
        _, m = self.objective(outputs, batch)
        return {k: m[k] for k in ("loss_sum", "correct") if k in m}

    def loss(self, sums, totals) -> jax.Array:
        return sums["loss_sum"] / totals["count"]

    def metrics(self, sums, totals) -> dict:
        if "correct" not in sums:
            return {}
        return {"train/accuracy": sums["correct"] / totals["count"]}

    def eval_outputs(self, outputs, batch) -> dict:
        return self.keep(outputs, batch)

    # --- the host side --------------------------------------------------------------------

    def train_data(self, config, workdir: str):  # noqa: ARG002  (the Task signature)
        return FeatureBatches(self.train_features, int(config.train.batch_size),
                              int(config.train.seed), jax.process_index(),
                              jax.process_count())

    def evaluate(self, run: Callable, step: int, workdir: str, max_batches: int = -1) -> dict:
        """Every eval set scored (labelled ones) and its prediction files written (process
        0): {"<set>/<metric>": value}."""
        out = {}
        for name, result in self.score_eval_sets(run, workdir).items():
            out.update({f"{name}/{k}": v for k, v in result.items()})
        return out

    def score_eval_sets(self, run: Callable, out_dir: str) -> dict:
        """{eval set name: metrics}; every example once (zero-weight filler in the last
        batch); process 0 writes the prediction files into `out_dir`."""
        p, n = jax.process_index(), jax.process_count()
        results = {}
        for eval_set in self.eval_data:
            kept = collect([run(_rows(b, p, n)) for b in
                            eval_batches(eval_set.features, self.eval_batch_size)])
            results[eval_set.name] = self.score(eval_set, kept)
            if p == 0:
                self.write_predictions(eval_set, kept, out_dir)
        return results

    def describe(self, summary: dict) -> list[str]:  # noqa: ARG002
        return []


def _rows(batch: dict, process: int, processes: int) -> dict:
    """This process's share of a global batch (the rows its devices hold)."""
    rows = len(batch["example_weights"]) // processes
    return {k: v[process * rows:(process + 1) * rows] for k, v in batch.items()}
