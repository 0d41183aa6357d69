import json

import pytest

from bert_jax.models import BertConfig, ConfigError
from bert_jax.models.config import ORIGINAL_KEYS, from_config_dict, model_config

# Google's released BERT-Base uncased bert_config.json, verbatim.
ORIGINAL_BASE = {
    "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 12,
    "type_vocab_size": 2, "vocab_size": 30522,
}


def test_reads_and_writes_original_format(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(ORIGINAL_BASE))
    config = BertConfig.from_json_file(path)
    assert config == BertConfig()  # our defaults are BERT-Base
    out = tmp_path / "out.json"
    config.to_json_file(out, original_only=True)
    assert json.loads(out.read_text()) == ORIGINAL_BASE
    full = json.loads(config.to_json_string())
    # dtype "auto" (the default) is left out: see test_auto_dtype_is_left_out_of_the_json
    assert set(full) == set(ORIGINAL_KEYS) | {"layer_norm_eps", "pre_ln", "param_dtype", "fp8",
                                              "remat", "scan_layers", "scan_unroll",
                                              "dropout_rng",
                                              "attention", "fused_qkv", "pallas_block_q",
                                              "pallas_block_k", "pallas_bwd_block_q",
                                              "pallas_bwd_block_k", "pallas_num_warps",
                                              "pallas_num_stages", "pallas_bwd_num_warps",
                                              "pallas_bwd_num_stages", "gelu_backward",
                                              "residual_norm",
                                              "position_embedding",
                                              "rope_theta", "local_rope_theta", "ffn_type",
                                              "use_bias", "norm_bias", "layer0_attention_norm",
                                              "pooler", "global_attn_every_n_layers",
                                              "local_attention", "init_scheme"}
    assert BertConfig.from_dict(full) == config


def test_unknown_key_is_named(tmp_path):
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({**ORIGINAL_BASE, "hiden_size": 3}))
    with pytest.raises(ConfigError, match=r"bert_config.json.*'hiden_size'"):
        BertConfig.from_json_file(path)


@pytest.mark.parametrize("change, message", [
    (dict(hidden_size=100, num_attention_heads=12), "not divisible"),
    (dict(num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
    (dict(vocab_size=-5), "vocab_size"),
    (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob"),
    (dict(hidden_act="swish2"), "hidden_act"),
    (dict(remat="sometimes"), "remat"),
    (dict(attention="flash"), "attention"),
    (dict(dtype="float8"), "dtype"),
    (dict(param_dtype="auto"), "param_dtype"),
    (dict(fp8=1), "fp8 must be true or false"),
    (dict(fp8=True, fused_qkv=True), "set fused_qkv=False"),
    (dict(position_embedding="alibi"), "position_embedding"),
    (dict(position_embedding="rotary", hidden_size=96, num_attention_heads=32), "even head"),
    (dict(rope_theta=0.5), "rope_theta must be a number > 1"),
    (dict(ffn_type="glu"), "ffn_type"),
    (dict(ffn_type="geglu", hidden_act="relu"), "gates with gelu"),
    (dict(ffn_type="swiglu"), "gates with silu"),
    (dict(use_bias=1), "use_bias must be true or false"),
    (dict(layer0_attention_norm=False), "needs pre_ln=True"),
    (dict(global_attn_every_n_layers=3), "needs local_attention >= 2"),
    (dict(local_attention=128), "no layer is local"),
    (dict(global_attn_every_n_layers=-1), "global_attn_every_n_layers must be an integer"),
    (dict(type_vocab_size=-1), "type_vocab_size must be an integer >= 0"),
])
def test_validation(change, message):
    with pytest.raises(ConfigError, match=message):
        BertConfig(**change)


def test_bad_json_names_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="broken.json"):
        BertConfig.from_json_file(path)


def test_model_config_section():
    section = model_config(hidden_size=128, num_attention_heads=2)
    section.lock()
    assert from_config_dict(section) == BertConfig(hidden_size=128, num_attention_heads=2)
    with pytest.raises(AttributeError):
        section.hiddden_size = 3
    with pytest.raises(ConfigError, match="'hiddn'"):
        model_config(hiddn=3)


def test_layer_windows():
    c = BertConfig(num_hidden_layers=7, global_attn_every_n_layers=3, local_attention=128)
    assert [c.layer_window(i) for i in range(7)] == [0, 64, 64, 0, 64, 64, 0]
    assert BertConfig().layer_window(1) == 0


def test_auto_dtype_resolves_by_platform():
    """model.dtype=auto computes bfloat16 where the step compiles for a GPU or TPU and float32
    on CPU (tests/test_auto_dtype.py checks it on compiled steps); a named dtype is itself."""
    auto = BertConfig()
    assert auto.dtype == "auto" and auto.param_dtype == "float32"
    assert [auto.dtype_for(p) for p in ("gpu", "tpu", "cpu")] == ["bfloat16", "bfloat16",
                                                                 "float32"]
    for dtype in ("float32", "bfloat16", "float16"):
        assert {BertConfig(dtype=dtype).dtype_for(p) for p in ("gpu", "tpu", "cpu")} == {dtype}
    assert auto.describe_compute("tpu") == ("compute bfloat16 (model.dtype=auto), params "
                                            "float32")
    assert BertConfig(dtype="float32", fp8=True).describe_compute("gpu") == (
        "compute float32 (model.dtype=float32), params float32, FP8 products (model.fp8)")


def test_auto_dtype_is_left_out_of_the_json(tmp_path):
    """A bert_config.json of model.dtype=auto has no "dtype" key (read back as auto), so that
    transformers, which reads "dtype" as a torch dtype's name, reads it too; a named dtype
    is written as before."""
    path = tmp_path / "bert_config.json"
    BertConfig(hidden_size=64, num_attention_heads=2).to_json_file(path)
    assert "dtype" not in json.loads(path.read_text())
    assert BertConfig.from_json_file(path) == BertConfig(hidden_size=64, num_attention_heads=2)
    named = BertConfig(dtype="bfloat16")
    assert json.loads(named.to_json_string())["dtype"] == "bfloat16"
    assert BertConfig.from_dict(json.loads(named.to_json_string())) == named
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertConfig.from_json_file(str(path))
    assert theirs.hidden_size == 64
    with pytest.raises(AttributeError):  # what an "auto" in the file would do
        path.write_text(json.dumps({**ORIGINAL_BASE, "dtype": "auto"}))
        transformers.BertConfig.from_json_file(str(path))
