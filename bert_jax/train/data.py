"""The loop's view of the input pipeline (bert_jax.data.pretrain), and the quick start's
sample data.

make_train_data(config, workdir) -> host iterator (numpy batches, get_state / set_state),
checked against the config before anything compiles; make_eval_data(config, workdir) -> a
fresh iterable of host eval batches, or None without eval files.

With `data.source="tfrecord"` and no `data.train_files`, TFRecords are built once from the
sample corpus shipped in data_prep/sample_corpus (by data_prep/create_pretraining_data.py,
with the config's lengths) and cached in WORKDIR/sample_data; every 20th document is held
out for evaluation.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import jax

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE_CORPUS = os.path.join(REPO, "data_prep", "sample_corpus")
SAMPLE_VOCAB = os.path.join(REPO, "data_prep", "bert_uncased_vocab.txt")
HELD_OUT_EVERY = 20   # documents; the eval split of the sample corpus
SAMPLE_DUPE_FACTOR = 5
SAMPLE_SHARDS = 4


def make_train_data(config, workdir: str):
    from bert_jax.data import pretrain

    if config.data.source == "tfrecord" and not config.data.train_files:
        train, evals = build_sample_data(config, workdir)
        config.data.train_files, config.data.eval_files = train, evals
        if not config.data.vocab_file:
            # Recorded in the checkpoints' config, so that the run carries its vocabulary
            # (`python -m bert_jax.convert from-workdir` copies it into the model directory).
            config.data.vocab_file = SAMPLE_VOCAB
    data_vocab = pretrain.vocab_info(config.data)["vocab_size"]
    if data_vocab > config.model.vocab_size:
        raise ValueError(
            f"the data's vocabulary has {data_vocab} tokens (config.data.vocab_size / "
            f"vocab_file) but config.model.vocab_size={config.model.vocab_size}")
    # Reads the first records of every file: a wrong length or an id outside the
    # vocabulary raises DataCheckError naming the file, before anything compiles.
    pretrain.check_input(config.data)
    return pretrain.train_iterator(config.data)


def make_eval_data(config, workdir: str):  # noqa: ARG001
    from bert_jax.data import pretrain

    if config.data.source == "tfrecord" and not config.data.eval_files:
        return None
    return pretrain.eval_iterator(config.data)


def _split_documents(paths, out_train: str, out_eval: str) -> tuple[int, int]:
    """Documents are separated by blank lines (the original input format)."""
    docs: list[str] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            current: list[str] = []
            for line in f:
                if line.strip():
                    current.append(line)
                elif current:
                    docs.append("".join(current))
                    current = []
            if current:
                docs.append("".join(current))
    train = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    held = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    for out, part in ((out_train, train), (out_eval, held)):
        with open(out + ".tmp", "w", encoding="utf-8") as f:
            f.write("\n".join(part))
        os.replace(out + ".tmp", out)
    return len(train), len(held)


def build_sample_data(config, workdir: str) -> tuple[str, str]:
    """(train glob, eval glob) of TFRecords made from the sample corpus for the config's
    lengths; built by process 0 once and reused (the directory name holds the lengths)."""
    seq, pred = int(config.data.max_seq_length), int(config.data.max_predictions_per_seq)
    out = os.path.join(os.path.abspath(workdir), "sample_data", f"len{seq}_pred{pred}")
    train_glob, eval_glob = os.path.join(out, "train-*.tfrecord"), os.path.join(out, "eval.tfrecord")
    done = os.path.join(out, "DONE")
    if jax.process_index() == 0 and not os.path.exists(done):
        corpus = sorted(glob.glob(os.path.join(SAMPLE_CORPUS, "*.txt")))
        if not corpus:
            raise FileNotFoundError(f"no sample corpus under {SAMPLE_CORPUS}; set "
                                    f"--config.data.train_files")
        os.makedirs(out, exist_ok=True)
        text_train, text_eval = os.path.join(out, "train.txt"), os.path.join(out, "eval.txt")
        n_train, n_eval = _split_documents(corpus, text_train, text_eval)
        print(f"no data.train_files: building TFRecords from the sample corpus "
              f"({n_train} train / {n_eval} held-out documents) into {out}", flush=True)
        outputs = (("train", text_train, os.path.join(out, "train-{shard:03d}.tfrecord"),
                    SAMPLE_SHARDS), ("eval", text_eval, eval_glob, 1))
        for name, text, output, shards in outputs:
            cmd = [sys.executable, os.path.join(REPO, "data_prep", "create_pretraining_data.py"),
                   f"--input_file={text}", f"--output_file={output}",
                   f"--num_output_shards={shards}", f"--vocab_file={SAMPLE_VOCAB}",
                   "--do_lower_case", f"--max_seq_length={seq}",
                   f"--max_predictions_per_seq={pred}", "--masked_lm_prob=0.15",
                   f"--dupe_factor={SAMPLE_DUPE_FACTOR}",
                   f"--random_seed={12345 if name == 'train' else 54321}",
                   "--num_workers=2"]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode:
                raise RuntimeError(f"building the sample data failed ({' '.join(cmd)}):\n"
                                   f"{result.stderr[-4000:]}")
        with open(done, "w") as f:
            f.write("ok\n")
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("sample_data")
    return train_glob, eval_glob
