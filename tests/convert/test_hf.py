"""Hugging Face directories: from-hf (heads carried, missing ones reported), to-hf
bit-exact against the original files, and transformers loading our output (slow, torch)."""

import builtins
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from bert_jax.convert import hf_files, model_dir
from bert_jax.convert.__main__ import main
from bert_jax.convert.tensors import ConversionError
from tests.convert.helpers import max_diff, run_encoder, save_hf_dir


def test_from_hf_minilm_reports_missing_heads_and_matches_golden(minilm_dir, minilm_golden):
    params, config, report, vocab = hf_files.read_hf_dir(minilm_dir)
    assert set(params) == {"bert"}
    assert report.heads == [] and report.missing_heads == ["mlm", "nsp"]
    assert report.unexpected == [] and report.skipped == ["embeddings.position_ids"]
    assert vocab == os.path.join(minilm_dir, "vocab.txt")
    seq, pooled = run_encoder(params, config, minilm_golden)
    assert max_diff(seq, minilm_golden["sequence_output"], minilm_golden["attention_mask"]) <= 1e-4
    assert max_diff(pooled, minilm_golden["pooled_output"]) <= 1e-4


def test_to_hf_reproduces_the_original_files_bit_exact(minilm_dir, minilm_state,
                                                       minilm_model_dir, tmp_path):
    """The non-torch golden of to-hf: every tensor transformers would load is the
    original file's tensor, bit for bit, under BertForPreTraining's name."""
    out = str(tmp_path / "hf")
    main(["to-hf", f"--checkpoint={minilm_model_dir}", f"--output={out}"])
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors",
                                       "special_tokens_map.json", "tokenizer_config.json",
                                       "vocab.txt"]
    written = load_file(os.path.join(out, "model.safetensors"))
    expected = {"bert." + k: v for k, v in minilm_state.items() if k != "embeddings.position_ids"}
    assert sorted(written) == sorted(expected)
    for k, v in expected.items():
        assert written[k].dtype == v.dtype and np.array_equal(written[k], v), k
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(minilm_dir, "config.json")) as f:
        orig = json.load(f)
    assert cfg["architectures"] == ["BertModel"] and cfg["model_type"] == "bert"
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "vocab_size", "max_position_embeddings", "type_vocab_size", "hidden_act",
              "layer_norm_eps"):
        assert cfg[k] == orig[k], k
    # ... and back: from-hf of our own output is bit-exact.
    back, _, _, _ = hf_files.read_hf_dir(out)
    ours, _ = model_dir.load_model_dir(minilm_model_dir)
    for (pa, a), (pb, b) in zip(sorted(_flat(ours)), sorted(_flat(back))):
        assert pa == pb and np.array_equal(a, b), pa


def _flat(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flat(v, prefix + (k,))
        else:
            yield prefix + (k,), np.asarray(v)


def test_heads_come_along_and_round_trip(tiny, tmp_path):
    import jax

    from bert_jax.models.bert import BertForPreTraining

    hf_cfg, state, g = tiny
    src = save_hf_dir(tmp_path / "src", hf_cfg, state)
    main(["from-hf", f"--input={src}", f"--output={tmp_path / 'm'}"])
    params, config = model_dir.load_model_dir(str(tmp_path / "m"))
    assert set(params) == {"bert", "mlm", "nsp"}
    mlm, nsp = jax.jit(lambda p: BertForPreTraining(config).apply(
        {"params": p}, g["input_ids"], g["attention_mask"], g["token_type_ids"]))(params)
    assert max_diff(mlm, g["prediction_logits"], g["attention_mask"]) <= 1e-4
    assert max_diff(nsp, g["seq_relationship_logits"]) <= 1e-5
    main(["to-hf", f"--checkpoint={tmp_path / 'm'}", f"--output={tmp_path / 'out'}"])
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    expected = {k: v for k, v in state.items() if not k.endswith("position_ids")}
    assert sorted(written) == sorted(expected)  # decoder weight/bias (tied) included
    for k, v in expected.items():
        assert np.array_equal(written[k], v), k
    with open(tmp_path / "out" / "config.json") as f:
        assert json.load(f)["architectures"] == ["BertForPreTraining"]


def test_exports_to_a_bucket_equal_local_exports(tiny, tmp_path, monkeypatch, own_tempdir):
    """to-hf and to-tf with a gs:// --output (the fake bucket of tests/test_paths.py): staged
    in a local folder and uploaded, byte for byte the local exports; no ./gs:/ folder, no
    staging left behind (in this test's own temp folder: other processes write to the
    system's meanwhile), and an existing output is refused."""
    from tests.test_paths import fake_gcs

    hf_cfg, state, _ = tiny
    src = save_hf_dir(tmp_path / "src", hf_cfg, state)
    main(["from-hf", f"--input={src}", f"--output={tmp_path / 'm'}"])
    monkeypatch.chdir(tmp_path)  # a URI taken for a local path would land here
    root = tmp_path / "bucket_root"
    root.mkdir()
    for command in ("to-hf", "to-tf"):
        main([command, f"--checkpoint={tmp_path / 'm'}", f"--output={tmp_path / command}"])
        with fake_gcs(str(root)):
            main([command, f"--checkpoint={tmp_path / 'm'}", f"--output=gs://b/{command}"])
            with pytest.raises(SystemExit, match=f"gs://b/{command} already exists"):
                main([command, f"--checkpoint={tmp_path / 'm'}", f"--output=gs://b/{command}"])
        local = sorted(p.relative_to(tmp_path / command)
                       for p in (tmp_path / command).rglob("*") if p.is_file())
        remote = sorted(p.relative_to(root / "b" / command)
                        for p in (root / "b" / command).rglob("*") if p.is_file())
        assert remote == local and len(local) >= 2, (remote, local)
        for rel in local:
            assert (root / "b" / command / rel).read_bytes() == (
                tmp_path / command / rel).read_bytes(), rel
    assert sorted(os.listdir(root / "b")) == ["to-hf", "to-tf"]  # no .tmp left
    assert not (tmp_path / "gs:").exists()
    assert os.listdir(own_tempdir) == []


def test_errors_name_the_tensor_and_both_shapes(tiny, tmp_path):
    hf_cfg, state, _ = tiny
    bad = dict(state)
    bad["bert.encoder.layer.1.intermediate.dense.weight"] = np.zeros((36, 32), np.float32)
    src = save_hf_dir(tmp_path / "bad", hf_cfg, bad)
    with pytest.raises(ConversionError, match=r"bert.encoder.layer.1.intermediate.dense.weight: "
                                              r"shape \(36, 32\) in the checkpoint, \(37, 32\)"):
        hf_files.read_hf_dir(src)
    missing = {k: v for k, v in state.items() if "layer.1.output" not in k}
    src = save_hf_dir(tmp_path / "missing", hf_cfg, missing)
    with pytest.raises(ConversionError, match=r"4 encoder tensor\(s\) missing"):
        hf_files.read_hf_dir(src)
    (tmp_path / "empty").mkdir()
    with open(tmp_path / "empty" / "config.json", "w") as f:
        json.dump(hf_cfg, f)
    with pytest.raises(FileNotFoundError, match="no weights found; expected model.safetensors"):
        hf_files.read_hf_dir(str(tmp_path / "empty"))


def test_pytorch_bin_without_torch_says_so(tiny, tmp_path, monkeypatch):
    hf_cfg, _, _ = tiny
    d = tmp_path / "bin"
    d.mkdir()
    (d / "pytorch_model.bin").write_bytes(b"not read")
    with open(d / "config.json", "w") as f:
        json.dump(hf_cfg, f)
    real_import = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(SystemExit, match="needs PyTorch to read pytorch_model.bin"):
        main(["from-hf", f"--input={d}", f"--output={tmp_path / 'o'}"])


def test_verify_hf_without_torch_says_so(minilm_dir, minilm_model_dir, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torch", "transformers")
                        else real_find_spec(name, *a))
    with pytest.raises(SystemExit, match="needs PyTorch and transformers"):
        main(["verify", f"--checkpoint={minilm_model_dir}", f"--reference=hf:{minilm_dir}"])


def _verify(capsys, *args):
    capsys.readouterr()
    main(["verify", *args])
    printed = capsys.readouterr().out
    return {line.split()[4]: float(line.split()[5]) for line in printed.splitlines()
            if line.startswith("max |ours")}


@pytest.mark.slow
def test_transformers_loads_to_hf_output(tiny, minilm_dir, minilm_model_dir, tmp_path, capsys):
    """to-hf output through transformers' BertModel (MiniLM) and BertForPreTraining (tiny,
    both heads) gives our outputs. The torch side runs in its own process (verify's
    hf_reference), since torch and TensorFlow cannot share one."""
    for mod in ("torch", "transformers"):
        pytest.importorskip(mod, reason="the reference side needs PyTorch and transformers")
    out = str(tmp_path / "minilm_hf")
    main(["to-hf", f"--checkpoint={minilm_model_dir}", f"--output={out}"])
    for ref in (out, minilm_dir):  # our export, and the original files
        diffs = _verify(capsys, f"--checkpoint={minilm_model_dir}", f"--reference=hf:{ref}")
        assert set(diffs) == {"sequence_output", "pooled_output"}
        assert max(diffs.values()) <= 1e-4, (ref, diffs)

    hf_cfg, state, _ = tiny
    src = save_hf_dir(tmp_path / "tiny_src", hf_cfg, state)
    main(["from-hf", f"--input={src}", f"--output={tmp_path / 'tiny'}"])
    main(["to-hf", f"--checkpoint={tmp_path / 'tiny'}", f"--output={tmp_path / 'tiny_hf'}"])
    diffs = _verify(capsys, f"--checkpoint={tmp_path / 'tiny'}",
                    f"--reference=hf:{tmp_path / 'tiny_hf'}")
    assert set(diffs) == {"sequence_output", "pooled_output", "mlm_logits", "nsp_logits"}
    assert max(diffs.values()) <= 1e-4, diffs


def test_pytorch_bin_reads_like_safetensors(tiny, tmp_path):
    torch = pytest.importorskip("torch", reason="writing a pytorch_model.bin needs PyTorch")
    hf_cfg, state, _ = tiny
    d = tmp_path / "bin"
    d.mkdir()
    torch.save({k: torch.tensor(v) for k, v in state.items()}, d / "pytorch_model.bin")
    with open(d / "config.json", "w") as f:
        json.dump(hf_cfg, f)
    from_bin, _, report, _ = hf_files.read_hf_dir(str(d))
    from_st, _, _, _ = hf_files.read_hf_dir(save_hf_dir(tmp_path / "st", hf_cfg, state))
    assert report.heads == ["mlm", "nsp"]
    for (pa, a), (pb, b) in zip(sorted(_flat(from_bin)), sorted(_flat(from_st))):
        assert pa == pb and np.array_equal(a, b), pa


def test_half_precision_weights_are_cast_and_reported(tiny, tmp_path):
    hf_cfg, state, _ = tiny
    half = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in state.items()}
    params, _, report, _ = hf_files.read_hf_dir(save_hf_dir(tmp_path / "h", hf_cfg, half))
    leaves = dict(_flat(params))
    assert all(v.dtype == np.float32 for v in leaves.values())
    assert len(report.cast) == len(leaves) and "from float16 to float32" in report.summary()
    w = leaves[("bert", "embeddings", "word_embeddings", "embedding")]
    assert np.array_equal(w, state["bert.embeddings.word_embeddings.weight"].astype(np.float16)
                          .astype(np.float32))
