"""CoNLL-2003 column files (word ... tag per line, blank line between sentences,
-DOCSTART- lines skipped) or tfds `conll2003` -> list[NerExample]."""

from __future__ import annotations

import dataclasses

from bert_jax import paths
from bert_jax.tasks.readers import DataError, some, tfds_builder

@dataclasses.dataclass(frozen=True)
class NerExample:
    guid: str
    words: tuple[str, ...]
    tags: tuple[str, ...]


def read_conll(path: str, tag_column: int = -1) -> list[NerExample]:
    """CoNLL-2003 style column file: `word [POS chunk] TAG` per line (space or tab
    separated), blank lines between sentences, `-DOCSTART-` lines ignored."""
    if not paths.is_file(path):
        raise FileNotFoundError(f"CoNLL file not found: {path}")
    out, words, tags = [], [], []

    def flush():
        if words:
            out.append(NerExample(f"{len(out)}", tuple(words), tuple(tags)))
            words.clear()
            tags.clear()

    with paths.open_text(path) as f:
        for n, line in enumerate(f, 1):
            cols = line.split()
            if not cols:
                flush()
                continue
            if cols[0] == "-DOCSTART-":
                flush()
                continue
            if len(cols) < 2:
                raise DataError(f"{path}: line {n}: expected 'word ... tag' columns, got "
                                f"{line.rstrip()!r}")
            words.append(cols[0])
            tags.append(cols[tag_column])
    flush()
    return some(out, path, "no sentences (empty, or only -DOCSTART- lines)",
                 "'word ... tag' lines, a blank line between sentences (CoNLL-2003 format)")


def read_conll_tfds(split: str, tfds_data_dir=None) -> list[NerExample]:
    import tensorflow_datasets as tfds

    builder = tfds_builder(
        "conll2003", tfds_data_dir,
        "pass the CoNLL-2003 files as --config.task.train_file=eng.train "
        "--config.task.dev_file=eng.testa (--config.task.test_file=eng.testb), or "
        "--config.task.tfds_data_dir=DIR holding a prepared tfds conll2003")
    names = builder.info.features["ner"].feature.names
    ds = builder.as_dataset(split={"train": "train", "dev": "dev", "test": "test"}[split])
    out = []
    for i, ex in enumerate(tfds.as_numpy(ds)):
        if len(ex["tokens"]) != len(ex["ner"]):
            raise DataError(f"tfds conll2003:{split}: example {i} has {len(ex['tokens'])} "
                            f"tokens but {len(ex['ner'])} tags")
        out.append(NerExample(str(i), tuple(w.decode("utf-8") for w in ex["tokens"]),
                              tuple(names[int(t)] for t in ex["ner"])))
    return out
