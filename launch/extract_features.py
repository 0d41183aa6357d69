r"""Extracts BERT features (hidden states) for every line of a text file.

    python launch/extract_features.py --checkpoint=DIR --input_file=sentences.txt \
        --output_file=emb.npy --layers=-1 --pooling=mean

DIR is a model directory (`python -m bert_jax.convert from-tf|from-hf ...` writes one).
Each input line is a sentence, or a pair `text_a ||| text_b`. --pooling: none (every
token; .jsonl only, the original extract_features format), cls ([CLS] vector) or mean
(average over real tokens, as sentence-transformers). --layers: comma-separated indices
of encoder layers, -1 = last.

Output: .npy <float32>[n, embed] (one layer) or [n, n_layers, embed]; or .jsonl, one
object per line with "linex_index" (0-based line of the input) and the values. A bad input
ends in one line, `error: ...` (exit 2; --verbose adds the traceback).
"""

import logging
import os
import time

from absl import app, flags

from bert_jax import cli
from bert_jax.convert import extract, sources
from bert_jax.tokenization import load_tokenizer

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", None, "Model directory (bert_config.json + params/), or a "
                    "pre-training WORKDIR[/checkpoints/<step>].",
                    required=True)
flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt; default: CHECKPOINT/vocab.txt.")
flags.DEFINE_bool("do_lower_case", True, "Lower-case the input (uncased models).")
flags.DEFINE_string("input_file", None, "Text file: one sentence or 'A ||| B' per line.",
                    required=True)
flags.DEFINE_string("output_file", None, "Output .npy or .jsonl file.", required=True)
flags.DEFINE_string("layers", "-1", "Comma-separated encoder layer indices (-1 = last).")
flags.DEFINE_enum("pooling", "none", ["none", "cls", "mean"], "How to reduce over tokens.")
flags.DEFINE_integer("max_seq_length", 512, "Longer inputs are truncated, with a warning.")
flags.DEFINE_integer("batch_size", 32, "Sentences per forward pass.")


def main(argv):
    del argv
    run()


def run():
    start = time.time()
    # Everything cheap is checked before the parameters are read.
    extract.check_output(FLAGS.output_file, FLAGS.pooling)
    try:
        source = sources.open_source(FLAGS.checkpoint, f"--checkpoint={FLAGS.checkpoint}")
    except FileNotFoundError as e:
        raise app.UsageError(
            f"{e}; make a model directory with "
            f"`python -m bert_jax.convert from-tf|from-hf|from-workdir`") from None
    config = source.config.replace(scan_layers=False)
    layers = extract.parse_layers(FLAGS.layers, config.num_hidden_layers)
    vocab_file = FLAGS.vocab_file or source.vocab
    if not vocab_file or not os.path.isfile(vocab_file):
        raise app.UsageError(f"{vocab_file or 'the checkpoint has no vocab.txt'}: not found; "
                             f"pass --vocab_file")
    tokenizer = load_tokenizer(vocab_file=vocab_file, do_lower_case=FLAGS.do_lower_case)
    extract.check_vocab(tokenizer, config, vocab_file, FLAGS.checkpoint)
    max_len = FLAGS.max_seq_length
    if max_len > config.max_position_embeddings:
        logging.warning("--max_seq_length=%d > max_position_embeddings=%d: using %d",
                        max_len, config.max_position_embeddings, config.max_position_embeddings)
        max_len = config.max_position_embeddings
    examples = extract.read_examples(FLAGS.input_file)

    params = sources.unscanned(source)[1]
    extractor = extract.FeatureExtractor(params["bert"], config, layers, FLAGS.pooling)
    features, encoded = extract.extract(examples, tokenizer, extractor, max_len,
                                        FLAGS.batch_size)
    extract.write_features(FLAGS.output_file, features, examples, encoded, tokenizer, layers,
                           FLAGS.pooling)
    n_trunc = sum(e.truncated for e in encoded)
    print(f"wrote {FLAGS.output_file}: {len(examples)} inputs, layers {layers}, pooling "
          f"{FLAGS.pooling}, {n_trunc} truncated, {time.time() - start:.1f} s")


if __name__ == "__main__":
    # Bad inputs (vocab, layers, output name, config) name the file: one line.
    cli.run(main, also=(ValueError, FileNotFoundError))
