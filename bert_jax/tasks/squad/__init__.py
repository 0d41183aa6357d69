"""SQuAD v1.1 / v2.0 span question answering: the task object, its loss and scoring.

    task = SquadTask(version="2.0", train_file="train-v2.0.json", predict_file="dev-v2.0.json")

Data from SQuAD JSON files, or tfds `squad/v1.1|v2.0` when no file is given (reader.py);
features.py, answer extraction in postprocess.py, the official scripts' scoring in metrics.py.
"""

from __future__ import annotations

from typing import Mapping

import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.tasks.readers import DataError
from bert_jax.tasks.inputs import cache_key, cached_features, check_features
from bert_jax.models.bert import BertForQuestionAnswering
from bert_jax.models.config import ConfigError
from bert_jax.tasks.base import EvalSet, FinetuneTask
from bert_jax.tasks.squad import features as squad_features
from bert_jax.tasks.squad import metrics as squad_metrics
from bert_jax.tasks.squad import postprocess as squad_postprocess
from bert_jax.tasks.squad import reader as readers


def span_loss(start_logits, end_logits, batch: Mapping[str, jnp.ndarray]):
    """(start xent + end xent) / 2 over the positions of the sequence, weighted by
    example_weights. start_logits, end_logits: [batch, L]; batch: start_positions,
    end_positions <int>[batch] (0 = [CLS] = no answer in this window)."""
    w = batch["example_weights"].astype(jnp.float32)
    count = jnp.sum(w)
    xs = optax.softmax_cross_entropy_with_integer_labels(
        start_logits.astype(jnp.float32), batch["start_positions"].astype(jnp.int32))
    xe = optax.softmax_cross_entropy_with_integer_labels(
        end_logits.astype(jnp.float32), batch["end_positions"].astype(jnp.int32))
    loss_sum = jnp.sum(0.5 * (xs + xe) * w)
    loss = loss_sum / jnp.maximum(count, 1e-5)
    return loss, {"loss": loss, "loss_sum": loss_sum, "count": count}


class SquadTask(FinetuneTask):
    def __init__(self, version: str = "1.1", train_file: str = "", predict_file: str = "",
                 max_seq_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
                 n_best_size: int = 20, max_answer_length: int = 30,
                 null_score_diff_threshold: float = 0.0, tfds_data_dir=None,
                 cache_dir: str = "", vocab_file: str = ""):
        if version not in ("1.1", "2.0"):
            raise ConfigError(f"SQuAD version must be '1.1' or '2.0', got {version!r}")
        self.version, self.version_2 = version, version == "2.0"
        self.train_file, self.predict_file = train_file, predict_file
        self.max_seq_length, self.doc_stride = max_seq_length, doc_stride
        self.max_query_length = max_query_length
        self.n_best_size, self.max_answer_length = n_best_size, max_answer_length
        self.null_score_diff_threshold = null_score_diff_threshold
        self.tfds_data_dir, self.cache_dir, self.vocab_file = tfds_data_dir, cache_dir, vocab_file
        self.main_metric = "f1"

    def head(self, bert_config):
        return BertForQuestionAnswering(bert_config)

    def read(self, split: str):
        path = self.train_file if split == "train" else self.predict_file
        if path:
            return readers.read_squad_json(path)
        return readers.read_squad_tfds(self.version, split, self.tfds_data_dir)

    def _features(self, split, examples, tokenizer):
        path = self.train_file if split == "train" else self.predict_file
        key = cache_key(source=path or f"tfds:{self.version}", vocab=self.vocab_file,
                        lengths=(self.max_seq_length, self.doc_stride, self.max_query_length),
                        n=len(examples))
        return check_features(cached_features(
            self.cache_dir, f"squad{self.version}-{split}", key,
            lambda: squad_features.convert_examples(
                examples, tokenizer, self.max_seq_length, self.doc_stride,
                self.max_query_length, is_training=split == "train")),
            tokenizer, path or f"tfds squad/v{self.version}:{split}")

    def train_features(self, tokenizer):
        examples, _ = self.read("train")
        # A question without an answer would be trained as "no answer here" (the [CLS]
        # span): right for v2.0's is_impossible ones only.
        unanswered = [e.qid for e in examples if not e.answers and not e.is_impossible]
        if unanswered:
            raise DataError(
                f"{self.train_file or 'tfds squad'}: {len(unanswered)} training question(s) "
                f"without 'answers' and not marked is_impossible (first: {unanswered[0]}); "
                f"every training question needs its answer (v2.0: or is_impossible)")
        return self._features("train", examples, tokenizer)

    def eval_sets(self, tokenizer) -> list[EvalSet]:
        examples, data = self.read("dev")
        return [EvalSet("dev", self._features("dev", examples, tokenizer), examples,
                        labeled=any(e.answers or e.is_impossible for e in examples),
                        extra={"data": data})]

    def objective(self, outputs, batch):
        return span_loss(outputs[0], outputs[1], batch)

    def keep(self, outputs, batch):
        return {"start_logits": outputs[0].astype(jnp.float32),
                "end_logits": outputs[1].astype(jnp.float32),
                "feature_index": batch["feature_index"],
                "example_weights": batch["example_weights"]}

    def predict(self, eval_set: EvalSet, kept):
        """kept rows -> (predictions, nbest, null_odds); rows may come in any order."""
        n = len(eval_set.features["feature_index"])
        order = np.argsort(kept["feature_index"], kind="stable")
        if len(order) != n:
            raise ValueError(f"{eval_set.name}: {len(order)} feature outputs for {n} features")
        return squad_postprocess.postprocess(
            eval_set.examples, eval_set.features, kept["start_logits"][order],
            kept["end_logits"][order], self.version_2, self.n_best_size,
            self.max_answer_length, self.null_score_diff_threshold)

    def score(self, eval_set: EvalSet, kept) -> dict[str, float]:
        if not eval_set.labeled:
            return {}
        predictions, _, null_odds = self.predict(eval_set, kept)
        data = readers.squad_dataset_of(eval_set.examples)
        out = squad_metrics.evaluate(data, predictions, self.version,
                                     na_probs=null_odds if self.version_2 else None,
                                     na_prob_thresh=float("inf"))
        return {k: float(v) for k, v in out.items()}

    def write_predictions(self, eval_set: EvalSet, kept, out_dir: str) -> list[str]:
        predictions, nbest, null_odds = self.predict(eval_set, kept)
        return squad_postprocess.write_outputs(out_dir, predictions, nbest, null_odds)
