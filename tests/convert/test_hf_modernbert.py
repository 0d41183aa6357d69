"""ModernBERT: transformers' ModernBertForMaskedLM (random, tiny: global and sliding-window
layers, a padded batch longer than the window; tests/goldens/make_modernbert_goldens.py)
loaded into bert_jax gives its hidden states and MLM logits; from-hf / to-hf round trips;
the scanned stack and packed rows. The transformers side of the export is a slow test."""

import json
import os

import flax
import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bert_jax.convert import hf_files, hf_modernbert
from bert_jax.convert.__main__ import main
from bert_jax.convert.tensors import ConversionError
from bert_jax.models import BertForPreTraining, BertModel
from bert_jax.models.params import stack_layers, unstack_layers
from tests.convert.helpers import GOLDENS

ATOL = 1e-4


@pytest.fixture(scope="module")
def golden():
    with np.load(os.path.join(GOLDENS, "modernbert_tiny.npz")) as g:
        g = {k: g[k] for k in g.files}
    g["hf_config"] = json.loads(str(g.pop("config")))
    g["state"] = {k[len("state/"):]: g.pop(k) for k in list(g) if k.startswith("state/")}
    return g


@pytest.fixture(scope="module")
def hf_dir(golden, tmp_path_factory):
    path = tmp_path_factory.mktemp("modernbert") / "hf"
    os.makedirs(path)
    with open(path / "config.json", "w") as f:
        json.dump(golden["hf_config"], f)
    save_file(golden["state"], str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path)


@pytest.fixture(scope="module")
def imported(hf_dir):
    return hf_files.read_hf_dir(hf_dir)


def _real(x, golden):
    return np.asarray(x)[golden["attention_mask"].astype(bool)]


def _outputs(params, config, golden):
    ids, mask = golden["input_ids"], golden["attention_mask"]
    hidden, pooled = jax.jit(BertModel(config).apply)({"params": params["bert"]}, ids, mask)
    logits, nsp = jax.jit(BertForPreTraining(config, nsp=False).apply)(
        {"params": params}, ids, mask)
    assert nsp is None
    np.testing.assert_array_equal(pooled, np.asarray(hidden)[:, 0])  # no pooler
    return hidden, logits


def test_config_is_modernbert(imported):
    _, config, report, _ = imported
    assert (config.position_embedding, config.ffn_type, config.pre_ln) == ("rotary", "geglu",
                                                                           True)
    assert not (config.use_bias or config.norm_bias or config.layer0_attention_norm
                or config.pooler or config.type_vocab_size)
    assert (config.global_attn_every_n_layers, config.local_attention) == (3, 8)
    assert (config.rope_theta, config.local_rope_theta) == (160_000.0, 10_000.0)
    assert config.layer_norm_eps == 1e-5
    assert [config.layer_window(i) for i in range(4)] == [0, 4, 4, 0]
    assert report.heads == ["mlm"] and report.unexpected == []


def test_hidden_states_and_mlm_logits_match_transformers(imported, golden):
    params, config, _, _ = imported
    hidden, logits = _outputs(params, config, golden)
    assert np.abs(_real(hidden, golden) - _real(golden["last_hidden_state"], golden)).max() <= ATOL
    assert np.abs(_real(logits, golden) - _real(golden["logits"], golden)).max() <= ATOL


def test_the_window_matters(imported, golden):
    """The goldens tell local layers from global ones: every layer global is far off."""
    params, config, _, _ = imported
    wide = config.replace(local_attention=2 * golden["input_ids"].shape[1])
    hidden, _ = _outputs(params, wide, golden)
    assert np.abs(_real(hidden, golden) - _real(golden["last_hidden_state"], golden)).max() > 1e-2


def test_scanned_stack_matches(imported, golden):
    """nn.scan over local and global layers (each step gets its index) with layer 0 kept
    apart (it has no attention LayerNorm); stack / unstack round trip."""
    params, config, _, _ = imported
    stacked = stack_layers({"bert": params["bert"]}, config.num_hidden_layers)
    enc = stacked["bert"]["encoder"]
    assert sorted(enc) == ["final_norm", "layer_0", "layers"]
    assert enc["layers"]["output"]["kernel"].shape[0] == config.num_hidden_layers - 1
    scanned = config.replace(scan_layers=True)
    shapes = jax.eval_shape(BertModel(scanned).init, jax.random.PRNGKey(0),
                            golden["input_ids"][:1, :4])["params"]
    assert (jax.tree_util.tree_structure(flax.linen.meta.unbox(shapes))
            == jax.tree_util.tree_structure(stacked["bert"]))
    hidden, _ = jax.jit(BertModel(scanned).apply)(
        {"params": stacked["bert"]}, golden["input_ids"], golden["attention_mask"])
    assert np.abs(_real(hidden, golden) - _real(golden["last_hidden_state"], golden)).max() <= ATOL
    back = unstack_layers(stacked, config.num_hidden_layers)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params["bert"])):
        np.testing.assert_array_equal(a, b)


def test_packed_rows_restart_rotary_positions(imported, golden):
    """Two sequences packed in one row each get the outputs they get alone in a (padded)
    row of their own: rotary positions restart at each sequence, windows never cross it."""
    params, config, _, _ = imported
    a, b = golden["input_ids"][1, :18], golden["input_ids"][2, :22]
    row = np.concatenate([a, b, np.zeros(4, np.int32)])[None]
    seq = np.array([[1] * 18 + [2] * 22 + [0] * 4])
    apply = jax.jit(BertModel(config).apply)
    packed, _ = apply({"params": params["bert"]}, row, sequence_ids=seq)
    alone = np.zeros((2, row.shape[1]), np.int32)
    alone[0, :18], alone[1, :22] = a, b
    single, _ = apply({"params": params["bert"]}, alone, (alone > 0).astype(np.int32))
    assert np.abs(np.asarray(packed[0, :18]) - np.asarray(single[0, :18])).max() <= 1e-5
    assert np.abs(np.asarray(packed[0, 18:40]) - np.asarray(single[1, :22])).max() <= 1e-5


def test_to_hf_round_trips_bit_exact(imported, golden, tmp_path):
    params, config, _, _ = imported
    out = hf_files.write_hf_dir(str(tmp_path / "out"), params, config)
    written = load_file(os.path.join(out, "model.safetensors"))
    assert sorted(written) == sorted(list(golden["state"]) + ["decoder.weight"])
    for k, v in golden["state"].items():
        np.testing.assert_array_equal(written[k], v, err_msg=k)
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    for k in ("model_type", "vocab_size", "hidden_size", "intermediate_size",
              "num_hidden_layers", "num_attention_heads", "layer_types", "local_attention",
              "rope_parameters", "norm_eps", "norm_bias", "attention_bias", "mlp_bias",
              "hidden_activation", "max_position_embeddings"):
        assert cfg[k] == golden["hf_config"][k], k
    assert cfg["architectures"] == ["ModernBertForMaskedLM"]
    assert hf_modernbert.config_from_hf(cfg) == config
    # The encoder alone: ModernBertModel, names without the "model." prefix.
    bare = hf_files.write_hf_dir(str(tmp_path / "bare"), {"bert": params["bert"]}, config)
    names = load_file(os.path.join(bare, "model.safetensors"))
    assert "embeddings.tok_embeddings.weight" in names and "decoder.bias" not in names
    again, _, report, _ = hf_files.read_hf_dir(bare)
    assert report.missing_heads == ["mlm", "nsp"]
    np.testing.assert_array_equal(again["bert"]["encoder"]["layer_1"]["gate"]["kernel"],
                                  params["bert"]["encoder"]["layer_1"]["gate"]["kernel"])


def test_from_hf_and_to_hf_commands(hf_dir, golden, tmp_path, capsys):
    main(["from-hf", f"--input={hf_dir}", f"--output={tmp_path / 'ours'}"])
    main(["to-hf", f"--checkpoint={tmp_path / 'ours'}", f"--output={tmp_path / 'back'}"])
    assert "ModernBertForMaskedLM" in capsys.readouterr().out
    written = load_file(str(tmp_path / "back" / "model.safetensors"))
    for k, v in golden["state"].items():
        np.testing.assert_array_equal(written[k], v, err_msg=k)


def test_unsupported_hf_configs_are_named(golden):
    cfg = golden["hf_config"]
    with pytest.raises(ConversionError, match="layer_types"):
        hf_modernbert.config_from_hf(dict(cfg, layer_types=["full_attention",
                                                             "sliding_attention",
                                                             "full_attention",
                                                             "sliding_attention"][::-1]))
    with pytest.raises(ConversionError, match="mlp_bias"):
        hf_modernbert.config_from_hf(dict(cfg, mlp_bias=True))
    with pytest.raises(ConversionError, match="rope_type"):
        rope = {k: dict(v, rope_type="linear") for k, v in cfg["rope_parameters"].items()}
        hf_modernbert.config_from_hf(dict(cfg, rope_parameters=rope))


def test_a_half_modern_config_is_not_exported(imported, tmp_path):
    params, config, _, _ = imported
    with pytest.raises(ConversionError, match="pooler=True"):
        hf_files.write_hf_dir(str(tmp_path / "x"), params, config.replace(pooler=True))


@pytest.mark.slow
def test_transformers_loads_our_export(hf_dir, tmp_path, capsys):
    """to-hf output loads in transformers' ModernBertForMaskedLM and gives our outputs
    (verify runs transformers in its own process), as the original files do."""
    for mod in ("torch", "transformers"):
        pytest.importorskip(mod, reason="the reference side needs PyTorch and transformers")
    ours = str(tmp_path / "ours")
    main(["from-hf", f"--input={hf_dir}", f"--output={ours}"])
    main(["to-hf", f"--checkpoint={ours}", f"--output={tmp_path / 'hf'}"])
    for ref in (str(tmp_path / "hf"), hf_dir):
        capsys.readouterr()
        main(["verify", f"--checkpoint={ours}", f"--reference=hf:{ref}"])
        printed = capsys.readouterr().out
        diffs = {line.split()[4]: float(line.split()[5]) for line in printed.splitlines()
                 if line.startswith("max |ours")}
        assert set(diffs) == {"sequence_output", "mlm_logits"}, printed
        assert max(diffs.values()) <= ATOL, (ref, diffs)
