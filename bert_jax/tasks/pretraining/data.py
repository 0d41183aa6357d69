"""Pre-training's input (bert_jax.data.pretrain), checked against the config before anything
compiles: make_train_data(config, workdir) -> host iterator with get_state / set_state;
make_eval_data(config, workdir) -> a fresh iterable of eval batches, or None.

With no `data.train_files`, TFRecords are built once, in process by data_prep, from
`data.text_files` (one sentence per line, a blank line between documents) or else the sample
corpus data_prep ships (the quick start), 1 document in 20 held out for evaluation. With
`data.pack=True` the training files hold packed rows; the held-out ones stay unpacked, so
evaluation compares with unpacked runs. Both are masked at the run's `data.masked_lm_prob`,
so the held-out set's fixed masks match what training sees. They are cached in WORKDIR/sample_data/<lengths> or
WORKDIR/text_data/<lengths>_<hash of the files, vocabulary and casing>, reused by a restart;
a bucket workdir gets them built locally and uploaded. A build that fails (a text file that
cannot be read, a full disk) is one line, and leaves nothing of itself behind; with several
processes, process 0 builds and the others stop with it. Fine up to a few hundred MB of text;
for more, run data_prep yourself and set `data.train_files`.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import tempfile

import jax
from etils import epath

from bert_jax import paths
from bert_jax.data import checks, pretrain
from bert_jax.data.features import DataCheckError, files_named
from bert_jax.tokenization import vocab_info
from bert_jax.errors import FaultError, UserError
from bert_jax.train.runtime import agree
from data_prep import SAMPLE_CORPUS, SAMPLE_VOCAB  # package data of the installed data_prep
from data_prep import create_pretraining_data as cpd
from data_prep.paths import TEXT_FORMAT
from data_prep.corpus.read import needs_conversion

HELD_OUT_EVERY = 20   # documents; the eval split of the sample corpus
SAMPLE_DUPE_FACTOR = 5
SAMPLE_SHARDS = 4


def builds_text_data(config) -> bool:
    """The run makes its TFRecords itself (from data.text_files or the sample corpus)."""
    return config.data.source == "tfrecord" and not config.data.train_files


def vocab_file(config) -> str:
    """The run's vocabulary file: data.vocab_file, or the sample vocabulary for TFRecords the
    run builds itself; "" when the data name none (ids checked against data.vocab_size)."""
    return config.data.vocab_file or (SAMPLE_VOCAB if builds_text_data(config) else "")


def make_train_data(config, workdir: str):
    text_files = config.data.get("text_files", "")
    if text_files and (config.data.source != "tfrecord" or config.data.train_files):
        other = (f"data.source={config.data.source!r}" if config.data.source != "tfrecord"
                 else f"data.train_files={config.data.train_files!r}")
        raise ValueError(f"config.data.text_files={text_files!r} is set together with {other}: "
                         f"give raw text (text_files) or TFRecords (train_files), not both")
    build = builds_text_data(config)
    if build:
        # Recorded in the checkpoints' config, so that the run carries its vocabulary
        # (`python -m bert_jax.convert from-workdir` copies it into the model directory).
        config.data.vocab_file = vocab_file(config)
    # Before any TFRecords are built: the vocabulary exists, has its special tokens and
    # fits the model.
    data_vocab = vocab_info(config.data)["vocab_size"]
    if data_vocab > config.model.vocab_size:
        raise ValueError(
            f"the data's vocabulary has {data_vocab} tokens (config.data.vocab_size / "
            f"vocab_file) but config.model.vocab_size={config.model.vocab_size}")
    if build:
        config.data.train_files, config.data.eval_files = build_text_data(config, workdir)
    # Reads the first records of every file: a wrong length or an id outside the
    # vocabulary raises DataCheckError naming the file, before anything compiles; on
    # every process at once (each checks its own files).
    agree(lambda: pretrain.check_input(config.data), "the input check")
    if config.data.get("pack") and not build:
        from bert_jax.data import shards  # TensorFlow: only with files of packed rows
        files = (shards.expand_files(config.data.train_files, "data.train_files")
                 if config.data.source == "tfrecord" else [])
        if not files or not checks.files_packing(files):
            given = (f"data.train_files {files_named(files)} hold unpacked rows" if files
                     else f"data.source={config.data.source!r}")
            raise DataCheckError(
                f"config.data.pack=True, but {given}: data.pack packs the TFRecords the run "
                f"builds (data.text_files, the sample corpus); pack your files with "
                f"create_pretraining_data.py --pack, or set data.pack=False")
    return pretrain.train_iterator(config.data, int(config.train.batch_size))


def make_eval_data(config, workdir: str):  # noqa: ARG001
    if config.data.source == "tfrecord" and not config.data.eval_files:
        return None
    return pretrain.eval_iterator(config.data, int(config.train.eval_batch_size)
                                  or int(config.train.batch_size))


def text_documents(files) -> tuple[list[str], list[str]]:
    """The documents of text files in the original input format (one sentence per line,
    documents separated by blank lines), each its lines joined, in file order; and the
    files without any text."""
    docs: list[str] = []
    blank = []
    for path in files:
        before, n = len(docs), 0
        try:
            with paths.open_text(path) as f:  # local or gs://
                current: list[str] = []
                for n, line in enumerate(f, 1):
                    if line.strip():
                        current.append(line)
                    elif current:
                        docs.append("".join(current))
                        current = []
                if current:
                    docs.append("".join(current))
        except UnicodeDecodeError as e:
            raise DataCheckError(f"config.data.text_files: {path}: near line {n + 1}: not "
                                 f"UTF-8 text ({e.reason}); expected {TEXT_FORMAT}") from None
        except OSError as e:
            reason = os.strerror(e.errno).lower() if e.errno else str(e)
            raise DataCheckError(f"config.data.text_files: cannot read {path}: {reason}; fix "
                                 f"it or leave it out of data.text_files") from None
        if len(docs) == before:
            blank.append(path)
    return docs, blank


def held_out(docs: list[str]) -> tuple[list[str], list[str]]:
    """(training documents, held-out documents): 1 document in HELD_OUT_EVERY held out."""
    return ([d for i, d in enumerate(docs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1],
            [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1])


def _split_documents(files, out_train: str, out_eval: str) -> tuple[int, int, list[str]]:
    """The files' documents (text_documents) into a training and a held-out text file.
    Returns (train documents, held-out documents, the files without any text)."""
    docs, blank = text_documents(files)
    train, held = held_out(docs)
    for out, part in ((out_train, train), (out_eval, held)):
        with open(out + ".tmp", "w", encoding="utf-8") as f:
            f.write("\n".join(part))
        os.replace(out + ".tmp", out)
    return len(train), len(held), blank


def _text_corpus(spec: str) -> list[str]:
    files: list[str] = []
    for pattern in (p.strip() for p in spec.split(",") if p.strip()):
        found = paths.glob(pattern)
        if not found:
            raise FileNotFoundError(f"config.data.text_files: no file matches {pattern!r}")
        files += [paths.resolve(f) for f in found if paths.is_file(f)]
    for f in files:
        kind = needs_conversion(f)
        if kind:  # a dump, JSON lines, a dataset, compressed text: the front door first
            raise DataCheckError(
                f"config.data.text_files: {f} is {_KINDS.get(kind, kind)}, not text in the "
                f"input format ({TEXT_FORMAT}); make it text first: python "
                f"data_prep/prepare_corpus.py --input={f} --output=corpus/ then "
                f"--config.data.text_files='corpus/*.txt'")
    return sorted(set(files))


_KINDS = {"wiki": "a MediaWiki XML dump", "jsonl": "JSON lines", "parquet": "a parquet file",
          "arrow": "an arrow file", "text": "compressed text"}


def _stamp(path: str) -> tuple:
    """Size and modification time: a changed text file gets new TFRecords."""
    if paths.is_uri(path):
        st = epath.Path(path).stat()
        return st.length, st.mtime
    return os.path.getsize(path), os.path.getmtime(path)


def pack_options(config) -> dict:
    """data_prep's options for the training files of `data.pack` (empty: unpacked)."""
    if not config.data.get("pack", False):
        return {}
    k = int(config.data.get("max_sequences_per_pack", 3))
    if k < 1:
        raise DataCheckError(f"config.data.max_sequences_per_pack={k}: expected >= 1 with "
                             f"data.pack=True (the most sequences a packed row holds)")
    return {"pack": True, "max_sequences_per_pack": k}


def build_text_data(config, workdir: str) -> tuple[str, str]:
    """(train glob, eval glob or "") of TFRecords made from `data.text_files` (else the
    sample corpus) for the config's lengths and vocabulary; built by process 0 once and
    reused."""
    seq, pred = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    vocab, lower = config.data.vocab_file, bool(config.data.get("do_lower_case", True))
    pack = pack_options(config)
    # The files are masked at the run's rate (data.masked_lm_prob): the held-out set's fixed
    # masks then match what training sees, dynamically re-masked or not.
    mlm_prob = float(config.data.get("masked_lm_prob", 0.15))
    tag = (f"len{seq}_pred{pred}" + (f"_pack{config.data.max_sequences_per_pack}" if pack else "")
           + (f"_mlm{mlm_prob:g}" if mlm_prob != 0.15 else ""))
    spec = config.data.get("text_files", "")
    if spec:
        corpus = _text_corpus(spec)
        what = f"data.text_files {files_named(corpus)}"
        key = hashlib.sha1(repr([(f, *_stamp(f)) for f in corpus]
                                + [paths.resolve(vocab), lower]).encode()).hexdigest()[:12]
        out = paths.join(workdir, "text_data", f"{tag}_{key}")
    else:
        corpus = sorted(glob.glob(os.path.join(SAMPLE_CORPUS, "*.txt")))
        if not corpus:
            raise FileNotFoundError(f"no sample corpus under {SAMPLE_CORPUS}; set "
                                    f"--config.data.train_files or data.text_files")
        what = "the sample corpus"
        out = paths.join(workdir, "sample_data", tag)
    train_glob = os.path.join(out, "train-*.tfrecord")
    eval_file = os.path.join(out, "eval.tfrecord")
    done = os.path.join(out, "DONE")

    def build() -> None:
        if jax.process_index() != 0 or paths.is_file(done):
            return
        try:
            _build(config, corpus, what, out, seq, pred, vocab, lower, pack, mlm_prob)
        except BaseException as e:
            # Nothing half-written stays as if complete: DONE is written last, and the rest
            # of this build's folder (named by its settings and text) goes too.
            _remove(out)
            if isinstance(e, OSError):
                raise _build_error(e, what, out) from None
            raise

    # Process 0 builds; the others wait for it here, and stop with it if it fails.
    agree(build, "building TFRecords from raw text")
    return train_glob, (eval_file if paths.exists(eval_file) else "")


class TextDataError(FaultError, OSError):
    """TFRecords from raw text could not be written (a full disk, a folder not writable)."""


def _build_error(error: OSError, what: str, out: str) -> TextDataError:
    """One line for an OSError while writing the build (its input files name theirs)."""
    name = getattr(error, "filename", None)
    reason = os.strerror(error.errno).lower() if error.errno else str(error)
    where = f"{name}: " if name else ""
    return TextDataError(f"building TFRecords from {what} into {out} failed: {where}{reason}; "
                         f"nothing of it was kept; free the space (or fix the cause) and run "
                         f"the same command again")


def _remove(out: str) -> None:
    try:
        paths.rmtree(out)
    except OSError:
        pass


def _build(config, corpus, what, out, seq, pred, vocab, lower, pack, mlm_prob) -> None:
    """Process 0's build of the TFRecords into `out`, its DONE file last."""
    # A bucket workdir: built in a local temporary folder, then the TFRecords uploaded.
    remote = paths.is_uri(out)
    build_dir = tempfile.mkdtemp(prefix="bert_jax-text_data-") if remote else out
    os.makedirs(build_dir, exist_ok=True)
    text_train = os.path.join(build_dir, "train.txt")
    text_eval = os.path.join(build_dir, "eval.txt")
    n_train, n_eval, blank = _split_documents(corpus, text_train, text_eval)
    if not n_train:
        raise DataCheckError(f"{what}: no text (empty or blank files); expected "
                             f"{TEXT_FORMAT}")
    if blank:
        print(f"warning: {what}: {len(blank)} file(s) hold no text (empty or blank): "
              f"{files_named(blank)}", flush=True)
    print(f"no data.train_files: building TFRecords from {what} ({n_train} train / "
          f"{n_eval} held-out documents) into {out}", flush=True)
    vocab_option = ({"spm_model_file": vocab} if vocab.endswith(".model")
                    else {"vocab_file": vocab})
    outputs = [("train", text_train, os.path.join(build_dir, "train-{shard:03d}.tfrecord"),
                SAMPLE_SHARDS)] + ([("eval", text_eval, os.path.join(
                    build_dir, "eval.tfrecord"), 1)] if n_eval else [])
    # In this process: data_prep's errors arrive as exceptions. Its 2 worker processes
    # are spawned, never forked: pipeline.run forks only while none of JAX, TensorFlow
    # or torch is loaded (their threads do not survive a fork), and this module has
    # imported jax.
    for name, text, output, shards in outputs:
        options = cpd.Options(
            input_file=text, output_file=output, num_output_shards=shards,
            do_lower_case=lower, max_seq_length=seq, max_predictions_per_seq=pred,
            masked_lm_prob=mlm_prob, dupe_factor=SAMPLE_DUPE_FACTOR,
            random_seed=12345 if name == "train" else 54321, num_workers=2,
            progress=False, **vocab_option, **(pack if name == "train" else {}))
        try:
            result = cpd.create(options)
        except UserError as e:  # the input, not the tool: one line, no traceback
            if name == "eval":  # held-out text with no token: train without evaluation
                print(f"warning: {what}: no evaluation data: {e}", flush=True)
                break
            raise DataCheckError(f"building TFRecords from {what}: {e}") from e
        if name == "train":  # e.g. most text is [UNK] (the held-out part says the same)
            for warning in result.warnings:
                print(f"warning: {what}: {warning}", flush=True)
    if remote:
        try:
            for name in sorted(os.listdir(build_dir)):
                if name.endswith(".tfrecord"):
                    paths.copy_file(os.path.join(build_dir, name), os.path.join(out, name))
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)
    epath.Path(os.path.join(out, "DONE")).write_text("ok\n")  # last: a build cut short is redone
