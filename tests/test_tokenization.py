"""bert_jax.tokenization against transformers' slow BertTokenizer (goldens), the
ASCII fast path against the library, SentencePiece, and the vocabulary errors."""

import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_jax.tokenization import VocabError, load_tokenizer
from tests.data_prep.helpers import GOLDENS, SAMPLE, VOCAB

CASED_VOCAB = str(GOLDENS / "cased_vocab_8k.txt")


@pytest.fixture(scope="module")
def goldens():
    with gzip.open(GOLDENS / "tokenizer_ids.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("case,vocab,lower", [("uncased", VOCAB, True),
                                              ("cased", CASED_VOCAB, False)])
def test_ids_equal_slow_bert_tokenizer(goldens, case, vocab, lower):
    tok = load_tokenizer(vocab_file=vocab, do_lower_case=lower)
    lines, want = goldens["lines"], goldens[case]
    assert len(lines) >= 2000
    assert sum(not (l.isascii() and l.isprintable()) for l in lines) > 300  # non-ASCII covered
    got_batch = tok.encode_batch(lines)
    bad = [i for i, l in enumerate(lines) if tok.encode(l) != want[i]]
    assert not bad, f"{len(bad)} lines differ, e.g. {lines[bad[0]]!r}"
    bad = [i for i in range(len(lines)) if got_batch[i] != want[i]]
    assert not bad, f"encode_batch: {len(bad)} lines differ, e.g. {lines[bad[0]]!r}"
    n_unk = sum(i == tok.unk_id for ids in want for i in ids)
    assert n_unk > 0  # the >100-character word and unknown scripts are [UNK]


def test_interface_ids_and_words():
    tok = load_tokenizer(vocab_file=VOCAB)
    assert tok.vocab_size == 30522 and len(tok.vocab) == 30522
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 100, 101, 102, 103)
    assert tok.encode("Hello world") == [7592, 2088]
    assert tok.tokenize("unaffable Héllo") == ["una", "##ffa", "##ble", "hello"]
    assert tok.tokenize_words("unaffable, x") == [["una", "##ffa", "##ble"], [","], ["x"]]
    assert tok.convert_tokens_to_ids(["[CLS]", "hello", "notawordpiece"]) == [101, 7592, 100]
    assert tok.convert_ids_to_tokens([101, 7592]) == ["[CLS]", "hello"]
    assert tok.encode_pretokenized(["Unaffable", "\x00", "x"]) == [[14477, 20961, 3468], [], [1060]]
    assert tok.encode("[MASK]") == tok.encode("[ mask ]")  # text is never a special token
    assert tok.is_continuation[tok.convert_tokens_to_ids(["##ffa"])[0]]


_ascii = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(_ascii, st.text(max_size=30)), max_size=12), st.booleans())
def test_batch_fast_path_equals_library(texts, lower):
    """encode_batch_flat's printable-ASCII shortcut gives the library's ids for any text."""
    tok = _tok(lower)
    flat, lens = tok.encode_batch_flat(texts)
    want = [e.ids for e in tok.backend.encode_batch(texts, add_special_tokens=False)]
    assert lens.tolist() == [len(w) for w in want]
    assert flat.tolist() == [i for w in want for i in w]


_TOKS = {}


def _tok(lower):
    if lower not in _TOKS:
        _TOKS[lower] = load_tokenizer(vocab_file=VOCAB, do_lower_case=lower)
    return _TOKS[lower]


def test_batch_equals_library_on_sample_corpus():
    lines = [l.strip() for p in SAMPLE for l in open(p, encoding="utf-8")][:4000]
    for lower in (True, False):
        tok = _tok(lower)
        flat, lens = tok.encode_batch_flat(lines)
        want = [e.ids for e in tok.backend.encode_batch(lines, add_special_tokens=False)]
        assert flat.tolist() == [i for w in want for i in w]
        np.testing.assert_array_equal(lens, [len(w) for w in want])


def test_vocab_errors_name_the_file(tmp_path):
    bad = tmp_path / "vocab_no_mask.txt"
    bad.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    with pytest.raises(VocabError, match=r"vocab_no_mask\.txt.*\[MASK\]"):
        load_tokenizer(vocab_file=str(bad))
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        load_tokenizer(vocab_file=str(tmp_path / "nope.txt"))
    with pytest.raises(ValueError, match="exactly one"):
        load_tokenizer()
    with pytest.raises(ValueError, match="exactly one"):
        load_tokenizer(vocab_file=VOCAB, spm_model_file="x.model")
    notspm = tmp_path / "x.model"
    notspm.write_bytes(b"garbage")
    with pytest.raises(VocabError, match=r"x\.model"):
        load_tokenizer(spm_model_file=str(notspm))


def test_build_vocab_round_trips(tmp_path):
    """build_vocab's WordPiece and SentencePiece outputs load with the 5 special tokens."""
    from data_prep import build_vocab

    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(l for l in open(SAMPLE[0], encoding="utf-8"))[:200_000])
    vocab = build_vocab.train_wordpiece([str(corpus)], 2000, str(tmp_path / "v.txt"))
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) == 2000
    wp = load_tokenizer(vocab_file=str(tmp_path / "v.txt"))
    assert wp.tokenize("To be, or not to be")[:3] == ["to", "be", ","]
    model = build_vocab.train_sentencepiece([str(corpus)], 1000, str(tmp_path / "sp.model"))
    sp = load_tokenizer(spm_model_file=model)
    assert (sp.pad_id, sp.unk_id, sp.cls_id, sp.sep_id, sp.mask_id) == (0, 1, 2, 3, 4)
    ids = sp.encode("To be, or not to be")
    assert ids and sp.cls_id not in ids and sp.encode("TO BE") == sp.encode("to be")
    words = sp.tokenize_words("to be or not")
    assert len(words) == 4 and all(w[0].startswith("\u2581") for w in words)
    flat, lens = sp.encode_batch_flat(["to be", "", "or not"])
    assert lens[1] == 0 and flat.tolist() == sp.encode("to be") + sp.encode("or not")
