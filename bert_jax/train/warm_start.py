"""`train.init_checkpoint`: start a run from weights trained elsewhere, for every task.

`source` is a bert_jax.convert.sources.InitSource (a model or Hugging Face directory, or
another run's workdir); `keys` are the top-level parameter trees taken from it (fine-tuning:
("bert",); None: every tree both have, so a pre-training warm start takes its heads too);
the others keep their fresh init. `check_shapes` runs before anything compiles. A workdir's
trees are restored by orbax straight onto the mesh; `full` (train.init_state="full") also
takes its optimizer state, step and RNG, so the schedule continues: the paper's phase 2.

Two shape changes are taken on purpose, each opted into (`Resize`; every other difference
is refused): a longer `max_position_embeddings` (train.init_extend_positions) and a larger
vocabulary whose first entries are the checkpoint's own (train.init_extend_vocab). The old
rows are copied unchanged; the new ones follow the rules of `grow_positions` and
`grow_vocab`; the run's log names each tensor resized, its shapes and its rule. A rotary
model (model.position_embedding="rotary") has no position table: it warm-starts at any
max_position_embeddings with no option (ModernBERT's 1,024 -> 8,192 phases), and the
positions option is refused for it as there is nothing to extend.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import flax
import jax
import numpy as np

from bert_jax.convert.sources import InitSource, locate
from bert_jax.errors import UserError
from bert_jax.models.config import ConfigError
from bert_jax.models.params import encoder_layout, flat_shapes, layer_layout, stack_layers
from bert_jax.tokenization import load_tokenizer
from bert_jax.train import checkpoint as ckpt_lib

ARCH_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "type_vocab_size", "max_position_embeddings",
             "position_embedding")


class ArchitectureError(UserError, ValueError):
    """An init checkpoint whose model has another architecture than the run's."""


class InitCheckpointError(UserError, ValueError):
    """An init checkpoint without a tensor the run takes, or with another shape."""


# The tensors a Resize may grow along their first axis, by option.
POSITIONS = "bert/embeddings/position_embeddings/embedding"
WORDS = "bert/embeddings/word_embeddings/embedding"
MLM_BIAS = "mlm/output_bias"
POSITION_RULES = ("repeat",)
VOCAB_RULES = ("mean",)


@dataclasses.dataclass(frozen=True)
class Resize:
    """The shape changes a warm start may make; "" refuses one (the default).

    positions: "repeat" (`grow_positions`) lets a run with a longer max_position_embeddings
    start from the checkpoint. vocab: "mean" (`grow_vocab`) lets a run with a larger
    vocabulary start from it; vocab_file is the run's WordPiece vocab.txt, whose first
    entries must be the checkpoint's vocabulary, and do_lower_case its casing."""

    positions: str = ""
    vocab: str = ""
    vocab_file: Optional[str] = None
    do_lower_case: bool = True

    @classmethod
    def from_config(cls, train, vocab_file: Optional[str] = None,
                    do_lower_case: bool = True) -> "Resize":
        positions = str(train.get("init_extend_positions", "") or "")
        vocab = str(train.get("init_extend_vocab", "") or "")
        for key, value, rules in (("init_extend_positions", positions, POSITION_RULES),
                                  ("init_extend_vocab", vocab, VOCAB_RULES)):
            if value and value not in rules:
                raise ConfigError(f"config.train.{key}={value!r}; expected '' (refuse the "
                                  f"shape change) or one of {rules}")
        return cls(positions, vocab, vocab_file or None, bool(do_lower_case))

    @property
    def active(self) -> bool:
        return bool(self.positions or self.vocab)

    @property
    def growable(self) -> tuple[str, ...]:
        """The tensors it may give more rows (along their first axis only)."""
        return (((POSITIONS,) if self.positions else ())
                + ((WORDS, MLM_BIAS) if self.vocab else ()))


def rotary(config) -> bool:
    """A model with rotary positions: no position table, so max_position_embeddings only
    bounds the length (ModernBERT's 1,024 -> 8,192 context extension changes no tensor)."""
    return getattr(config, "position_embedding", "learned") == "rotary"


def check_architecture(theirs, ours, what: str, resize: Optional[Resize] = None) -> None:
    """BertConfigs `theirs` (a checkpoint's) and `ours` (config.model) agree on every key
    that shapes a tensor, except a longer max_position_embeddings or a larger vocab_size
    that `resize` takes; else an ArchitectureError naming each differing key. Between two
    rotary models max_position_embeddings shapes nothing and may differ either way."""
    resize = resize or Resize()
    diff = {k: (getattr(theirs, k, None), getattr(ours, k, None)) for k in ARCH_KEYS
            if getattr(theirs, k, None) != getattr(ours, k, None)}
    if rotary(theirs) and rotary(ours):
        diff.pop("max_position_embeddings", None)
    grown = {"max_position_embeddings": resize.positions, "vocab_size": resize.vocab}
    diff = {k: v for k, v in diff.items() if not (grown.get(k) and v[1] > v[0])}
    if diff:
        hints = [f"a longer {k} warm-starts with config.train.{option}='{rule}'"
                 for k, option, rule in (("max_position_embeddings", "init_extend_positions",
                                          POSITION_RULES[0]),
                                         ("vocab_size", "init_extend_vocab", VOCAB_RULES[0]))
                 if k in diff and diff[k][1] > diff[k][0] and not grown[k]]
        raise ArchitectureError(
            f"{what}: architecture differs from config.model (checkpoint, config): {diff}; "
            f"start from a checkpoint of this architecture, or set config.model to the "
            f"checkpoint's" + "".join(f"; {h}" for h in hints))


def check_warm_start(source: InitSource, ours, what: str,
                     resize: Optional[Resize] = None) -> None:
    """check_architecture, and for a larger vocabulary taken by `resize`, that the run's
    vocabulary extends the checkpoint's (`vocab_extension`). Reads only small files. A
    position rule for a rotary model is refused: it has no table to extend."""
    if resize is not None and resize.positions and rotary(ours):
        raise ConfigError(
            f"{what}: config.train.init_extend_positions={resize.positions!r}, but "
            f"config.model.position_embedding='rotary' has no position table to extend; a "
            f"rotary model warm-starts at any max_position_embeddings as it is: unset "
            f"train.init_extend_positions")
    check_architecture(source.config, ours, what, resize)
    if resize is not None and resize.vocab and ours.vocab_size > source.config.vocab_size:
        vocab_extension(source, resize, ours.vocab_size, what)


def vocab_extension(source: InitSource, resize: Resize, vocab_size: int, what: str):
    """(the checkpoint's tokenizer, the run's vocabulary entries) once the run's vocabulary
    (resize.vocab_file) is checked to hold the checkpoint's (source.vocab) as its first
    entries, one per row of the checkpoint's table, and to fit the run's vocab_size; else
    an InitCheckpointError in one line naming both files (and the first differing entry)."""
    what = f"{what}: config.train.init_extend_vocab={resize.vocab!r}"
    if not source.vocab:
        raise InitCheckpointError(f"{what} needs the checkpoint's vocabulary, and it records "
                                  f"none (a model directory's vocab.txt, a workdir's "
                                  f"data.vocab_file)")
    if not resize.vocab_file:
        raise InitCheckpointError(f"{what} needs the run's vocabulary: set "
                                  f"config.data.vocab_file")
    for path in (source.vocab, resize.vocab_file):
        if str(path).endswith(".model"):
            raise InitCheckpointError(f"{what}: {path} is a SentencePiece model; extending "
                                      f"a vocabulary takes WordPiece vocab.txt files")
    old = load_tokenizer(vocab_file=source.vocab, do_lower_case=resize.do_lower_case)
    new = load_tokenizer(vocab_file=resize.vocab_file).vocab
    rows = source.config.vocab_size
    both = f"run vocabulary {resize.vocab_file}, checkpoint vocabulary {source.vocab}"
    if len(old.vocab) != rows:
        raise InitCheckpointError(f"{what}: the checkpoint's vocabulary has {len(old.vocab)} "
                                  f"entries but its model {rows} rows ({both})")
    if not rows <= len(new) <= vocab_size:
        raise InitCheckpointError(f"{what}: the run's vocabulary has {len(new)} entries; "
                                  f"expected from the checkpoint's {rows} to config.model."
                                  f"vocab_size={vocab_size} ({both})")
    for i, (a, b) in enumerate(zip(old.vocab, new)):
        if a != b:
            raise InitCheckpointError(f"{what}: the run's vocabulary does not extend the "
                                      f"checkpoint's: entry {i} is {b!r} in "
                                      f"{resize.vocab_file} but {a!r} in {source.vocab}")
    return old, new


def grow_positions(table: np.ndarray, rows: int, rule: str = "repeat") -> np.ndarray:
    """A position table of `rows` rows from a learned one of n < rows: rows 0..n-1 as they
    are; "repeat" (Longformer's rule): row i = row i mod n, so rows n..2n-1 repeat rows
    0..n-1, and so on. Every position keeps a learned vector, and nearby positions keep
    the similarity the model learned between them."""
    if rule not in POSITION_RULES:
        raise ValueError(f"position rule {rule!r}; expected one of {POSITION_RULES}")
    return np.asarray(table)[np.arange(rows) % table.shape[0]]


def continuation_pieces(text: str, vocab: dict) -> Optional[list]:
    """The ids of `text` read as the inside of a word: WordPiece's greedy longest match
    with every piece a "##" continuation; None if some part has no piece."""
    ids, start = [], 0
    while start < len(text):
        end = len(text)
        while end > start and "##" + text[start:end] not in vocab:
            end -= 1
        if end == start:
            return None
        ids.append(vocab["##" + text[start:end]])
        start = end
    return ids


def subtoken_ids(entries: Sequence[str], old_tokenizer) -> list:
    """Each new vocabulary entry's ids under the checkpoint's vocabulary: a word is
    tokenized as text by the old WordPiece tokenizer (its casing, its punctuation split);
    a "##" piece as the inside of a word (`continuation_pieces`). Where the old
    vocabulary has no pieces for it, the old tokenizer's own answer: [UNK]."""
    vocab = {t: i for i, t in enumerate(old_tokenizer.vocab)}
    out = []
    for entry in entries:
        if entry.startswith("##") and len(entry) > 2:
            ids = continuation_pieces(entry[2:], vocab)
        else:
            ids = old_tokenizer.encode(entry)
        out.append(list(ids) if ids else [old_tokenizer.unk_id])
    return out


def grow_vocab(table: np.ndarray, pieces: Sequence[Sequence[int]],
               fresh: np.ndarray) -> np.ndarray:
    """A word-embedding table (or the MLM output bias, a vector) for a vocabulary extended
    by len(pieces) entries: the checkpoint's rows unchanged; new entry j's row = the mean
    of the checkpoint's rows `pieces[j]` (its ids under the old vocabulary: `subtoken_ids`),
    averaged in float64; rows past the run's vocabulary (padding, no entry) keep `fresh`,
    the run's own init. The MLM decoder is tied to this table, so it follows."""
    table = np.asarray(table)
    rows = [table] + [np.mean(table[list(ids)].astype(np.float64), axis=0,
                              keepdims=True).astype(table.dtype) for ids in pieces]
    grown = np.concatenate(rows, axis=0)
    return np.concatenate([grown, np.asarray(fresh, table.dtype)[len(grown):]], axis=0)


def taken_keys(source: InitSource, abstract_params, keys: Optional[Sequence[str]]) -> list:
    """The top-level trees a warm start takes: `keys`, or every one both have; "bert"
    must be among them."""
    have = source.top_keys()
    taken = list(keys) if keys is not None else [k for k in abstract_params if k in have]
    if "bert" not in have or "bert" not in taken:
        raise InitCheckpointError(f"train.init_checkpoint={source.path}: no 'bert' encoder params "
                        f"(top-level keys: {have})")
    return taken


def check_shapes(source: InitSource, abstract_params, keys: Optional[Sequence[str]],
                 resize: Optional[Resize] = None) -> dict:
    """Every tensor of the trees taken exists in `source` with the model's shape, or one
    `resize` grows; else a UserError naming the key and both shapes. Cheap (shapes only):
    call it before compiling anything. Returns the tensors to grow: {key: (old, new)}."""
    taken = taken_keys(source, abstract_params, keys)
    growable = resize.growable if resize is not None else ()
    got = source.shapes(*encoder_layout(abstract_params))
    want = flat_shapes({k: abstract_params[k] for k in taken})
    missing = sorted(k for k in want if k not in got)
    if missing:
        layout = layer_layout(got)
        hint = (f"; its layers are saved with model.scan_layers={layout} and a training "
                f"workdir restores only into that layout: set --config.model.scan_layers="
                f"{str(layout).lower()}, or start from a model directory (`python -m "
                f"bert_jax.convert from-workdir` writes one; params only)"
                if layout is not None and layout != layer_layout(want) else "")
        raise InitCheckpointError(
            f"train.init_checkpoint={source.path}: tensors missing: {missing[0]} ... "
            f"({len(missing)} in all; the checkpoint has {sorted(got)[:5]} ...){hint}")
    grown = {}
    for k, shape in sorted(want.items()):
        old, new = tuple(got[k]), tuple(shape)
        if old == new:
            continue
        # More rows of a tensor `resize` may grow, nothing else: taken.
        if k in growable and len(old) == len(new) and old[1:] == new[1:] and old[0] < new[0]:
            grown[k] = (old, new)
            continue
        c = source.config
        raise InitCheckpointError(
            f"train.init_checkpoint={source.path}: {k} has shape {old} in the "
            f"checkpoint, the model expects {new} " + (
                f"(checkpoint model hidden_size={c.hidden_size}, num_hidden_layers="
                f"{c.num_hidden_layers}, intermediate_size={c.intermediate_size})"
                if k.startswith("bert/") else "(another number of labels?)"))
    return grown


def grow(source: InitSource, params: dict, grown: dict, resize: Resize, fresh: dict) -> list:
    """Grows the tensors `grown` ({key: (old, new)}, from check_shapes) of the host numpy
    tree `params` in place by `resize`'s rules; `fresh` maps a key to a callable giving the
    run's own init of that tensor (the rows with no vocabulary entry). Returns one line per
    tensor for the run's log."""
    flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep="/")
    lines, vocab = [], None
    for key, (old, new) in sorted(grown.items()):
        if key == POSITIONS:
            flat[key] = grow_positions(flat[key], new[0], resize.positions)
            rule = (f"rows {old[0]}..{new[0] - 1} repeat rows 0..{old[0] - 1} "
                    f"(train.init_extend_positions={resize.positions!r})")
        else:
            if vocab is None:
                old_tok, entries = vocab_extension(source, resize, new[0],
                                                   f"train.init_checkpoint={source.path}")
                vocab = (subtoken_ids(entries[old[0]:], old_tok), len(entries))
            pieces, entries = vocab
            filler = fresh[key]() if entries < new[0] else np.zeros(new, flat[key].dtype)
            flat[key] = grow_vocab(flat[key], pieces, filler)
            rule = (f"rows {old[0]}..{entries - 1} = the mean of the checkpoint's rows of each "
                    f"new entry's pieces under its vocabulary {source.vocab} "
                    f"(train.init_extend_vocab={resize.vocab!r})"
                    + (f"; rows {entries}..{new[0] - 1} (no entry) fresh" if entries < new[0]
                       else ""))
        lines.append(f"warm start: resized {key} {old} -> {new}: {rule}")
    params.clear()
    params.update(flax.traverse_util.unflatten_dict(flat, sep="/"))
    return lines


def warm_start(source: InitSource, state, rng, abstract, shardings, tx, rng_sharding, *,
               keys: Optional[Sequence[str]] = None, full: bool = False,
               resize: Optional[Resize] = None):
    """(state, rng) with the trees taken from `source` (shapes checked by check_shapes,
    tensors that `resize` takes grown by `grow`) and a fresh optimizer state for them;
    `full`: a workdir's whole state and RNG."""
    if full and source.kind != "workdir":
        raise InitCheckpointError(f"config.train.init_state='full' needs a training workdir, but "
                        f"{source.path} is a {source.kind.replace('_', ' ')} (params only)")
    taken = taken_keys(source, abstract.params, keys)
    grown = check_shapes(source, abstract.params, keys, resize) if resize else {}
    if grown and full:
        raise InitCheckpointError(
            f"config.train.init_state='full' continues {source.path} as it was saved, but "
            f"{sorted(grown)} change shape; a resized warm start takes params only "
            f"(train.init_state='params')")
    lines = []
    if source.kind == "workdir" and not grown:
        ckpt = ckpt_lib.Checkpointer(locate(source.path)[0], every=1, read_only=True)
        try:
            if full:
                new_state, new_rng, _ = ckpt.restore(abstract, step=source.step,
                                                     rng_sharding=rng_sharding)
                return new_state, new_rng
            loaded = ckpt.restore_params({k: abstract.params[k] for k in taken},
                                         step=source.step)
        finally:
            ckpt.close()
    else:
        # A workdir's params as saved (check_shapes saw its layer layout is the run's).
        params = dict(source.params) if source.kind == "workdir" else numpy_params(
            source, abstract.params)
        params = {k: params[k] for k in taken}
        if grown:
            fresh = {k: (lambda k=k: _host(state.params, k)) for k in grown}
            lines = grow(source, params, grown, resize, fresh)
        loaded = place_numpy(params,
                             {k: abstract.params[k] for k in taken},
                             {k: shardings.params[k] for k in taken})
    if jax.process_index() == 0:
        fresh_keys = sorted(set(abstract.params) - set(taken))
        print(f"warm start: {taken} from {source.path}"
              + (f"; fresh init: {fresh_keys}" if fresh_keys else ""), flush=True)
        for line in lines:
            print(line, flush=True)
    params = {**state.params, **loaded}
    opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
    return state.replace(params=params, opt_state=opt_state), rng


def _host(params, key: str) -> np.ndarray:
    """The whole of tensor `key` ("/"-joined) of a tree of global arrays, on every process
    (a collective: every process calls it)."""
    from jax.experimental import multihost_utils

    leaf = flax.traverse_util.flatten_dict(flax.core.unfreeze(params), sep="/")[key]
    return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))


def place_numpy(tree, abstract, shardings):
    """A host numpy tree -> jax.Arrays of `abstract`'s shapes and dtypes on `shardings` (the
    same tree structure). Every process holds the host copy; each builds only its
    addressable shards (device_put cannot target other processes' devices)."""
    flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(tree))
    refs = flax.traverse_util.flatten_dict(abstract)
    places = flax.traverse_util.flatten_dict(shardings)
    return flax.traverse_util.unflatten_dict({
        k: jax.make_array_from_callback(
            ref.shape, places[k], lambda idx, x=np.asarray(flat[k], ref.dtype): x[idx])
        for k, ref in refs.items()})


def task_params(source: InitSource, abstract_params, shardings, task_name: str):
    """A fine-tuned model's params on the mesh: every tree of the task model
    (`abstract_params`, head included) from `source`, checked (a ConfigError naming a missing
    head, or check_shapes' naming a tensor and both shapes) before it is placed on
    `shardings`."""
    have = source.top_keys()
    for head in sorted(set(abstract_params) - {"bert"}):
        if head not in have:
            raise ConfigError(
                f"train.init_checkpoint={source.path} has no {head!r} head (it holds "
                f"{have}), which {task_name} predicts with (train.do_train=False): pass a "
                f"model fine-tuned on this task, e.g. a fine-tuning run's best_model/")
    check_shapes(source, abstract_params, list(abstract_params))
    return place_numpy(numpy_params(source, abstract_params), abstract_params, shardings)


def numpy_params(source: InitSource, abstract_params) -> dict:
    """A model or Hugging Face directory's params in the layer layout of `abstract_params`
    (predicting with a fine-tuned model's own head)."""
    scanned, layers = encoder_layout(abstract_params)
    params = dict(source.params)
    if scanned and "bert" in params:
        params["bert"] = stack_layers({"bert": params["bert"]}, layers)["bert"]
    return params

