"""launch/extract_features.py: sentence embeddings equal to the sentence-transformers
pipeline's, per-token features and pair inputs equal to transformers' goldens, intermediate
layers, output formats, truncation and refusals."""

import json
import logging
import os

import numpy as np
import pytest

from bert_jax.convert import extract, model_dir
from bert_jax.tokenization import load_tokenizer
from tests.convert.helpers import HERE, max_diff, run_encoder, run_extract_features

# The sentences of tests/goldens/make_goldens.py (SINGLES, then PAIRS as "A ||| B").
GOLDEN_LINES = [
    "To be, or not to be, that is the question.",
    "Shakespeare, William (1564-1616), English poet, player and playwright, was baptized "
    "in the parish church of Stratford-upon-Avon.",
    "The exact date of his birth is not known.",
    "Now is the winter of our discontent made glorious summer by this sun of York.",
    "All the world's a stage.",
    "Who hath reliev'd you? ||| Bernardo has my place. Give you good-night.",
    "His father, John Shakespeare, was a burgess of the recently constituted corporation "
    "of Stratford. ||| By occupation he was a glover.",
    "What, has this thing appear'd again to-night? ||| I have seen nothing.",
    "Friends, Romans, countrymen, lend me your ears; ||| I come to bury Caesar, not to praise him.",
]


def test_mean_pooling_matches_sentence_transformers(minilm_model_dir, tmp_path):
    """Acceptance: from-hf + extract_features --pooling=mean == the sentence-transformers
    pipeline (mean pooling + L2 normalisation: compared by cosine, scale-invariant)."""
    out = tmp_path / "emb.npy"
    r = run_extract_features(f"--checkpoint={minilm_model_dir}",
                             f"--input_file={os.path.join(HERE, 'data', 'sentences.txt')}",
                             f"--output_file={out}", "--pooling=mean", "--layers=-1",
                             "--batch_size=4")
    assert r.returncode == 0, r.stderr[-3000:]
    ours = np.load(out)
    golden = np.load(os.path.join(HERE, "data", "minilm_st_embeddings.npy"))
    assert ours.shape == golden.shape == (11, 384)  # the blank line is skipped
    cos = (ours * golden).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(golden, axis=1)
    assert cos.min() >= 0.9999, cos


@pytest.fixture(scope="module")
def minilm(minilm_model_dir):
    params, config = model_dir.load_model_dir(minilm_model_dir)
    tok = load_tokenizer(vocab_file=os.path.join(minilm_model_dir, "vocab.txt"))
    return params, config, tok


@pytest.fixture(scope="module")
def golden_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("in") / "lines.txt"
    # A blank line in the middle: skipped, and line numbers still refer to the file.
    path.write_text("\n".join(GOLDEN_LINES[:5] + [""] + GOLDEN_LINES[5:]) + "\n")
    return str(path)


def test_tokens_and_per_token_features_match_transformers(minilm, golden_file, minilm_golden,
                                                          tmp_path):
    params, config, tok = minilm
    examples = extract.read_examples(golden_file)
    assert [e.line_index for e in examples] == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert examples[5].text_a == "Who hath reliev'd you?" and examples[5].text_b.startswith("Bern")
    fx = extract.FeatureExtractor(params["bert"], config, [-1], "none")
    feats, encoded = extract.extract(examples, tok, fx, max_seq_length=128, batch_size=4,
                                     progress=False)
    g = minilm_golden
    for i, (f, e) in enumerate(zip(feats, encoded)):
        n = int(g["attention_mask"][i].sum())
        assert e.input_ids == g["input_ids"][i, :n].tolist(), i  # WordPiece + [CLS]/[SEP]
        assert e.token_type_ids == g["token_type_ids"][i, :n].tolist(), i
        assert f.shape == (n, 1, 384)
        assert max_diff(f[:, 0], g["sequence_output"][i, :n]) <= 1e-4, i
    out = str(tmp_path / "tokens.jsonl")
    extract.write_features(out, feats, examples, encoded, tok, [-1], "none")
    with open(out) as fh:
        recs = [json.loads(line) for line in fh]
    assert [r["linex_index"] for r in recs] == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    toks = [t["token"] for t in recs[5]["features"]]
    assert toks[:4] == ["[CLS]", "who", "hat", "##h"] and toks.count("[SEP]") == 2
    v = recs[5]["features"][1]["layers"][0]
    assert v["index"] == -1 and len(v["values"]) == 384
    assert abs(v["values"][0] - g["sequence_output"][5, 1, 0]) <= 1e-4


def test_cls_pooling_of_intermediate_layers(minilm, golden_file, minilm_golden, tmp_path):
    """Layer -2 of the 6-layer model == the output of a 5-layer model on the same weights."""
    params, config, tok = minilm
    examples = extract.read_examples(golden_file)
    fx = extract.FeatureExtractor(params["bert"], config, "-1,-2", "cls")
    feats, _ = extract.extract(examples, tok, fx, max_seq_length=128, batch_size=16,
                               progress=False)
    feats = np.stack(feats)
    assert feats.shape == (9, 2, 384)
    g = minilm_golden
    assert max_diff(feats[:, 0], g["sequence_output"][:, 0]) <= 1e-4
    five = {"bert": dict(params["bert"], encoder={
        k: v for k, v in params["bert"]["encoder"].items() if k != "layer_5"})}
    seq5, _ = run_encoder(five, config.replace(num_hidden_layers=5), g)
    assert max_diff(feats[:, 1], seq5[:, 0]) <= 1e-4
    assert max_diff(feats[:, 0], feats[:, 1]) > 0.1  # really a different layer
    out = str(tmp_path / "cls.npy")
    extract.write_features(out, list(feats), examples, None, tok, [-1, -2], "cls")
    assert np.array_equal(np.load(out), feats)


def test_truncation_is_longest_first_and_warned(minilm, caplog):
    params, config, tok = minilm
    long_a = "one two three four five six seven eight nine ten eleven twelve"
    ex = [extract.Example(0, long_a, "alpha beta"), extract.Example(1, long_a, None),
          extract.Example(2, "short", None)]
    enc = extract.encode_example(ex[0], tok, 10)
    assert len(enc.input_ids) == 10 and enc.truncated
    assert tok.convert_ids_to_tokens(enc.input_ids) == [
        "[CLS]", "one", "two", "three", "four", "five", "[SEP]", "alpha", "beta", "[SEP]"]
    fx = extract.FeatureExtractor(params["bert"], config, [-1], "mean")
    with caplog.at_level(logging.WARNING):
        feats, encoded = extract.extract(ex, tok, fx, max_seq_length=10, batch_size=4,
                                         progress=False)
    assert [e.truncated for e in encoded] == [True, True, False]
    assert "2 input(s) longer than max_seq_length=10 were truncated (lines [1, 2])" in caplog.text
    assert all(f.shape == (1, 384) and np.isfinite(f).all() for f in feats)


def test_refusals(minilm, minilm_model_dir, minilm_dir, tmp_path):
    params, config, tok = minilm
    with pytest.raises(ValueError, match="layer 6 does not exist; the model has 6 layers"):
        extract.parse_layers("-1,6", 6)
    with pytest.raises(ValueError, match="write them to a .jsonl file"):
        extract.check_output(str(tmp_path / "x.npy"), "none")
    with pytest.raises(ValueError, match="expected a .npy or .jsonl"):
        extract.check_output(str(tmp_path / "x.csv"), "mean")
    small = tmp_path / "vocab.txt"
    with open(os.path.join(minilm_dir, "vocab.txt")) as f:
        small.write_text("".join(f.readlines()[:2000]))
    (tmp_path / "in.txt").write_text("hello\n")
    r = run_extract_features(f"--checkpoint={minilm_model_dir}", f"--vocab_file={small}",
                             f"--input_file={tmp_path / 'in.txt'}",
                             f"--output_file={tmp_path / 'o.npy'}", "--pooling=mean")
    assert r.returncode != 0
    assert "has 2000 tokens but the checkpoint" in r.stderr and "vocab_size=30522" in r.stderr
    assert not os.path.exists(tmp_path / "o.npy")


def test_input_and_features_in_a_bucket(tmp_path, monkeypatch):
    """--input_file / --output_file as gs:// URIs (the fake bucket of tests/test_paths.py):
    the sentences read from the bucket, the .npy and .jsonl written there equal to local
    files, and a missing bucket folder named before any work."""
    from tests.test_paths import fake_gcs

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "bucket_root"
    (root / "b" / "in").mkdir(parents=True)
    (root / "b" / "in" / "s.txt").write_text("Is this a dagger\n\nI see thee still ||| yet\n")
    features = [np.arange(8, dtype=np.float32).reshape(2, 4) * (i + 1) for i in range(2)]
    with fake_gcs(str(root)):
        examples = extract.read_examples("gs://b/in/s.txt")
        assert [(e.line_index, e.text_a, e.text_b) for e in examples] == [
            (0, "Is this a dagger", None), (2, "I see thee still", "yet")]
        for name in ("f.npy", "f.jsonl"):
            for where in (str(tmp_path / name), f"gs://b/out/{name}"):
                if where.startswith("gs://"):
                    (root / "b" / "out").mkdir(exist_ok=True)
                extract.write_features(where, features, examples, [None] * 2, None, [-2, -1],
                                       "mean")
            assert (root / "b" / "out" / name).read_bytes() == (tmp_path / name).read_bytes()
        with pytest.raises(FileNotFoundError, match="directory gs://b/nowhere does not exist"):
            extract.check_output("gs://b/nowhere/f.npy", "mean")
    np.testing.assert_array_equal(np.load(root / "b" / "out" / "f.npy"), np.stack(features))
    assert sorted(os.listdir(root / "b" / "out")) == ["f.jsonl", "f.npy"]
    assert not (tmp_path / "gs:").exists()
