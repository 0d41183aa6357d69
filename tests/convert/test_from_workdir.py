"""A pre-training run (launch/train.py's WORKDIR) as a checkpoint source: `from-workdir` makes
a model directory of the encoder and the trained heads, and to-hf / to-tf / verify take the
run directly. Hugging Face weights taken through a run and exported again come back bit for
bit."""

from __future__ import annotations

import json

import flax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import load_file

from bert_jax.convert import model_dir
from bert_jax.convert.__main__ import main
from bert_jax.models.params import unstack_layers
from tests.convert.helpers import run_extract_features, save_hf_dir
from tests.tasks.conftest import VOCAB
from tests.train.common import MemorySource, random_batch, tiny_config

# Orbax warns when a checkpoint is read back as numpy (no target shardings): expected.
pytestmark = pytest.mark.filterwarnings("ignore:Sharding info not provided")


def _pretrain(workdir, config):
    from bert_jax.tasks import pretraining

    config.train.tensorboard = False
    pretraining.run(config, str(workdir), make_train_data=lambda c, w: _Source(c),
               make_eval_data=lambda c, w: None)


class _Source(MemorySource):
    """MemorySource with ids below the config's vocabulary."""

    def __init__(self, config):
        super().__init__(int(config.train.batch_size))
        self.vocab = int(config.model.vocab_size)

    def __next__(self) -> dict:
        batch = random_batch(1000 + self.index, self.batch_size, vocab=self.vocab)
        self.index += 1
        return batch


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """2 steps of the tiny model with BERT's 30,522-token vocabulary and scanned layers,
    steps 1 and 2 saved."""
    workdir = tmp_path_factory.mktemp("run")
    config = tiny_config(steps=2)
    config.model.vocab_size = 30522
    config.model.scan_layers = True
    config.checkpoint.every = 1
    _pretrain(workdir, config)
    return workdir


def _saved_params(workdir, step):
    with ocp.PyTreeCheckpointer() as ckptr:
        tree = ckptr.restore(str(workdir / "checkpoints" / str(step) / "state"))
    return flax.traverse_util.flatten_dict(unstack_layers(tree["params"], 2))


def _flat(params):
    return flax.traverse_util.flatten_dict(params)


def test_hf_weights_through_a_run_come_back_bit_exact(tiny, tmp_path):
    """HF BertForPreTraining (the goldens' random tiny model) -> from-hf -> warm start of a
    pre-training run with scanned layers and lr 0 -> from-workdir -> to-hf: every tensor
    transformers loads is the original's, bit for bit, with both heads and the config."""
    hf_cfg, state, g = tiny
    main(["from-hf", f"--input={save_hf_dir(tmp_path / 'hf', hf_cfg, state)}",
          f"--output={tmp_path / 'imported'}"])
    config = tiny_config(steps=1, schedule=dict(lr=0.0))
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings"):
        config.model[key] = hf_cfg[key]
    config.model.scan_layers = True
    config.train.init_checkpoint = str(tmp_path / "imported")
    _pretrain(tmp_path / "run", config)

    main(["from-workdir", f"--workdir={tmp_path / 'run'}", f"--output={tmp_path / 'm'}"])
    params, exported = model_dir.load_model_dir(str(tmp_path / "m"))
    assert set(params) == {"bert", "mlm", "nsp"} and not exported.scan_layers
    assert "layer_1" in params["bert"]["encoder"]  # stored unscanned
    main(["to-hf", f"--checkpoint={tmp_path / 'm'}", f"--output={tmp_path / 'out'}"])
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    expected = {k: v for k, v in state.items() if not k.endswith("position_ids")}
    assert sorted(written) == sorted(expected)
    for k, v in expected.items():
        assert np.array_equal(written[k], v), k
    with open(tmp_path / "out" / "config.json") as f:
        out_cfg = json.load(f)
    assert out_cfg["architectures"] == ["BertForPreTraining"]
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size"):
        assert out_cfg[key] == hf_cfg[key], key


def test_from_workdir_latest_or_chosen_step(run, tmp_path):
    """WORKDIR exports the latest step, WORKDIR/checkpoints/1 step 1: every tensor equals
    that checkpoint's, encoder and heads, unscanned; no optimizer state."""
    main(["from-workdir", f"--workdir={run}", f"--output={tmp_path / 'latest'}",
          f"--vocab_file={VOCAB}"])
    main(["from-workdir", f"--workdir={run / 'checkpoints' / '1'}",
          f"--output={tmp_path / 'step1'}"])
    for name, step in (("latest", 2), ("step1", 1)):
        params, config = model_dir.load_model_dir(str(tmp_path / name))
        assert config.hidden_size == 32 and config.vocab_size == 30522
        assert not config.scan_layers
        got, want = _flat(params), _saved_params(run, step)
        assert sorted(got) == sorted(want) and len(got) > 30
        assert {k[0] for k in got} == {"bert", "mlm", "nsp"}
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg="/".join(k))
    key = ("bert", "encoder", "layer_0", "intermediate", "kernel")
    assert not np.array_equal(_saved_params(run, 1)[key], _saved_params(run, 2)[key])
    assert (tmp_path / "latest" / "vocab.txt").read_bytes() == VOCAB.read_bytes()
    assert not (tmp_path / "step1" / "vocab.txt").exists()  # the run named no vocab_file


def test_to_tf_and_verify_take_a_run(run, tmp_path, capsys):
    """to-tf straight from WORKDIR/checkpoints/1, then verify the run against it: the TF1
    reference implementation's outputs (encoder and both heads) on the exported checkpoint."""
    main(["to-tf", f"--checkpoint={run / 'checkpoints' / '1'}", f"--output={tmp_path / 'tf'}"])
    capsys.readouterr()
    main(["verify", f"--checkpoint={run / 'checkpoints' / '1'}",
          f"--reference=tf:{tmp_path / 'tf'}"])
    out = capsys.readouterr().out
    assert "OK: largest difference" in out, out
    for name in ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits"):
        assert name in out, out


def test_errors(run, tmp_path):
    with pytest.raises(SystemExit, match=r"no checkpoint at step 7 in .*checkpoints; saved "
                                         r"steps: \[1, 2\]"):
        main(["from-workdir", f"--workdir={run / 'checkpoints' / '7'}",
              f"--output={tmp_path / 'a'}"])
    with pytest.raises(SystemExit, match=r"neither a model directory .* nor a training run"):
        main(["from-workdir", f"--workdir={tmp_path}", f"--output={tmp_path / 'b'}"])
    bad_vocab = tmp_path / "vocab.txt"
    bad_vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    with pytest.raises(SystemExit, match=r"vocab.txt has 5 tokens but the run's config .* "
                                         r"has vocab_size=30522"):
        main(["from-workdir", f"--workdir={run}", f"--output={tmp_path / 'c'}",
              f"--vocab_file={bad_vocab}"])
    (tmp_path / "exists").mkdir()
    with pytest.raises(SystemExit, match=r"exists.* already exists; refusing to overwrite"):
        main(["from-workdir", f"--workdir={run}", f"--output={tmp_path / 'exists'}"])
    for name in "abc":
        assert not (tmp_path / name).exists() and not (tmp_path / f"{name}.tmp").exists()


def test_extract_features_takes_a_run(run, tmp_path):
    """launch/extract_features.py --checkpoint=WORKDIR/checkpoints/1: mean-pooled features
    of step 1's encoder (read back here with orbax directly), not the latest step's."""
    from bert_jax.models.bert import BertModel
    from bert_jax.models.config import from_config_dict
    from bert_jax.tokenization import load_tokenizer

    lines = ["Friends, Romans, countrymen, lend me your ears;", "I come to bury Caesar."]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    r = run_extract_features(f"--checkpoint={run / 'checkpoints' / '1'}",
                             f"--vocab_file={VOCAB}", f"--input_file={tmp_path / 'in.txt'}",
                             f"--output_file={tmp_path / 'f.npy'}", "--pooling=mean",
                             "--layers=-1")
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.load(tmp_path / "f.npy")

    flat = _saved_params(run, 1)
    bert = flax.traverse_util.unflatten_dict({k[1:]: v for k, v in flat.items()
                                              if k[0] == "bert"})
    config = from_config_dict(tiny_config().model).replace(vocab_size=30522)
    tok = load_tokenizer(vocab_file=str(VOCAB))
    for row, line in zip(got, lines):
        ids = np.asarray([[tok.cls_id] + tok.encode(line) + [tok.sep_id]], np.int32)
        seq, _ = BertModel(config).apply({"params": bert}, ids, np.ones_like(ids),
                                         np.zeros_like(ids))
        np.testing.assert_allclose(row, np.asarray(seq)[0].mean(0), rtol=1e-5, atol=1e-6)
