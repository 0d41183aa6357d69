"""Tokenizers for BERT: WordPiece (a BERT `vocab.txt`) or SentencePiece (a `.model` file),
for every caller: pre-training input, data_prep, the tasks, the converters, warm starts.

Both go through well-kept libraries, never hand-written splitting:

* WordPiece through HF `tokenizers` (Rust): `BertNormalizer` (control-character cleanup,
  CJK characters split out, lower-casing and accent stripping when uncased),
  `BertPreTokenizer` (whitespace and punctuation split) and `WordPiece` (greedy
  longest-match-first with the `##` continuation prefix, words over 100 characters become
  `[UNK]`). Ids equal those of the original BERT `FullTokenizer` / `transformers`'
  slow `BertTokenizer` (checked against goldens in tests/test_tokenization.py).
* SentencePiece through `sentencepiece`, lower-casing first when `do_lower_case`.

Special tokens in the *text* are not special: "[MASK]" in a sentence is tokenized as
"[", "mask", "]", as the original `create_pretraining_data.py` does.

    tok = load_tokenizer(vocab_file="vocab.txt", do_lower_case=True)
    tok.encode("Hello world")            # -> [7592, 2088]   (no [CLS]/[SEP])
    tok.tokenize_words("unaffable x")    # -> [["una", "##ffa", "##ble"], ["x"]]
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
from etils import epath

from bert_jax.errors import UserError

# Special tokens every vocabulary must have for pre-training (the original names).
# Printable ASCII that is neither a letter, a digit nor a space: all of it is punctuation
# to BERT (each character is split off as its own word).
_ASCII_PUNCT = [bytes([c]) for c in range(33, 127) if not chr(c).isalnum()]
REQUIRED_SPECIAL = ("[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_INPUT_CHARS_PER_WORD = 100  # BERT's WordpieceTokenizer default: longer words -> [UNK]


class VocabError(UserError, ValueError):
    """A vocabulary file that cannot be used (missing special tokens, empty, unreadable), or
    one that does not fit the text (most of it becomes [UNK])."""


# The share of [UNK] among a text's word pieces tells whether the vocabulary fits the text.
# Measured on data_prep/sample_corpus with data_prep/bert_uncased_vocab.txt: 0.00% as it
# should be read (lower-cased); 14% when not lower-cased (the casing does not match the
# vocabulary); Chinese text through it 65%; a vocabulary file of another format (each line
# "token id") 100%. Above UNK_WARN the vocabulary or the casing is most likely wrong: a
# warning with the fraction. Above UNK_ERROR most of the text never reaches the model, which
# would learn nothing from it: an error wherever text is checked before training (the data
# doctor, the pre-training input check, fine-tuning features). data_prep only warns: its
# output is still well-formed, and the doctor or the run refuses it.
UNK_WARN = 0.05
UNK_ERROR = 0.5


def check_unk_rate(unk: int, total: int, where: str, vocab: str, *,
                   error_above: float | None = UNK_ERROR) -> str | None:
    """A warning naming `where` and `vocab` when `unk` of `total` word pieces (specials
    excluded) is UNK_WARN or more, else None; raises VocabError above `error_above` (None:
    never). The caller logs the warning its own way (CLI, doctor report, logger)."""
    fraction = unk / total if total else 0.0
    if fraction < UNK_WARN:
        return None
    message = (f"{where}: {fraction:.1%} of {total:,} word pieces are [UNK] with the "
               f"vocabulary {vocab}, expected under {UNK_WARN:.0%} for a vocabulary that "
               f"fits the text: use the model's own vocabulary and its casing "
               f"(do_lower_case)")
    if error_above is not None and fraction > error_above:
        raise VocabError(message)
    return message


class _BaseTokenizer:
    """Shared id <-> token bookkeeping. Subclasses set `vocab` and implement `_encode_ids`."""

    vocab: list[str]
    source: str  # the file the vocabulary came from (for error messages)

    def _init_vocab(self, vocab: list[str], specials: dict[str, int | None]) -> None:
        self.vocab = vocab
        # Later duplicates win, like the original `load_vocab` (an OrderedDict update).
        self._token_to_id = {tok: i for i, tok in enumerate(vocab)}
        missing = [name for name in REQUIRED_SPECIAL if specials.get(name) is None]
        if missing:
            raise VocabError(
                f"{self.source}: vocabulary lacks special token(s) {', '.join(missing)} "
                f"(needs {', '.join(REQUIRED_SPECIAL)}; [PAD] recommended). "
                "Build one with data_prep/build_vocab.py.")
        self.unk_id = specials["[UNK]"]
        self.cls_id = specials["[CLS]"]
        self.sep_id = specials["[SEP]"]
        self.mask_id = specials["[MASK]"]
        # Original BERT pads with id 0 whatever token sits there; keep that when [PAD] is absent.
        pad = specials.get("[PAD]")
        self.pad_id = 0 if pad is None else pad

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab[int(i)] for i in ids]

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
        return [self._token_to_id.get(t, self.unk_id) for t in tokens]

    def tokenize(self, text: str) -> list[str]:
        return self.convert_ids_to_tokens(self.encode(text))

    def tokenize_words(self, text: str) -> list[list[str]]:
        """Tokens grouped by the word they came from: `<list[list[str]]>[words][pieces]`."""
        return [self.convert_ids_to_tokens(ids) for ids in self.encode_words(text)]

    def encode_words(self, text: str) -> list[list[int]]:
        """Ids grouped by word (a word = a new group at every non-continuation piece)."""
        words: list[list[int]] = []
        cont = self.is_continuation
        for i in self.encode(text):
            if words and cont[i]:
                words[-1].append(i)
            else:
                words.append([i])
        return words

    def encode_pretokenized(self, words: Sequence[str]) -> list[list[int]]:
        """Ids of each pre-split word (e.g. CoNLL NER tokens): `<list[list[int]]>[words][pieces]`.

        A word that yields no pieces (e.g. only control characters) gives an empty list, so
        callers can keep the word <-> label alignment.
        """
        return [self.encode(w) for w in words]


class WordPieceTokenizer(_BaseTokenizer):
    """BERT WordPiece from a `vocab.txt`, through `tokenizers`."""

    def __init__(self, vocab_file: str, do_lower_case: bool = True):
        from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

        self.source = vocab_file
        self.do_lower_case = do_lower_case
        vocab = _read_vocab_txt(vocab_file)
        specials = {name: None for name in ("[PAD]",) + REQUIRED_SPECIAL}
        for i, tok in enumerate(vocab):
            if tok in specials:
                specials[tok] = i
        self._init_vocab(vocab, specials)
        tk = Tokenizer(models.WordPiece(
            vocab=dict(self._token_to_id), unk_token="[UNK]",
            continuing_subword_prefix="##",
            max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
        # strip_accents=None follows lowercase, exactly BERT's rule (uncased strips accents).
        tk.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None,
            lowercase=do_lower_case)
        tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self.backend = tk
        self._reset_cache()
        self.is_continuation = np.array([t.startswith("##") for t in vocab], dtype=bool)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of many texts at once (same ids as `encode` on each)."""
        flat, lens = self.encode_batch_flat(texts)
        bounds = np.concatenate([[0], np.cumsum(lens)]).tolist()
        flat_l = flat.tolist()
        return [flat_l[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def encode_batch_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Ids of many texts back to back: (ids <int32>[total], lengths <int64>[len(texts)]).

        Why not only `backend.encode_batch`: `tokenizers`' full BERT pipeline is the
        dominant cost of data prep (benchmarks/RESULTS.md). Printable-ASCII lines (most of
        any English corpus) take a shortcut with identical output: for them BERT's
        normalizer is just lower-casing, and its pre-tokenizer keeps runs of letters/digits
        and splits off every other printable character (all ASCII punctuation), so we split
        with a regex and look each word up in a cache filled by the library itself. Every
        other line goes through the library. Checked against the library and against transformers'
        BertTokenizer in tests/test_tokenization.py.
        """
        n = len(texts)
        fast = np.fromiter((t.isascii() and t.isprintable() for t in texts), dtype=bool, count=n)
        fast_idx = np.flatnonzero(fast)
        slow_idx = np.flatnonzero(~fast)
        # Fast lines all at once: pad every punctuation byte with spaces, split on
        # whitespace; NUL (never in a printable line) marks each line end.
        joined = " \x00 ".join([texts[i] for i in fast_idx]) + " \x00" if len(fast_idx) else ""
        joined = (joined.lower() if self.do_lower_case else joined).encode("ascii")
        for p in _ASCII_PUNCT:
            if p in joined:
                joined = joined.replace(p, b" " + p + b" ")
        widx = self._word_indices(joined.split())
        wlen = self._cache_len[widx]
        ends = np.cumsum(wlen)
        line_end_tok = ends[widx == 0]  # index 0 is the line marker (no ids)
        fast_lens = np.diff(np.concatenate([[0], line_end_tok]))
        # Word ids -> token ids: gather each word's slice of the cache's flat id array.
        total = int(ends[-1]) if len(ends) else 0
        offs = np.repeat(self._cache_start[widx] - (ends - wlen), wlen)
        fast_flat = self._cache_ids[offs + np.arange(total)]
        # Other lines: the library, unchanged.
        slow_ids = []
        if len(slow_idx):
            encs = self.backend.encode_batch_fast([texts[i] for i in slow_idx],
                                                  add_special_tokens=False)
            slow_ids = [e.ids for e in encs]
        slow_lens = np.fromiter(map(len, slow_ids), dtype=np.int64, count=len(slow_ids))
        slow_flat = np.fromiter(itertools.chain.from_iterable(slow_ids), dtype=np.int32,
                                count=int(slow_lens.sum()))
        if not len(slow_idx):
            return fast_flat.astype(np.int32), fast_lens.astype(np.int64)
        # Interleave both in line order.
        lens = np.empty(n, dtype=np.int64)
        lens[fast_idx] = fast_lens
        lens[slow_idx] = slow_lens
        src = np.concatenate([fast_flat.astype(np.int32), slow_flat])
        src_start = np.empty(n, dtype=np.int64)
        src_start[fast_idx] = np.cumsum(fast_lens) - fast_lens
        src_start[slow_idx] = len(fast_flat) + np.cumsum(slow_lens) - slow_lens
        out_end = np.cumsum(lens)
        flat = src[np.repeat(src_start - (out_end - lens), lens) + np.arange(int(out_end[-1]))]
        return flat, lens

    def _word_indices(self, words: list[bytes]) -> np.ndarray:
        """Cache index of each word, adding the missing ones (tokenized by the library)."""
        cache = self._word_cache
        if len(cache) > 1_000_000:  # bound memory on corpora with huge vocabularies
            self._reset_cache()
            cache = self._word_cache
        idx = np.fromiter(map(cache.get, words, itertools.repeat(-1)), dtype=np.int64,
                          count=len(words))
        if (idx < 0).any():
            missing = list({words[i] for i in np.flatnonzero(idx < 0).tolist()})
            # These words are already normalized and pre-tokenized (printable ASCII, split
            # as BertPreTokenizer does): only the library's WordPiece model is left to run,
            # much cheaper per word than a full encode (benchmarks/RESULTS.md).
            wordpiece = self.backend.model.tokenize
            ids = [[t.id for t in wordpiece(w.decode("ascii"))] for w in missing]
            lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            base = len(self._cache_ids)
            new_ids = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32,
                                  count=int(lens.sum()))
            self._cache_start = np.concatenate(
                [self._cache_start, base + np.cumsum(lens) - lens])
            self._cache_len = np.concatenate([self._cache_len, lens])
            self._cache_ids = np.concatenate([self._cache_ids, new_ids])
            first = len(cache)
            cache.update((w, first + k) for k, w in enumerate(missing))
            idx = np.fromiter(map(cache.__getitem__, words), dtype=np.int64, count=len(words))
        return idx

    def _reset_cache(self) -> None:
        # ASCII words (bytes) -> index; entry 0 is encode_batch_flat's line marker: no ids.
        self._word_cache: dict[bytes, int] = {b"\x00": 0}
        self._cache_start = np.zeros(1, dtype=np.int64)
        self._cache_len = np.zeros(1, dtype=np.int64)
        self._cache_ids = np.zeros(0, dtype=np.int32)

    def encode_words(self, text: str) -> list[list[int]]:
        # Word boundaries from the pre-tokenizer (word_ids), not from "##": a word of
        # [UNK] or a word split right after an [UNK] still groups correctly.
        enc = self.backend.encode(text, add_special_tokens=False)
        words: list[list[int]] = []
        last = None
        for i, w in zip(enc.ids, enc.word_ids):
            if words and w == last:
                words[-1].append(i)
            else:
                words.append([i])
            last = w
        return words


class SentencePieceTokenizer(_BaseTokenizer):
    """A SentencePiece model (ALBERT-style: pieces starting with U+2581 begin a word)."""

    # Accepted spellings of each special token, first match wins.
    _ALIASES = {"[PAD]": ("[PAD]", "<pad>"), "[UNK]": ("[UNK]", "<unk>"),
                "[CLS]": ("[CLS]", "<cls>"), "[SEP]": ("[SEP]", "<sep>"),
                "[MASK]": ("[MASK]", "<mask>")}

    def __init__(self, spm_model_file: str, do_lower_case: bool = True):
        import sentencepiece as spm

        self.source = spm_model_file
        self.do_lower_case = do_lower_case
        model = epath.Path(spm_model_file)
        if not model.is_file():
            raise FileNotFoundError(f"SentencePiece model not found: {spm_model_file}")
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(model.read_bytes())
        except Exception as e:  # sentencepiece raises OSError/RuntimeError with C++ text
            raise VocabError(f"{spm_model_file}: not a SentencePiece model ({e})") from None
        vocab = [self.sp.IdToPiece(i) for i in range(self.sp.GetPieceSize())]
        index = {tok: i for i, tok in enumerate(vocab)}
        specials = {}
        for name, aliases in self._ALIASES.items():
            specials[name] = next((index[a] for a in aliases if a in index), None)
        if specials["[UNK]"] is None and self.sp.unk_id() >= 0:
            specials["[UNK]"] = self.sp.unk_id()
        self._init_vocab(vocab, specials)
        control = {self.cls_id, self.sep_id, self.mask_id, self.pad_id}
        self.is_continuation = np.array(
            [not t.startswith("\u2581") and i not in control for i, t in enumerate(vocab)],
            dtype=bool)

    def _prep(self, text: str) -> str:
        # SentencePiece normalizes (NFKC) itself; lower-case first when uncased, as ALBERT.
        return text.lower() if self.do_lower_case else text

    def encode(self, text: str) -> list[int]:
        return self.sp.EncodeAsIds(self._prep(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.Encode([self._prep(t) for t in texts], out_type=int)

    def encode_batch_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = self.encode_batch(texts)
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32,
                           count=int(lens.sum()))
        return flat, lens


def _read_vocab_txt(path: str) -> list[str]:
    vocab_path = epath.Path(path)  # local, or gs:// (a model directory in a bucket)
    if not vocab_path.is_file():
        raise FileNotFoundError(f"vocab file not found: {path}")
    raw = vocab_path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise VocabError(f"{path}: not UTF-8 text at byte {e.start}") from None
    # One token per line; the original strips each line. Drop only the final empty line.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    vocab = [t.strip() for t in lines]
    if not vocab:
        raise VocabError(f"{path}: empty vocabulary")
    return vocab


def load_tokenizer(vocab_file: str | None = None, spm_model_file: str | None = None,
                   do_lower_case: bool = True) -> WordPieceTokenizer | SentencePieceTokenizer:
    """WordPiece from `vocab_file` or SentencePiece from `spm_model_file` (exactly one).

    Raises FileNotFoundError (missing file) or VocabError (no [UNK]/[CLS]/[SEP]/[MASK])
    naming the file, before any text is processed.
    """
    if bool(vocab_file) == bool(spm_model_file):
        raise ValueError("give exactly one of vocab_file (WordPiece) or spm_model_file "
                         f"(SentencePiece); got vocab_file={vocab_file!r}, "
                         f"spm_model_file={spm_model_file!r}")
    if spm_model_file:
        return SentencePieceTokenizer(spm_model_file, do_lower_case=do_lower_case)
    return WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case)


def vocab_info(cfg, with_unk: bool = False) -> dict[str, int]:
    """vocab_size and the special ids (pad / cls / sep / mask; with_unk: and unk_id, None
    for a vocabulary without [UNK]), from data.vocab_file if set.

    data.vocab_file: a WordPiece vocab.txt (one token per line; gs:// works) or a
    SentencePiece `.model` (load_tokenizer). A vocabulary without [PAD]
    pads with id 0, as the original tool does.
    """
    unk = {}
    if cfg.get("vocab_file"):
        if str(cfg.vocab_file).endswith(".model"):
            tok = load_tokenizer(spm_model_file=cfg.vocab_file)
            unk = {"unk_id": tok.unk_id} if with_unk else {}
            return dict(vocab_size=tok.vocab_size, pad_id=tok.pad_id, cls_id=tok.cls_id,
                        sep_id=tok.sep_id, mask_id=tok.mask_id, **unk)
        path = epath.Path(cfg.vocab_file)
        if not path.exists():
            raise FileNotFoundError(f"data.vocab_file {cfg.vocab_file} does not exist")
        lines = path.read_text().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        tokens = [line.strip() for line in lines]
        index = {tok: i for i, tok in enumerate(tokens)}  # later duplicates win (original)
        ids = {"pad_id": index.get("[PAD]", 0)}
        for key, tok in (("cls_id", "[CLS]"), ("sep_id", "[SEP]"), ("mask_id", "[MASK]")):
            if tok not in index:
                raise ValueError(f"{cfg.vocab_file}: no {tok} token in the vocabulary")
            ids[key] = index[tok]
        unk = {"unk_id": index.get("[UNK]")} if with_unk else {}
        return dict(vocab_size=len(tokens), **ids, **unk)
    unk = {"unk_id": cfg.get("unk_id", 100)} if with_unk else {}
    return dict(vocab_size=cfg.vocab_size, pad_id=cfg.pad_id, cls_id=cfg.cls_id,
                sep_id=cfg.sep_id, mask_id=cfg.mask_id, **unk)
