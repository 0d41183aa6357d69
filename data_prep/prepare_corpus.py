"""Turn the raw sample corpus (Gutenberg plays, Britannica OCR) into BERT's input format.

BERT's input format: UTF-8 text, one sentence per line, a blank line between documents.

What a *document* is here (NSP samples its random B from another document, so we want
many of them):
  * plays: one scene (a new document at every `ACT ...` / `SCENE ...` heading);
  * poems: one numbered poem (a paragraph that is only a Roman numeral starts a new one);
  * Britannica: a group of `--paragraphs_per_doc` paragraphs (default 4).
Removed: Britannica page markers and editor's notes (`#...` lines, `p.772:0`,
`[[ed: ...]]`), the play preamble (title,
"by William Shakespeare", cast list), speaker labels (`HAMLET.`, `Ham.`), and stage
directions that are a whole paragraph in brackets. Sentences are split with a simple
rule (end punctuation followed by a capital), good enough for pre-training text.

    python data_prep/prepare_corpus.py --input=../shared/corpus --output=/tmp/corpus.txt
"""

from __future__ import annotations

import glob
import os
import re
import sys

if __package__ in (None, ""):  # run as a script: make `bert_jax` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from bert_jax.data.checks import files_named  # noqa: E402

# Page markers (`### START: ...`, `p.772:0`, possibly followed by an editor's note) and
# editor's notes on their own line (`[[ed: reformatted from the original]]`).
_PAGE_MARKER = re.compile(r"^(#.*|p\.\d+:\d+.*|\[\[ed:.*\]\])\s*$")
_INLINE_NOTE = re.compile(r"\s*\[\[ed:[^\]]*\]\]")
_HEADING = re.compile(r"^(ACT|SCENE|Scene|PROLOGUE|EPILOGUE|Prologue|Epilogue|INDUCTION)\b")
_NUMERAL = re.compile(r"^[IVXLC]+\.?$")
_SPEAKER = re.compile(r"^[A-Z][A-Za-z'&\- ]{0,40}\.$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z])")


def _paragraphs(text: str) -> list[list[str]]:
    paras, cur = [], []
    for line in text.splitlines():
        line = line.rstrip()
        if _PAGE_MARKER.match(line):
            continue
        line = _INLINE_NOTE.sub("", line)
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(cur)
            cur = []
    if cur:
        paras.append(cur)
    return paras


def _is_title(p: list[str]) -> bool:
    """A one-line paragraph like "THE SONNETS" or "by William Shakespeare"."""
    line = p[0]
    return len(p) == 1 and (line.startswith("by ") or
                            (len(line) < 60 and not line.endswith((".", "!", "?", ":"))))


def split_sentences(text: str) -> list[str]:
    text = re.sub(r"\s+", " ", text).strip()
    return [s for s in _SENTENCE_END.split(text) if s]


def convert_text(text: str, paragraphs_per_doc: int = 4) -> list[list[str]]:
    """Raw text of one source file -> documents, each a list of sentences."""
    paras = _paragraphs(text)
    is_play = any(_HEADING.match(p[0]) and p[0].startswith("ACT") for p in paras)
    if is_play:  # drop the preamble (title, author, cast list) before the first act
        first = next(i for i, p in enumerate(paras) if p[0].startswith("ACT"))
        paras = paras[first:]
    else:  # drop the title and "by ..." lines of a poem or an article
        paras = [p for i, p in enumerate(paras) if not (i < 3 and _is_title(p))]
    docs: list[list[str]] = []
    cur: list[str] = []
    n_paras = 0
    for p in paras:
        heading = _HEADING.match(p[0]) or (_NUMERAL.match(p[0]) and len(p) == 1)
        if heading or (not is_play and paragraphs_per_doc and n_paras >= paragraphs_per_doc
                       and not _NUMERAL.match(p[0])):
            if cur:
                docs.append(cur)
            cur, n_paras = [], 0
            if heading:
                continue
        if p[0].startswith("[") and p[-1].endswith("]"):
            continue  # a stage direction
        lines = p[1:] if (len(p) > 1 and _SPEAKER.match(p[0])) else p
        cur.extend(split_sentences(" ".join(lines)))
        n_paras += 1
    if cur:
        docs.append(cur)
    return [d for d in docs if d]


def format_documents(docs: list[list[str]]) -> str:
    return "".join("\n".join(d) + "\n\n" for d in docs)


FLAGS = flags.FLAGS


def main(argv):
    del argv
    for flag in ("input", "output"):
        if "://" in FLAGS[flag].value:
            raise app.UsageError(f"--{flag}={FLAGS[flag].value}: prepare_corpus reads and "
                                 f"writes local files; create_pretraining_data.py reads its "
                                 f"input and writes its TFRecords in a bucket itself")
    paths = sorted(glob.glob(os.path.join(FLAGS.input, "**", "*.txt"), recursive=True))
    if not paths:
        raise app.UsageError(f"no .txt files under {FLAGS.input}")
    out, empty = [], []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            docs = convert_text(f.read(), FLAGS.paragraphs_per_doc)
        out.append(format_documents(docs))
        if not docs:
            empty.append(path)
    if len(empty) == len(paths):  # before writing: an older output stays
        print(f"prepare_corpus: error: --input={FLAGS.input}: no text in its {len(paths)} "
              f".txt file(s) ({files_named(empty)}): empty, blank or only headings; "
              f"{FLAGS.output} not written", file=sys.stderr)
        return 2
    if empty:
        print(f"prepare_corpus: warning: {len(empty)} of {len(paths)} files hold no text "
              f"(empty, blank or only headings): {files_named(empty)}", file=sys.stderr)
    tmp = FLAGS.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(out))
    os.replace(tmp, FLAGS.output)
    print(f"wrote {FLAGS.output} from {len(paths)} files")
    return 0


if __name__ == "__main__":
    import sys

    if __package__ in (None, ""):  # run as a script: make `bert_jax` importable
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bert_jax import cli

    flags.DEFINE_string("input", None, "Directory of raw .txt files (searched recursively).")
    flags.DEFINE_string("output", None, "Output text file in BERT's input format.")
    flags.DEFINE_integer("paragraphs_per_doc", 4, "Paragraphs per document for prose.")
    flags.mark_flags_as_required(["input", "output"])
    cli.run(main)
