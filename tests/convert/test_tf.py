"""Google's TF1 checkpoints: from-tf on checkpoints written by TF's own TF1 writer, to-tf
with the original names, bit-exact round trips, and errors raised before any tensor is read."""

import json
import os

import numpy as np
import pytest

from bert_jax.convert import hf, model_dir
from bert_jax.convert import tf as tfc
from bert_jax.convert.__main__ import main
from bert_jax.convert.tensors import ConversionError
from bert_jax.models.config import BertConfig
from tests.convert.helpers import (hf_state_to_tf, max_diff, run_encoder,
                                    write_tf1_checkpoint)

tf = pytest.importorskip("tensorflow")


def _flat(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flat(v, prefix + (k,))
        else:
            yield prefix + (k,), np.asarray(v)


def assert_trees_bit_equal(a, b):
    fa, fb = dict(_flat(a)), dict(_flat(b))
    assert sorted(fa) == sorted(fb)
    for k in fa:
        assert fa[k].dtype == fb[k].dtype and fa[k].shape == fb[k].shape, k
        assert np.array_equal(fa[k].view(np.uint32), fb[k].view(np.uint32)), k


def test_tf_and_hf_tables_cover_the_same_parameters():
    config = BertConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                        intermediate_size=96)
    tf_paths = sorted(p for _, p, _ in tfc.layout(config))
    hf_paths = sorted(p for _, p, _ in hf.BERT.rows(config, ""))
    assert tf_paths == hf_paths


def test_from_tf_matches_golden_outputs(minilm_tf1, minilm_golden, tmp_path, capsys):
    """Acceptance: a TF1 checkpoint with the original names (plus Adam slots and
    global_step) imports with from-tf and reproduces transformers' outputs."""
    names = dict(tf.train.list_variables(str(minilm_tf1 / "bert_model.ckpt")))
    assert "bert/encoder/layer_5/attention/self/query/kernel" in names
    assert "bert/embeddings/LayerNorm/gamma" in names and "global_step" in names
    out = str(tmp_path / "model")
    main(["from-tf", f"--checkpoint={minilm_tf1 / 'bert_model.ckpt'}",
          f"--config={minilm_tf1 / 'bert_config.json'}", f"--output={out}"])
    printed = capsys.readouterr().out
    assert "skipped 7 optimizer-state" in printed  # 3 x (adam_m, adam_v) + global_step
    assert "heads not in the source (left out): mlm, nsp" in printed
    params, config = model_dir.load_model_dir(out)
    assert set(params) == {"bert"}
    seq, pooled = run_encoder(params, config, minilm_golden)
    mask = minilm_golden["attention_mask"]
    assert max_diff(seq, minilm_golden["sequence_output"], mask) <= 1e-4
    assert max_diff(pooled, minilm_golden["pooled_output"]) <= 1e-4


def test_tf_reference_forward_matches_golden(minilm_tf1, minilm_golden):
    """The reference side of `verify tf:` is itself checked against transformers."""
    from bert_jax.convert import tf_reference

    config = tfc.read_config(str(minilm_tf1 / "bert_config.json"))
    reader = tf.train.load_checkpoint(str(minilm_tf1 / "bert_model.ckpt"))
    g = minilm_golden
    out = tf_reference.forward(reader.get_tensor, config, g["input_ids"], g["token_type_ids"],
                               g["attention_mask"])
    assert max_diff(out["sequence_output"], g["sequence_output"], g["attention_mask"]) <= 1e-4
    assert max_diff(out["pooled_output"], g["pooled_output"]) <= 1e-4


def test_to_tf_then_from_tf_is_bit_exact(minilm_tf1, minilm_state, tmp_path):
    src = str(tmp_path / "a")
    main(["from-tf", f"--checkpoint={minilm_tf1}", f"--output={src}"])  # dir + config found
    main(["to-tf", f"--checkpoint={src}", f"--output={tmp_path / 'tf'}"])
    prefix = str(tmp_path / "tf" / "bert_model.ckpt")
    # Exactly the original names (and nothing else), and TF finds the checkpoint by dir.
    written = dict(tf.train.list_variables(prefix))
    assert tf.train.latest_checkpoint(str(tmp_path / "tf")) == prefix
    original = hf_state_to_tf(minilm_state)
    assert sorted(written) == sorted(original)
    reader = tf.train.load_checkpoint(prefix)
    for name, value in original.items():
        assert np.array_equal(reader.get_tensor(name), value), name
    with open(tmp_path / "tf" / "bert_config.json") as f:
        cfg = json.load(f)
    with open(minilm_tf1 / "bert_config.json") as f:
        assert cfg == json.load(f)
    main(["from-tf", f"--checkpoint={prefix}", f"--output={tmp_path / 'b'}"])
    a, ca = model_dir.load_model_dir(src)
    b, cb = model_dir.load_model_dir(str(tmp_path / "b"))
    assert ca == cb
    assert_trees_bit_equal(a, b)


def test_pretraining_heads_round_trip(tiny, tmp_path):
    """MLM + NSP heads (cls/predictions/*, cls/seq_relationship/output_weights [2, H])
    import and reproduce transformers' BertForPreTraining logits; export bit-exact."""
    import jax

    from bert_jax.models.bert import BertForPreTraining

    hf_cfg, state, g = tiny
    arrays = hf_state_to_tf(state)
    assert arrays["cls/seq_relationship/output_weights"].shape == (2, 32)
    write_tf1_checkpoint(str(tmp_path / "bert_model.ckpt"), arrays)
    config = hf.config_from_hf(hf_cfg)
    config.to_json_file(tmp_path / "bert_config.json", original_only=True)
    main(["from-tf", f"--checkpoint={tmp_path / 'bert_model.ckpt'}",
          f"--config={tmp_path / 'bert_config.json'}", f"--output={tmp_path / 'm'}"])
    params, config = model_dir.load_model_dir(str(tmp_path / "m"))
    assert set(params) == {"bert", "mlm", "nsp"}
    mlm, nsp = jax.jit(lambda p: BertForPreTraining(config).apply(
        {"params": p}, g["input_ids"], g["attention_mask"], g["token_type_ids"]))(params)
    assert max_diff(mlm, g["prediction_logits"], g["attention_mask"]) <= 1e-4
    assert max_diff(nsp, g["seq_relationship_logits"]) <= 1e-5
    out = tfc.params_to_tf(params, config)
    assert sorted(out) == sorted(arrays)
    for k in arrays:
        assert np.array_equal(out[k], arrays[k]), k


def test_other_model_size_fails_before_reading_tensors(minilm_tf1, monkeypatch):
    def no_read(*a, **k):
        raise AssertionError("a tensor was read before the shapes were checked")

    monkeypatch.setattr(tf.train, "load_checkpoint", no_read)
    prefix = str(minilm_tf1 / "bert_model.ckpt")
    base = tfc.read_config(str(minilm_tf1 / "bert_config.json"))
    with pytest.raises(ConversionError) as e:
        tfc.read_checkpoint(prefix, base.replace(hidden_size=768, intermediate_size=3072))
    msg = str(e.value)
    assert "bert/embeddings/word_embeddings: shape (30522, 384) in the checkpoint, " \
           "(30522, 768) expected" in msg
    assert "bert/encoder/layer_0/intermediate/dense/kernel: shape (384, 1536)" in msg
    with pytest.raises(ConversionError, match=r"96 encoder tensor\(s\) missing"):
        tfc.read_checkpoint(prefix, base.replace(num_hidden_layers=12))
    with pytest.raises(ConversionError, match="layer_6/attention/self/query/kernel"):
        tfc.read_checkpoint(prefix, base.replace(num_hidden_layers=7))


def test_incomplete_head_and_unexpected_variables(tiny, tmp_path):
    hf_cfg, state, _ = tiny
    config = hf.config_from_hf(hf_cfg)
    arrays = hf_state_to_tf(state)
    arrays["bert/some/extra"] = np.zeros(3, np.float32)
    del arrays["cls/predictions/transform/LayerNorm/beta"]
    write_tf1_checkpoint(str(tmp_path / "x.ckpt"), arrays, optimizer_slots=False)
    with pytest.raises(ConversionError, match=r"head 'mlm' is incomplete: "
                                              r"\['cls/predictions/transform/LayerNorm/beta'\]"):
        tfc.read_checkpoint(str(tmp_path / "x.ckpt"), config)
    arrays = hf_state_to_tf(state)
    arrays["bert/some/extra"] = np.zeros(3, np.float32)
    write_tf1_checkpoint(str(tmp_path / "y.ckpt"), arrays, optimizer_slots=False)
    _, report = tfc.read_checkpoint(str(tmp_path / "y.ckpt"), config)
    assert report.unexpected == ["bert/some/extra"] and report.heads == ["mlm", "nsp"]


def test_cli_refuses_wrong_vocab_and_existing_output(minilm_tf1, minilm_dir, tmp_path):
    vocab = tmp_path / "vocab.txt"
    with open(os.path.join(minilm_dir, "vocab.txt")) as f:
        vocab.write_text("".join(f.readlines()[:1000]))
    with pytest.raises(SystemExit, match="has 1000 tokens but .* vocab_size=30522"):
        main(["from-tf", f"--checkpoint={minilm_tf1}", f"--vocab_file={vocab}",
              f"--output={tmp_path / 'out'}"])
    assert not os.path.exists(tmp_path / "out")
    (tmp_path / "taken").mkdir()
    with pytest.raises(SystemExit, match="already exists"):
        main(["from-tf", f"--checkpoint={minilm_tf1}", f"--output={tmp_path / 'taken'}"])
    with pytest.raises(SystemExit, match="nope.json not found; pass --config"):
        main(["from-tf", f"--checkpoint={minilm_tf1}", f"--config={tmp_path / 'nope.json'}",
              f"--output={tmp_path / 'o1'}"])
    with pytest.raises(SystemExit, match="bert_model.ckpt.index not found"):
        main(["from-tf", f"--checkpoint={tmp_path / 'bert_model.ckpt'}",
              f"--config={minilm_tf1 / 'bert_config.json'}", f"--output={tmp_path / 'o2'}"])


def test_verify_against_tf_reference(minilm_model_dir, tmp_path, capsys):
    main(["to-tf", f"--checkpoint={minilm_model_dir}", f"--output={tmp_path / 'tf'}"])
    capsys.readouterr()
    main(["verify", f"--checkpoint={minilm_model_dir}",
          f"--reference=tf:{tmp_path / 'tf' / 'bert_model.ckpt'}"])
    printed = capsys.readouterr().out
    diffs = {line.split()[4]: float(line.split()[5]) for line in printed.splitlines()
             if line.startswith("max |ours")}
    assert set(diffs) == {"sequence_output", "pooled_output"}
    assert max(diffs.values()) <= 1e-4 and "OK: largest difference" in printed


def test_pre_ln_has_no_tf_form():
    config = BertConfig(num_hidden_layers=1, hidden_size=8, num_attention_heads=2,
                        intermediate_size=8, pre_ln=True)
    with pytest.raises(ConversionError, match="pre-LN"):
        tfc.config_to_tf(config)


def test_fine_tuned_heads_of_the_original_scripts(tiny, tmp_path):
    """run_classifier.py's output_weights [labels, H] and run_squad.py's
    cls/squad/output_weights [2, H] map to our classifier / qa_outputs heads and back."""
    hf_cfg, state, _ = tiny
    config = hf.config_from_hf(hf_cfg)
    rng = np.random.default_rng(1)
    arrays = {k: v for k, v in hf_state_to_tf(state).items() if k.startswith("bert/")}
    arrays.update({
        "output_weights": rng.normal(size=(3, 32)).astype(np.float32),
        "output_bias": rng.normal(size=(3,)).astype(np.float32),
        "cls/squad/output_weights": rng.normal(size=(2, 32)).astype(np.float32),
        "cls/squad/output_bias": rng.normal(size=(2,)).astype(np.float32),
    })
    write_tf1_checkpoint(str(tmp_path / "ft.ckpt"), arrays)
    params, report = tfc.read_checkpoint(str(tmp_path / "ft.ckpt"), config)
    assert report.heads == ["classifier", "qa_outputs"]
    assert report.missing_heads == ["mlm", "nsp"]
    assert np.array_equal(params["classifier"]["dense"]["kernel"], arrays["output_weights"].T)
    assert params["qa_outputs"]["dense"]["kernel"].shape == (32, 2)
    back = tfc.params_to_tf(params, config)
    assert sorted(back) == sorted(arrays)
    assert all(np.array_equal(back[k], arrays[k]) for k in arrays)
