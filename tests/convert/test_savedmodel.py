"""`to-savedmodel`: the SavedModel's serving signature gives bert_jax's outputs, and its
string signatures tokenize as bert_jax.tokenization does."""

from __future__ import annotations

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.convert import savedmodel
from bert_jax.convert.__main__ import main
from bert_jax.convert.model_dir import save_model_dir
from bert_jax.models import bert as models
from bert_jax.models.config import BertConfig
from bert_jax.tasks.classification import assemble_pair
from bert_jax.tokenization import load_tokenizer

tf = pytest.importorskip("tensorflow")
try:
    import tensorflow_text  # noqa: F401
    HAVE_TEXT = True
except ImportError:  # the README's test command installs it (--no-deps: see constraints.txt)
    HAVE_TEXT = False

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
UNCASED_VOCAB = os.path.join(ROOT, "data_prep", "bert_uncased_vocab.txt")
WORDS = ("the a is was to of and in it that cat dog sat on mat where station two streets "
         "down left quick brown fox jumps over lazy hello world question answer").split()
SHAPES = ((1, 7), (3, 16))  # two batch sizes, two lengths


def tiny_vocab(path) -> str:
    pieces = ["##s", "##ed", "##ing", "##ly", "##er"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(".,?!'") + WORDS
              + letters + ["##" + c for c in letters] + pieces)
    path.write_text("\n".join(tokens) + "\n")
    return str(path)


def tiny_config(vocab_size: int) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=48, max_position_embeddings=40)


def random_params(model, seed: int) -> dict:
    """Initialised params plus noise, so that every bias and LayerNorm term is non-trivial."""
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(seed),
                                        jnp.zeros((1, 8), jnp.int32))["params"])
    leaves, treedef = jax.tree_util.tree_flatten(params)
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_unflatten(
        treedef, [np.asarray(x) + 0.05 * rng.standard_normal(x.shape).astype(np.float32)
                  for x in leaves])


def random_inputs(batch: int, length: int, vocab_size: int, seed: int):
    """input_ids / input_mask / segment_ids <int32>[batch, length], rows of several lengths
    (padding exercised: a padded row's outputs differ from an unpadded one's)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, (batch, length)).astype(np.int32)
    mask = np.zeros_like(ids)
    seg = np.zeros_like(ids)
    for i in range(batch):
        n = length - 3 * i if i else length
        mask[i, :n] = 1
        seg[i, n // 2:n] = 1
    return ids * mask, mask, seg


def serve(loaded, name, **inputs) -> dict[str, np.ndarray]:
    out = loaded.signatures[name](**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in out.items()}


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A sequence classifier model directory (3 labels) with a tiny vocab.txt, exported by
    the CLI (with --with_tokenizer where tensorflow-text is installed: it is not a
    dependency of the suite); (params, config, vocab, loaded SavedModel)."""
    tmp = tmp_path_factory.mktemp("savedmodel_cls")
    vocab = tiny_vocab(tmp / "vocab.txt")
    config = tiny_config(len(open(vocab).read().split()))
    params = random_params(models.BertForSequenceClassification(config, 3), 0)
    save_model_dir(str(tmp / "model"), params, config, vocab_file=vocab)
    out = str(tmp / "serving" / "1")
    text = ["--with_tokenizer"] if HAVE_TEXT else []
    main(["to-savedmodel", f"--checkpoint={tmp / 'model'}", f"--output={out}",
          "--head=sequence", *text, "--max_seq_length=24", "--platforms=cpu"])
    return params, config, vocab, tf.saved_model.load(out)


def test_sequence_classification_logits_match(classifier):
    params, config, _, loaded = classifier
    model = models.BertForSequenceClassification(config, 3)
    assert set(loaded.signatures) == ({"serving_default", "serve_text", "serve_text_pair"}
                                      if HAVE_TEXT else {"serving_default"})
    for batch, length in SHAPES:
        ids, mask, seg = random_inputs(batch, length, config.vocab_size, batch)
        got = serve(loaded, "serving_default", input_ids=ids, input_mask=mask,
                    segment_ids=seg)
        want = np.asarray(jax.jit(model.apply)({"params": params}, ids, mask, seg))
        assert set(got) == {"logits"} and got["logits"].shape == (batch, 3)
        np.testing.assert_allclose(got["logits"], want, atol=1e-4, rtol=0)
        assert np.abs(want).max() > 1e-2  # a real comparison, not of zeros


@pytest.mark.skipif(not HAVE_TEXT, reason="--with_tokenizer needs tensorflow-text "
                                          "(pip install --no-deps tensorflow-text)")
def test_string_signatures_tokenize_as_ours(classifier):
    params, config, vocab, loaded = classifier
    tok = load_tokenizer(vocab_file=vocab, do_lower_case=True)
    model = models.BertForSequenceClassification(config, 3)
    a = ["The quick brown fox jumps over the lazy dog.", "Where is the station?",
         "HELLO, Wörld!! cats sat on mats quickly"]
    b = ["Two streets down, on the left.", "the cat sat on the mat " * 4, "dog?"]
    for name, texts, pairs in (("serve_text", a, None), ("serve_text_pair", a, b)):
        inputs = {"text": np.array(a, dtype=object)}
        if pairs:
            inputs["text_pair"] = np.array(pairs, dtype=object)
        got = serve(loaded, name, **inputs)
        rows = [assemble_pair(tok.encode(x), tok.encode(y) if pairs else None,
                              tok.cls_id, tok.sep_id, 24)
                for x, y in zip(texts, pairs or texts)]
        length = max(len(r[0]) for r in rows)
        assert got["input_ids"].shape == (3, length)
        for i, (ids, types) in enumerate(rows):
            n = len(ids)
            assert got["input_ids"][i, :n].tolist() == ids
            assert got["segment_ids"][i, :n].tolist() == types
            assert got["input_mask"][i].tolist() == [1] * n + [0] * (length - n)
        want = np.asarray(jax.jit(model.apply)({"params": params}, got["input_ids"],
                                      got["input_mask"], got["segment_ids"]))
        np.testing.assert_allclose(got["logits"], want, atol=1e-4, rtol=0)


def test_question_answering_logits_match(tmp_path, capsys):
    """Through the CLI: the head found by itself, the default platforms (cpu, cuda)."""
    config = tiny_config(64)
    params = random_params(models.BertForQuestionAnswering(config), 1)
    save_model_dir(str(tmp_path / "model"), params, config)
    out = str(tmp_path / "qa")
    main(["to-savedmodel", f"--checkpoint={tmp_path / 'model'}", f"--output={out}"])
    printed = capsys.readouterr().out
    assert "span question answering" in printed and "cpu, cuda" in printed
    assert "serving_default: input_ids, input_mask, segment_ids -> end_logits, " \
           "start_logits" in printed
    loaded = tf.saved_model.load(out)
    model = models.BertForQuestionAnswering(config)
    for batch, length in SHAPES:
        ids, mask, seg = random_inputs(batch, length, config.vocab_size, 10 + batch)
        got = serve(loaded, "serving_default", input_ids=ids, input_mask=mask,
                    segment_ids=seg)
        start, end = jax.jit(model.apply)({"params": params}, ids, mask, seg)
        assert set(got) == {"start_logits", "end_logits"}
        np.testing.assert_allclose(got["start_logits"], start, atol=1e-4, rtol=0)
        np.testing.assert_allclose(got["end_logits"], end, atol=1e-4, rtol=0)


def test_pick_head():
    cls = {"bert": {}, "classifier": {"dense": {"bias": np.zeros(3)}}}
    assert savedmodel.pick_head({"bert": {}}) == "encoder"
    assert savedmodel.pick_head({"bert": {}, "mlm": {}, "nsp": {}}) == "pretraining"
    assert savedmodel.pick_head(cls, task_kind="ner") == "token"
    assert savedmodel.pick_head(cls, task_kind="glue") == "sequence"
    with pytest.raises(savedmodel.ExportError, match="--head=sequence, --head=token"):
        savedmodel.pick_head(cls)
    with pytest.raises(savedmodel.ExportError, match="needs the 'qa_outputs'"):
        savedmodel.pick_head(cls, "qa")
    with pytest.raises(savedmodel.ExportError, match="one output"):
        savedmodel.pick_head(cls, "choice")


def test_erf_rational_is_erf():
    x = np.linspace(-6, 6, 20001, dtype=np.float32)
    np.testing.assert_allclose(savedmodel.erf_rational(jnp.asarray(x)),
                               jax.lax.erf(jnp.asarray(x)), atol=1e-6, rtol=0)


def test_with_tokenizer_without_tensorflow_text(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "tensorflow_text", None)
    with pytest.raises(SystemExit) as e:
        main(["to-savedmodel", f"--checkpoint={tmp_path}", f"--output={tmp_path / 'o'}",
              "--with_tokenizer"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install" in err[0] and "tensorflow-text" in err[0]


TEXTS = [
    "Hello, world! It's 3.14 o'clock.", "Ünïcödé àccents — and “quotes”…",
    "Straße ＡＢＣ ﬁne Σίσυφος", "中文字符和日本語のテキスト",
    "zero\u200bwidth\x00nul\x07bell\u00a0nbsp\u3000ideo\tTab\nNL\u2028line",
    "a" * 120 + " end " + "é" * 99, "", "   ", "[MASK] [CLS] unaffable",
    "emoji 😀 ok ©®™ ½ café",
]
PAIRS = ["short", "", "A much longer second sentence that will need trimming, a lot.",
         "q?", "x " * 30, "y", "", "z z z", "the end", "één"]


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("max_len", [12, 64])
def test_text_encoder_matches_tokenizer(lower, max_len):
    """The in-graph tokenizer against ours on the real uncased vocabulary: Unicode
    cleaning, casing, accents, CJK, long words, and pair truncation."""
    pytest.importorskip("tensorflow_text")
    tok = load_tokenizer(vocab_file=UNCASED_VOCAB, do_lower_case=lower)
    enc = savedmodel.TextEncoder(UNCASED_VOCAB, lower, max_len)
    for pairs in (None, PAIRS):
        ids, mask, seg = (x.numpy() for x in enc(tf.constant(TEXTS), None if pairs is None
                                                  else tf.constant(pairs)))
        for i, a in enumerate(TEXTS):
            b = tok.encode(pairs[i]) if pairs and pairs[i] else None
            want_ids, want_types = assemble_pair(tok.encode(a), b, tok.cls_id, tok.sep_id,
                                                 max_len)
            real = mask[i] == 1
            assert ids[i][real].tolist() == want_ids, (a, pairs and pairs[i])
            assert seg[i][real].tolist() == want_types
            assert real.tolist() == [True] * len(want_ids) + [False] * (len(real) - len(want_ids))


def test_the_recorded_task_picks_the_head(tmp_path):
    """A model directory's task.json (what a fine-tuning run's best_model/ and to-hf's
    round trip record) decides which head a `classifier` is, without --head."""
    from bert_jax.convert.model_dir import task_record

    vocab = tiny_vocab(tmp_path / "vocab.txt")
    config = tiny_config(len(open(vocab).read().split()))
    model = models.BertForTokenClassification(config, 3)
    params = random_params(model, seed=3)
    save_model_dir(str(tmp_path / "ner_model"), params, config, vocab,
                   task=task_record("ner", ["O", "B-PER", "I-PER"]))
    assert savedmodel.task_kind_of(str(tmp_path / "ner_model")) == "ner"
    assert savedmodel.pick_head(params, "auto", "ner") == "token"
    save_model_dir(str(tmp_path / "bare"), params, config, vocab)
    assert savedmodel.task_kind_of(str(tmp_path / "bare")) is None
