r"""Checkpoint bridge: Google's TF1 BERT checkpoints and Hugging Face weights <-> our model
directories, both ways, and a numerical check against a reference implementation.

    python -m bert_jax.convert from-tf --checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \
        --config=uncased_L-12_H-768_A-12/bert_config.json \
        --vocab_file=uncased_L-12_H-768_A-12/vocab.txt --output=models/bert_base
    python -m bert_jax.convert from-hf --input=hf/bert-base-uncased --output=models/bert_base
    python -m bert_jax.convert from-workdir --workdir=/tmp/bert_tiny --output=models/tiny
    python -m bert_jax.convert to-hf --checkpoint=models/bert_base --output=hf/out
    python -m bert_jax.convert to-tf --checkpoint=models/bert_base --output=tf/out
    python -m bert_jax.convert verify --checkpoint=models/bert_base --reference=tf:tf/out
    python -m bert_jax.convert to-savedmodel --checkpoint=/tmp/mrpc/best_model \
        --output=serving/mrpc/1 --with_tokenizer

A model directory (bert_config.json + params/ + vocab.txt) is what `train.init_checkpoint`
and `launch/extract_features.py` take. `from-workdir` makes one from a run of
launch/train.py (its latest checkpoint, or WORKDIR/checkpoints/<step>): the encoder and the
heads it trained, without the optimizer state. `to-hf`, `to-tf` and `verify` take either a
model directory or such a run. `to-hf` writes the transformers class of the head, its label
names and the tokenizer's casing as the model directory's task.json records them (a
fine-tuning run's best_model/ has one), and the tokenizer files beside vocab.txt;
`to-savedmodel` writes a TF SavedModel for TF Serving (any head; --with_tokenizer adds
signatures that take text). `from-hf`, `to-hf` and `verify --reference=hf:DIR` also take
transformers' ModernBERT (config.json's model_type "modernbert": ModernBertModel, or
ModernBertForMaskedLM with the MLM head), our ModernBERT-style configs on our side. Every
command checks names and shapes against the config before reading tensors, writes to a
temporary name and renames at the end. A bad input ends in one line, `error: ...` (exit 2;
--verbose adds the traceback).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bert_jax import cli
from bert_jax.convert import hf_files, model_dir, savedmodel, sources, verify
from bert_jax.convert import tf as tfc
from bert_jax.errors import UserError
from bert_jax.models.params import count_params
from bert_jax.tokenization import load_tokenizer


def _vocab_check(vocab_file, config, what):
    if not vocab_file:
        return None

    n = load_tokenizer(vocab_file=vocab_file).vocab_size
    if n != config.vocab_size:
        raise UserError(f"{vocab_file} has {n} tokens but {what} has vocab_size="
                        f"{config.vocab_size}; refusing a vocabulary that does not match")
    return vocab_file


def _refuse_existing(path):
    if os.path.exists(path):
        raise UserError(f"{path} already exists; refusing to overwrite it")


def cmd_from_tf(a):
    import tempfile

    import tensorflow as tf

    _refuse_existing(a.output)
    # Inputs go through tf.io.gfile: the published checkpoints can be read from gs://.
    config_path = a.config or os.path.join(
        os.path.dirname(tfc.checkpoint_prefix(a.checkpoint)), tfc.CONFIG_NAME)
    config = tfc.read_config(config_path)
    vocab = a.vocab_file
    if vocab is None:
        guess = os.path.join(os.path.dirname(config_path), "vocab.txt")
        vocab = guess if tf.io.gfile.exists(guess) else None
    with tempfile.TemporaryDirectory() as tmp:
        if vocab and "://" in vocab:
            tf.io.gfile.copy(vocab, os.path.join(tmp, "vocab.txt"))
            vocab = os.path.join(tmp, "vocab.txt")
        _vocab_check(vocab, config, config_path)
        params, report = tfc.read_checkpoint(a.checkpoint, config, progress=True)
        model_dir.save_model_dir(a.output, params, config, vocab_file=vocab)
    print(report.summary())
    print(f"wrote {a.output} ({_count(params)} parameters"
          f"{', with vocab.txt' if vocab else ', no vocab.txt (pass --vocab_file)'})")


def cmd_from_hf(a):
    _refuse_existing(a.output)
    params, config, report, vocab = hf_files.read_hf_dir(a.input, progress=True)
    vocab = a.vocab_file or vocab
    _vocab_check(vocab, config, os.path.join(a.input, "config.json"))
    model_dir.save_model_dir(a.output, params, config, vocab_file=vocab,
                             task=hf_files.hf_task(a.input))
    print(report.summary())
    print(f"wrote {a.output} ({_count(params)} parameters"
          f"{', with vocab.txt' if vocab else ', no vocab.txt (pass --vocab_file)'})")


def cmd_from_workdir(a):
    _refuse_existing(a.output)
    source = sources.open_source(a.workdir, "--workdir")
    vocab = a.vocab_file or source.vocab
    _vocab_check(vocab, source.config, f"the run's config ({a.workdir})")
    config, params = sources.unscanned(source)
    model_dir.save_model_dir(a.output, params, config, vocab_file=vocab, task=source.task)
    print(f"wrote {a.output} ({_count(params)} parameters; heads: "
          f"{', '.join(k for k in params if k != 'bert') or 'none'}"
          f"{'; with vocab.txt' if vocab else '; no vocab.txt (pass --vocab_file)'})")


def _load(checkpoint):
    return sources.load_model(checkpoint)


def _warn(message):
    print(f"warning: {message}", file=sys.stderr, flush=True)


def cmd_to_hf(a):
    _refuse_existing(a.output)
    source = sources.open_source(a.checkpoint, "--checkpoint")
    config, params = sources.unscanned(source)
    vocab = _vocab_check(a.vocab_file or source.vocab, config, a.checkpoint)
    head, warning = hf_files.hf_format(config).head(params, source.task)
    if warning:
        _warn(warning)
    if not vocab:
        _warn(f"{a.checkpoint} has no vocab.txt: no tokenizer files written (AutoTokenizer "
              f"will not load); pass --vocab_file=VOCAB to include them")
    hf_files.write_hf_dir(a.output, params, config, vocab_file=vocab, task=source.task)
    labels = f", labels {head['labels']}" if head["labels"] else ""
    print(f"wrote {a.output}: {head['architecture']}{labels}; model.safetensors + config.json"
          f"{' + tokenizer files' if vocab else ''}")


def cmd_to_tf(a):
    _refuse_existing(a.output)
    params, config, vocab = _load(a.checkpoint)
    prefix = tfc.save_tf_dir(a.output, params, config, vocab_file=vocab)
    print(f"wrote {prefix} + bert_config.json "
          f"(heads: {', '.join(k for k in params if k != 'bert') or 'none'})")


def cmd_to_savedmodel(a):
    _refuse_existing(a.output)
    if a.with_tokenizer:
        savedmodel.require_tensorflow_text()
    params, config, vocab = _load(a.checkpoint)
    kind = savedmodel.task_kind_of(a.checkpoint) if "classifier" in params else None
    head = savedmodel.pick_head(params, a.head, kind)
    if a.with_tokenizer:
        _vocab_check(vocab, config, f"the checkpoint's config ({a.checkpoint})")
    platforms = tuple(p.strip() for p in a.platforms.split(",") if p.strip())
    print(f"exporting {savedmodel.HEAD_NAMES[head]} through jax2tf "
          f"(platforms: {', '.join(platforms)})", flush=True)
    info = savedmodel.export_savedmodel(
        a.output, params, config, head, vocab_file=vocab, with_tokenizer=a.with_tokenizer,
        do_lower_case=a.do_lower_case, max_seq_length=a.max_seq_length, platforms=platforms)
    for name, (inputs, outputs) in info["signatures"].items():
        print(f"signature {name}: {', '.join(inputs)} -> {', '.join(outputs)}")
    print(f"wrote {a.output} ({_count(params)} parameters"
          f"{', with vocab.txt' if vocab else ', no vocab.txt'})")


def cmd_verify(a):
    try:
        diffs = verify.verify(a.checkpoint, a.reference, length=a.length)
    except (ImportError, RuntimeError) as e:  # reference side absent, or it failed
        raise UserError(str(e)) from e
    width = max(len(k) for k in diffs)
    for k, v in diffs.items():
        print(f"max |ours - reference| {k:<{width}} {v:.3e}")
    worst = max(diffs.values())
    ok = worst <= a.atol
    print(f"{'OK' if ok else 'MISMATCH'}: largest difference {worst:.3e} "
          f"({'<=' if ok else '>'} --atol={a.atol:g})")
    if not ok:
        sys.exit(1)


def _count(params):
    return f"{count_params(params):,}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bert_jax.convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", help=cli.VERBOSE_HELP)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("from-tf", parents=[common],
                       help="original TF1 checkpoint -> model directory")
    s.add_argument("--checkpoint", required=True, help="…/bert_model.ckpt (prefix) or its dir")
    s.add_argument("--config", help="bert_config.json (default: next to the checkpoint)")
    s.add_argument("--vocab_file", help="vocab.txt (default: next to the config, if there)")
    s.add_argument("--output", required=True, help="model directory to create")
    s.set_defaults(fn=cmd_from_tf)

    s = sub.add_parser("from-hf", parents=[common],
                       help="Hugging Face directory -> model directory")
    s.add_argument("--input", required=True, help="dir with config.json + model.safetensors "
                                                  "(or pytorch_model.bin)")
    s.add_argument("--vocab_file", help="vocab.txt (default: INPUT/vocab.txt, if there)")
    s.add_argument("--output", required=True, help="model directory to create")
    s.set_defaults(fn=cmd_from_hf)

    s = sub.add_parser("from-workdir", parents=[common],
                       help="a run of launch/train.py -> model directory")
    s.add_argument("--workdir", required=True,
                   help="WORKDIR (its latest checkpoint) or WORKDIR/checkpoints/<step>")
    s.add_argument("--vocab_file", help="vocab.txt (default: the run's data.vocab_file)")
    s.add_argument("--output", required=True, help="model directory to create")
    s.set_defaults(fn=cmd_from_workdir)

    checkpoint_help = "model directory, or a run's WORKDIR[/checkpoints/<step>]"
    for name, fn, what in (("to-hf", cmd_to_hf, "Hugging Face directory"),
                           ("to-tf", cmd_to_tf, "TF1 checkpoint with the original names")):
        s = sub.add_parser(name, parents=[common], help=f"model directory (or run) -> {what}")
        s.add_argument("--checkpoint", required=True, help=checkpoint_help)
        s.add_argument("--output", required=True, help="directory to create")
        if name == "to-hf":
            s.add_argument("--vocab_file", help="vocab.txt (default: the checkpoint's); "
                                                "written with the tokenizer's config files")
        s.set_defaults(fn=fn)

    s = sub.add_parser("to-savedmodel", parents=[common],
                       help="model directory (or run) -> TF SavedModel for TF Serving")
    s.add_argument("--checkpoint", required=True, help=checkpoint_help)
    s.add_argument("--output", required=True,
                   help="directory to create (TF Serving: MODEL_DIR/<version number>)")
    s.add_argument("--head", default="auto", choices=("auto",) + savedmodel.HEADS,
                   help="what to serve (default: the checkpoint's head; a fine-tuned "
                        "'classifier' outside its run needs sequence, token or choice)")
    s.add_argument("--with_tokenizer", action="store_true",
                   help="also serve_text / serve_text_pair signatures taking strings "
                        "(needs tensorflow-text)")
    s.add_argument("--do_lower_case", action=argparse.BooleanOptionalAction, default=True,
                   help="the tokenizer lower-cases (uncased models; --no-do_lower_case "
                        "for cased)")
    s.add_argument("--max_seq_length", type=int, default=None,
                   help="the tokenizer's longest row (default: max_position_embeddings)")
    s.add_argument("--platforms", default="cpu,cuda",
                   help="platforms the exported program runs on (cpu, cuda, tpu)")
    s.set_defaults(fn=cmd_to_savedmodel)

    s = sub.add_parser("verify", parents=[common],
                       help="compare our outputs with a reference implementation")
    s.add_argument("--checkpoint", required=True, help=checkpoint_help)
    s.add_argument("--reference", required=True, help="hf:DIR or tf:CKPT")
    s.add_argument("--atol", type=float, default=1e-4, help="largest allowed difference")
    s.add_argument("--length", type=int, default=64, help="padded sample length")
    s.set_defaults(fn=cmd_verify)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    start = time.time()
    # Conversion, config and vocabulary errors name the file and the key: one line each.
    with cli.reported(args.verbose, also=(ValueError, FileNotFoundError, FileExistsError,
                                          ImportError)):
        args.fn(args)
    print(f"done in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
