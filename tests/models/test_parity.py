"""Parity with Hugging Face transformers' PyTorch BERT (goldens made by
tests/goldens/make_goldens.py; the suite itself needs no torch)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from bert_jax.convert.hf import config_from_hf, hf_to_params
from bert_jax.models import BertForPreTraining, BertModel
from bert_jax.models.heads import gather_positions
from bert_jax.tasks.pretraining.loss import pretraining_loss
from tests.conftest import GOLDENS


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    config = config_from_hf(json.loads((minilm_dir / "config.json").read_text()))
    params, report = hf_to_params(load_file(minilm_dir / "model.safetensors"), config)
    assert report["missing_heads"] == ["mlm", "nsp"]  # a BertModel checkpoint: encoder only
    return config, params


def test_minilm_matches_transformers(minilm):
    config, params = minilm
    golden = np.load(GOLDENS / "minilm_outputs.npz")
    assert golden["input_ids"].shape[0] >= 8
    assert (golden["token_type_ids"].max(axis=1) == 1).sum() >= 4  # sentence pairs
    assert (golden["attention_mask"] == 0).any()  # padding
    sequence, pooled = jax.jit(BertModel(config).apply)(
        {"params": params["bert"]}, golden["input_ids"], golden["attention_mask"],
        golden["token_type_ids"])
    real = golden["attention_mask"].astype(bool)
    seq_diff = np.abs(np.asarray(sequence) - golden["sequence_output"])[real].max()
    pooled_diff = np.abs(np.asarray(pooled) - golden["pooled_output"]).max()
    assert seq_diff <= 1e-4, seq_diff
    assert pooled_diff <= 1e-4, pooled_diff
    # At padded positions too: HF and we both attend only to real keys.
    assert np.abs(np.asarray(sequence) - golden["sequence_output"]).max() <= 1e-4


@pytest.fixture(scope="module")
def tiny_golden():
    golden = np.load(GOLDENS / "tiny_pretraining.npz")
    state = {k[len("state/"):]: golden[k] for k in golden.files if k.startswith("state/")}
    config = config_from_hf(json.loads(str(golden["config"])))
    params, report = hf_to_params(state, config)
    assert report["heads"] == ["mlm", "nsp"] and not report["unexpected"]
    return golden, config, params


def test_pretraining_heads_and_losses_match_transformers(tiny_golden):
    golden, config, params = tiny_golden
    model = BertForPreTraining(config)
    mlm_logits, nsp_logits = model.apply(
        {"params": params}, golden["input_ids"], golden["attention_mask"],
        golden["token_type_ids"], masked_lm_positions=golden["masked_lm_positions"])
    want_mlm = np.take_along_axis(golden["prediction_logits"],
                                  golden["masked_lm_positions"][..., None], axis=1)
    np.testing.assert_allclose(mlm_logits, want_mlm, atol=1e-4, rtol=0)
    np.testing.assert_allclose(nsp_logits, golden["seq_relationship_logits"], atol=1e-4, rtol=0)
    batch = {k: golden[k] for k in ("masked_lm_ids", "masked_lm_weights", "next_sentence_labels")}
    loss, metrics = pretraining_loss(mlm_logits, nsp_logits, batch)
    np.testing.assert_allclose(metrics["mlm_loss"], golden["mlm_loss"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(metrics["nsp_loss"], golden["nsp_loss"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(loss, golden["total_loss"], atol=1e-4, rtol=0)


def test_gather_first_equals_gather_after(tiny_golden):
    golden, config, params = tiny_golden
    model = BertForPreTraining(config)
    args = (golden["input_ids"], golden["attention_mask"], golden["token_type_ids"])
    gathered, _ = model.apply({"params": params}, *args,
                              masked_lm_positions=golden["masked_lm_positions"])
    everywhere, _ = model.apply({"params": params}, *args, masked_lm_positions=None)
    assert everywhere.shape == golden["prediction_logits"].shape
    np.testing.assert_allclose(everywhere, golden["prediction_logits"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(
        gathered, gather_positions(everywhere, jnp.asarray(golden["masked_lm_positions"])),
        atol=1e-6, rtol=0)
