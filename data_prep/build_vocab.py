r"""Train a vocabulary on a corpus: WordPiece (`tokenizers`' trainer, a BERT `vocab.txt`) or
SentencePiece (`sentencepiece`'s unigram trainer, a `.model` + `.vocab`).

Both start with the five special tokens at ids 0-4: [PAD] [UNK] [CLS] [SEP] [MASK].

    python data_prep/build_vocab.py --input_file='data_prep/sample_corpus/*.txt' \
      --vocab_size=8000 --model=wordpiece --output=/tmp/vocab.txt [--nodo_lower_case]
    python data_prep/build_vocab.py --input_file=... --vocab_size=8000 \
      --model=sentencepiece --output=/tmp/spm.model

The WordPiece vocabulary uses BERT's normalization and pre-tokenization (the same as
bert_jax.tokenization), so `load_tokenizer(vocab_file=...)` reads it back as trained.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # noqa: E402

from bert_jax import cli  # noqa: E402
from bert_jax import paths as bert_paths  # noqa: E402
from bert_jax.data.features import SPECIAL_TOKENS  # noqa: E402
from data_prep.paths import (TEXT_FORMAT, InputError, check_blank_inputs,  # noqa: E402
                             is_uri, resolve_inputs)

FLAGS = flags.FLAGS
flags.DEFINE_string("input_file", None, "Text file(s): comma-separated list, globs allowed.")
flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size, special tokens included.")
flags.DEFINE_enum("model", "wordpiece", ["wordpiece", "sentencepiece"], "Vocabulary type.")
flags.DEFINE_string("output", None, "vocab.txt (wordpiece) or NAME.model (sentencepiece).")
flags.DEFINE_bool("do_lower_case", True, "Lower-case (and strip accents) before training.")
flags.DEFINE_integer("min_frequency", 2, "WordPiece: minimum pair frequency for a merge.")
flags.DEFINE_integer("limit_alphabet", 1000, "WordPiece: maximum initial characters kept.")


def train_wordpiece(files: list[str], vocab_size: int, output: str, do_lower_case: bool = True,
                    min_frequency: int = 2, limit_alphabet: int = 1000) -> list[str]:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tk = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##",
                                    max_input_chars_per_word=100))
    tk.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                               strip_accents=None, lowercase=do_lower_case)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, limit_alphabet=limit_alphabet,
        special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##",
        show_progress=True)
    tk.train(files, trainer)
    vocab = [tok for tok, _ in sorted(tk.get_vocab().items(), key=lambda kv: kv[1])]
    if len(vocab) <= len(SPECIAL_TOKENS):  # before writing: an older vocabulary stays
        raise InputError(f"--input_file: no word to learn from {len(files)} file(s) (only "
                         f"control or invisible characters?); expected {TEXT_FORMAT}; "
                         f"{output} not written")
    tmp = output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(t + "\n" for t in vocab))
    os.replace(tmp, output)
    return vocab


def train_sentencepiece(files: list[str], vocab_size: int, output: str,
                        do_lower_case: bool = True) -> str:
    import sentencepiece as spm

    prefix = output[:-len(".model")] if output.endswith(".model") else output
    if do_lower_case:  # ALBERT lower-cases before SentencePiece; train on what it will see
        import tempfile
        fd, lowered = tempfile.mkstemp(suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            for path in files:
                with open(path, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        out.write(line.lower())
        files = [lowered]
    try:
        spm.SentencePieceTrainer.Train(
            input=",".join(files), model_prefix=prefix, vocab_size=vocab_size,
            model_type="unigram", character_coverage=0.9995,
            pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]", bos_id=-1, eos_id=-1,
            control_symbols="[CLS],[SEP],[MASK]", input_sentence_size=2_000_000,
            shuffle_input_sentence=True, hard_vocab_limit=False, minloglevel=1)
    finally:
        if do_lower_case:
            os.remove(files[0])
    return prefix + ".model"


def main(argv):
    del argv
    try:
        if not FLAGS.input_file or not FLAGS.output:
            raise InputError("--input_file and --output are required")
        files = resolve_inputs(FLAGS.input_file)
        remote = [p for p in files + [FLAGS.output] if is_uri(p)]
        if remote:  # the trainers read and write local files only
            raise InputError(f"{remote[0]}: build_vocab reads and writes local files (the "
                             f"tokenizers and sentencepiece trainers open them by name); "
                             f"copy the corpus here, and the vocabulary to the bucket after")
        blocker = bert_paths.file_in_the_way(os.path.dirname(os.path.abspath(FLAGS.output)))
        if blocker is not None:
            raise InputError(f"--output={FLAGS.output}: {blocker} is a file, so nothing can "
                             f"be written there: pass another path")
        if FLAGS.vocab_size <= len(SPECIAL_TOKENS):
            raise InputError(f"--vocab_size must exceed {len(SPECIAL_TOKENS)}")
        warning = check_blank_inputs(files, "--input_file", TEXT_FORMAT)
    except InputError as e:
        print(f"build_vocab: error: {e}", file=sys.stderr)
        return 2
    if warning:
        print(f"build_vocab: warning: {warning}", file=sys.stderr)
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
    if FLAGS.model == "wordpiece":
        try:
            vocab = train_wordpiece(files, FLAGS.vocab_size, FLAGS.output,
                                    FLAGS.do_lower_case, FLAGS.min_frequency,
                                    FLAGS.limit_alphabet)
        except InputError as e:
            print(f"build_vocab: error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {FLAGS.output}: {len(vocab)} WordPiece tokens")
    else:
        path = train_sentencepiece(files, FLAGS.vocab_size, FLAGS.output, FLAGS.do_lower_case)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    cli.quiet_native_logs()
    cli.run(main)
