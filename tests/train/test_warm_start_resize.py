"""Warm starts that change shape on purpose (train.init_extend_positions / init_extend_vocab):
BERT-Tiny trained at 64 positions starts at 128 positions with 100 new words; the old rows
are unchanged, the new ones follow the documented rules (recomputed here from the
checkpoint's arrays and the old tokenizer), the log names each resized tensor, and every
other shape change is still refused."""

from __future__ import annotations

import re

import flax
import numpy as np
import pytest

from bert_jax.convert.sources import open_source
from bert_jax.tasks import pretraining
from bert_jax.tokenization import load_tokenizer
from bert_jax.train import warm_start
from bert_jax.train.config import load_config
from data_prep import SAMPLE_CORPUS, SAMPLE_VOCAB
from tests.train.common import MemorySource, random_batch

NEW_WORDS = 100


def _flat(tree) -> dict:
    return flax.traverse_util.flatten_dict(flax.core.unfreeze(tree), sep="/")


def _new_words(vocab: list[str]) -> list[str]:
    """The first NEW_WORDS lower-case words of the sample corpus (sorted) that the BERT
    vocabulary lacks as a whole: each splits into several old pieces."""
    import glob

    known = set(vocab)
    words = set()
    for path in sorted(glob.glob(f"{SAMPLE_CORPUS}/*.txt")):
        with open(path, encoding="utf-8") as f:
            words.update(re.findall(r"\b[a-z]{6,}\b", f.read().lower()))
    found = sorted(w for w in words if w not in known)[:NEW_WORDS]
    assert len(found) == NEW_WORDS
    return found


def _config(positions: int, vocab_file: str, vocab_size: int, steps: int = 1, **train):
    config = load_config("configs/bert_tiny.py", {
        "model.max_position_embeddings": positions, "model.vocab_size": vocab_size,
        "data.max_seq_length": positions, "data.max_predictions_per_seq": 4,
        "data.vocab_file": vocab_file, "train.batch_size": 2, "train.eval_batch_size": 2,
        "train.steps": steps, "train.log_every": 1, "train.tensorboard": False,
        "checkpoint.every": 0, "checkpoint.async_save": False})
    config.train.update(train)
    return config


class _Batches(MemorySource):
    """MemorySource's stream at another length and vocabulary."""

    def __init__(self, length: int, vocab: int):
        super().__init__(2)
        self.length, self.vocab = length, vocab

    def __next__(self) -> dict:
        self.index += 1
        return random_batch(self.index, 2, length=self.length, predictions=4,
                            vocab=self.vocab)


def _memory(length: int, vocab: int):
    return lambda config, workdir: _Batches(length, vocab)


def test_bert_tiny_warm_starts_at_128_positions_with_100_new_words(tmp_path, capsys):
    old_vocab = load_tokenizer(vocab_file=SAMPLE_VOCAB).vocab
    words = _new_words(old_vocab)
    vocab_file = tmp_path / "vocab_plus.txt"
    vocab_file.write_text("\n".join(old_vocab + words) + "\n")

    phase1 = tmp_path / "phase1"
    pretraining.run(_config(64, SAMPLE_VOCAB, len(old_vocab), steps=2),
                    str(phase1), make_train_data=_memory(64, len(old_vocab)),
                    make_eval_data=lambda c, w: None, progress=False)
    before = _flat(open_source(str(phase1)).params)

    # lr 0: the one step leaves the params as the warm start made them, so the saved
    # checkpoint holds exactly the warm start.
    grown = _config(128, str(vocab_file), len(old_vocab) + NEW_WORDS,
                    init_checkpoint=str(phase1), init_extend_positions="repeat",
                    init_extend_vocab="mean")
    grown.schedule.update(lr=0.0, warmup_steps=0, decay="constant")
    capsys.readouterr()
    pretraining.run(grown, str(tmp_path / "phase2"),
                    make_train_data=_memory(128, len(old_vocab) + NEW_WORDS),
                    make_eval_data=lambda c, w: None, progress=False)
    log = capsys.readouterr().out
    after = _flat(open_source(str(tmp_path / "phase2")).params)

    # Positions: the 64 learned rows unchanged, rows 64..127 repeat them (Longformer).
    pos = "bert/embeddings/position_embeddings/embedding"
    assert before[pos].shape == (64, 128) and after[pos].shape == (128, 128)
    np.testing.assert_array_equal(after[pos][:64], before[pos])
    np.testing.assert_array_equal(after[pos][64:], before[pos])

    # Vocabulary: old rows unchanged; a new word's row and MLM bias are the means of its
    # pieces' under the OLD tokenizer (averaged in float64, stored float32).
    old_tok = load_tokenizer(vocab_file=SAMPLE_VOCAB)
    pieces = [old_tok.encode(w) for w in words]
    assert all(len(p) >= 2 and old_tok.unk_id not in p for p in pieces)
    for key in ("bert/embeddings/word_embeddings/embedding", "mlm/output_bias"):
        old, new = before[key], after[key]
        assert new.shape[0] == old.shape[0] + NEW_WORDS and new.shape[1:] == old.shape[1:]
        np.testing.assert_array_equal(new[:len(old_vocab)], old)
        want = np.stack([old[p].astype(np.float64).mean(axis=0) for p in pieces])
        np.testing.assert_array_equal(new[len(old_vocab):], want.astype(np.float32))

    # Every other tensor as phase 1 left it.
    assert set(after) == set(before)
    for key in sorted(set(before) - {pos, "bert/embeddings/word_embeddings/embedding",
                                     "mlm/output_bias"}):
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)

    assert ("warm start: resized bert/embeddings/position_embeddings/embedding (64, 128) -> "
            "(128, 128): rows 64..127 repeat rows 0..63") in log, log
    v = len(old_vocab)
    assert (f"warm start: resized bert/embeddings/word_embeddings/embedding ({v}, 128) -> "
            f"({v + NEW_WORDS}, 128): rows {v}..{v + NEW_WORDS - 1} = the mean") in log, log
    assert f"warm start: resized mlm/output_bias ({v},) -> ({v + NEW_WORDS},)" in log, log


def _tiny_source(tmp_path, vocab: list[str], positions: int = 16):
    """A model directory of a very small model with `vocab` (vocab.txt) and `positions`."""
    import jax

    from bert_jax.convert.model_dir import save_model_dir
    from bert_jax.models.bert import BertForPreTraining
    from bert_jax.models.config import BertConfig
    from bert_jax.train.state import dummy_inputs

    cfg = BertConfig(vocab_size=len(vocab), hidden_size=8, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=16,
                     max_position_embeddings=positions)
    # Shapes only (no init to compile), random values.
    shapes = flax.linen.meta.unbox(jax.eval_shape(lambda: BertForPreTraining(cfg).init(
        jax.random.key(0), **dummy_inputs(8, 2))["params"]))
    rs = np.random.RandomState(0)
    params = jax.tree_util.tree_map(lambda s: rs.normal(size=s.shape).astype(s.dtype), shapes)
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    save_model_dir(str(tmp_path / "model"), params, cfg, str(tmp_path / "vocab.txt"))
    return open_source(str(tmp_path / "model")), cfg, params


SMALL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##able", "##a", "##b", "read",
         "##ing", "x"]


def test_rules_and_refusals_in_one_line(tmp_path):
    source, cfg, params = _tiny_source(tmp_path, SMALL)
    # Longformer's rule: row i = row i mod n.
    table = np.arange(12.0).reshape(4, 3)
    np.testing.assert_array_equal(warm_start.grow_positions(table, 10),
                                  table[[0, 1, 2, 3, 0, 1, 2, 3, 0, 1]])
    # Pieces under the old vocabulary: a word as text, a "##" entry inside a word, and a
    # word the old vocabulary cannot split: [UNK] (id 1).
    old_tok = load_tokenizer(vocab_file=str(tmp_path / "vocab.txt"))
    assert warm_start.subtoken_ids(["unable", "##ab", "reading", "zzz", "##q"], old_tok) == [
        [5, 6], [7, 8], [9, 10], [1], [1]]
    fresh = np.full((16, 8), 7.0, np.float32)
    grown = warm_start.grow_vocab(params["bert"]["embeddings"]["word_embeddings"]["embedding"],
                                  [[5, 6], [1]], fresh)
    assert grown.shape == (16, 8)
    old = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
    np.testing.assert_array_equal(grown[:12], old)
    np.testing.assert_allclose(grown[12], (old[5] + old[6]) / 2, rtol=1e-6)
    np.testing.assert_array_equal(grown[13], old[1])
    np.testing.assert_array_equal(grown[14:], fresh[14:])   # no entry: the run's own init

    resize = warm_start.Resize(positions="repeat", vocab="mean",
                               vocab_file=str(tmp_path / "new.txt"))
    bigger = cfg.replace(vocab_size=14, max_position_embeddings=32)
    # The run's vocabulary must start with the checkpoint's: the first difference named.
    (tmp_path / "new.txt").write_text("\n".join(SMALL[:6] + ["##abl"] + SMALL[7:]
                                                + ["unread", "xx"]) + "\n")
    with pytest.raises(warm_start.InitCheckpointError) as err:
        warm_start.check_warm_start(source, bigger, "where", resize)
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "new.txt") in msg and source.vocab in msg
    assert "entry 6 is '##abl'" in msg and "'##able'" in msg
    (tmp_path / "new.txt").write_text("\n".join(SMALL + ["unread", "xx"]) + "\n")
    warm_start.check_warm_start(source, bigger, "where", resize)   # a true extension
    # Without the options, or shrinking, or any other key: refused as before, with a hint
    # where an option would take it.
    with pytest.raises(warm_start.ArchitectureError) as err:
        warm_start.check_warm_start(source, bigger, "where")
    assert "init_extend_positions='repeat'" in str(err.value)
    assert "init_extend_vocab='mean'" in str(err.value)
    for other in (cfg.replace(max_position_embeddings=8), cfg.replace(vocab_size=10),
                  bigger.replace(hidden_size=16)):
        with pytest.raises(warm_start.ArchitectureError):
            warm_start.check_warm_start(source, other, "where", resize)
    # Shapes: a grown tensor is taken only under its option.
    from bert_jax.models.bert import BertForPreTraining
    from bert_jax.train.state import abstract_params, dummy_inputs
    abstract = abstract_params(BertForPreTraining(bigger), dummy_inputs(8, 2))
    assert warm_start.check_shapes(source, abstract, None, resize) == {
        "bert/embeddings/position_embeddings/embedding": ((16, 8), (32, 8)),
        "bert/embeddings/word_embeddings/embedding": ((12, 8), (14, 8)),
        "mlm/output_bias": ((12,), (14,))}
    with pytest.raises(warm_start.InitCheckpointError, match="position_embeddings"):
        warm_start.check_shapes(source, abstract, None, warm_start.Resize(vocab="mean"))
    with pytest.raises(Exception, match="init_extend_vocab='avg'"):
        warm_start.Resize.from_config({"init_extend_vocab": "avg"})


def test_rotary_model_warm_starts_at_128_positions_with_no_option(tmp_path, capsys):
    """A rotary model has no position table: trained at max length 64, it warm-starts at
    128 (ModernBERT's 1,024 -> 8,192 phases in small) with no init_extend_positions and
    every tensor unchanged; the positions option is refused for it in one line; and a
    learned-position checkpoint is refused for a rotary model (its table would be lost)."""
    vocab = len(load_tokenizer(vocab_file=SAMPLE_VOCAB).vocab)
    rotary = {"position_embedding": "rotary", "nsp": False}

    def config(positions, steps=1, **train):
        c = _config(positions, SAMPLE_VOCAB, vocab, steps=steps, **train)
        c.model.update(rotary)
        return c

    phase1 = tmp_path / "phase1"
    pretraining.run(config(64), str(phase1), make_train_data=_memory(64, vocab),
                    make_eval_data=lambda c, w: None, progress=False)
    before = _flat(open_source(str(phase1)).params)
    assert not any("position_embeddings" in k for k in before)

    long = config(128, init_checkpoint=str(phase1))
    long.schedule.update(lr=0.0, warmup_steps=0, decay="constant")
    capsys.readouterr()
    pretraining.run(long, str(tmp_path / "long"), make_train_data=_memory(128, vocab),
                    make_eval_data=lambda c, w: None, progress=False)
    log = capsys.readouterr().out
    assert f"warm start: ['bert', 'mlm'] from {phase1}" in log, log
    assert "resized" not in log
    after = _flat(open_source(str(tmp_path / "long")).params)
    assert set(after) == set(before)
    for key in sorted(before):
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)

    # init_extend_positions on a rotary model: nothing to extend, one clear line.
    with pytest.raises(warm_start.ConfigError) as err:
        pretraining.run(config(128, init_checkpoint=str(phase1),
                               init_extend_positions="repeat"),
                        str(tmp_path / "refused"), make_train_data=_memory(128, vocab),
                        make_eval_data=lambda c, w: None, progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "no position table to extend" in msg, msg
    assert "unset train.init_extend_positions" in msg

    # Learned positions in the checkpoint, rotary in the run: refused, naming the key.
    learned = open_source(str(phase1)).config.replace(position_embedding="learned")
    with pytest.raises(warm_start.ArchitectureError, match="position_embedding"):
        warm_start.check_architecture(learned, learned.replace(position_embedding="rotary"),
                                      "where")
    # Between two rotary models a shorter length is fine too (fine-tuning at 32).
    theirs = open_source(str(phase1)).config
    warm_start.check_architecture(theirs, theirs.replace(max_position_embeddings=32), "where")
