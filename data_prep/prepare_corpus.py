r"""Raw corpora -> BERT's input format: UTF-8 text, one sentence per line, a blank line
between documents (what create_pretraining_data.py reads).

    python data_prep/prepare_corpus.py --input=enwiki-latest-pages-articles.xml.bz2 \
        --output=/tmp/wiki/ --num_output_shards=64
    python data_prep/prepare_corpus.py --input=crawl.jsonl.zst --text_key=content \
        --output=/tmp/crawl/part
    python data_prep/prepare_corpus.py --input=../shared/corpus --format=sample \
        --output=/tmp/corpus.txt

Sources (--format, else recognised from the name; .bz2 / .gz / .zst are decompressed as
they are read, every source is streamed):
  * wiki: MediaWiki XML exports (Wikipedia's pages-articles dumps, multistream ones too):
    one document per article; talk, user, template, ... pages, redirects and
    disambiguation pages are dropped; the wikitext is stripped with mwparserfromhell
    (templates, tables, references, files and images, categories, interlanguage links,
    comments, math, galleries, headings, lists and the See also / References / External
    links / ... sections go; link labels and the text of bold, italic and HTML tags stay).
  * jsonl: JSON lines, the text under --text_key.
  * text: plain text, a document per file or per blank-line block (--doc_split).
  * parquet, arrow, or a Hugging Face `datasets` folder (made by save_to_disk; --split of
    a DatasetDict): the column --text_key, read with pyarrow in record batches.
  * sample: the raw sample corpus (Gutenberg plays, Britannica OCR; never auto-detected),
    made into data_prep/sample_corpus by data_prep/corpus/sample.py.

Cleaning, per document: ftfy (mojibake, HTML entities, control characters; NFC), sentence
splitting (data_prep/sentences.py), then --min_doc_chars / --min_sentences; exact and
near-duplicate documents are removed (data_prep/dedup.py) in input order. Each drop is
counted by reason, and bad input (a truncated file, a malformed page, a line that is not
JSON, text that is not UTF-8) is counted and named in the summary; with nothing usable
left the run is refused in one line and writes nothing.

The stages (data_prep/corpus/), which engines may run elsewhere (Apache Beam:
data_prep/beam/corpus.py):
  * read.py `read_documents(path, fmt, options, progress)`: a file -> RawDoc items (cheap:
    splits bytes, parses nothing); MediaWiki pages are cut and stripped by wiki.py;
  * clean.py `clean_document(raw, options) -> Cleaned(sentences | None, drop reason, note)`:
    pure, the per-document work (parse, strip, fix, split, length checks);
  * clean.py `fingerprint(sentences, options)`: pure, the expensive half of deduplication
    (the digest and MinHash signature of `dedup_text(sentences)`), done beside the cleaning;
  * clean.py `check_fingerprint(deduplicator, digest, signature)`: stateful,
    Deduplicator.check (data_prep/dedup.py) of that fingerprint, in memory;
    `minhasher(options).band_keys` and data_prep.dedup.greedy decide the same over keys
    grouped elsewhere;
  * output.py `format_document(sentences)`: the output text of one document; `Summary`.
`prepare(options)` below runs them locally: chunks of documents cleaned and fingerprinted by
--num_workers processes, results taken in input order by this process. With --dedup they
are spooled to disk (data_prep/dedup.py's DiskDeduplicator: memory that does not grow
with the corpus; beside the output, a copy of the documents' text plus about 0.9 KB per
document) and decided once all are read; the kept ones are written round-robin into
--num_output_shards files, so the output is the same bytes for any worker count. Outputs
are written under temporary names and renamed at the end; the spool is removed.
"""

from __future__ import annotations

import dataclasses
import glob
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

if __package__ in (None, ""):  # run as a script: make `bert_jax` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from bert_jax.data.features import files_named  # noqa: E402
from data_prep import workers  # noqa: E402
from data_prep.beam import load_beam  # noqa: E402
from data_prep.corpus.clean import clean_chunk, deduplicator  # noqa: E402
from data_prep.corpus.output import (Summary, format_document, nothing_usable,  # noqa: E402
                                     output_paths)
from data_prep.corpus.read import Progress, expand_inputs, read_documents  # noqa: E402
from data_prep.corpus.sample import convert_text, format_documents  # noqa: E402
from data_prep.corpus.types import Options, PrepareError, check_options  # noqa: E402


def _chunks(inputs, options: Options, progress: Progress):
    """(documents, input bytes read so far) in pieces of about --chunk_size_mb."""
    limit = max(1, int(options.chunk_size_mb * 1e6))
    chunk, size = [], 0
    for path, fmt in inputs:
        for doc in read_documents(path, fmt, options, progress):
            chunk.append(doc)
            size += len(doc.data) if doc.data is not None else 0
            if size >= limit:
                yield chunk, progress.position
                chunk, size = [], 0
        progress.file = None
        progress.done += os.path.getsize(path)
    if chunk:
        yield chunk, progress.position


def prepare(options: Options) -> Summary:
    """The command line's work in process: PrepareError for bad settings or input with
    nothing usable (nothing written then, an older output stays); OSError on a write."""
    from tqdm import tqdm

    o = options
    check_options(o)
    if o.runner != "local":
        beam = load_beam("corpus", o.runner, o.beam_options, PrepareError)
        return beam.prepare(o, o.runner, o.beam_options)
    if o.beam_options:
        raise PrepareError("--beam_options needs a Beam --runner (e.g. DirectRunner)")
    inputs = expand_inputs(o.input, o.format, o.split)
    outputs = output_paths(o.output, o.num_output_shards)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    num_workers = o.num_workers or cores or 1
    t0 = time.time()
    summary = Summary(outputs=outputs)
    progress = Progress()
    total = sum(os.path.getsize(p) for p, _ in inputs)
    bar = tqdm(total=total, unit="B", unit_scale=True, disable=not o.progress,
               desc="prepare_corpus", file=sys.stderr)
    tmps = [f"{p}.tmp-{os.getpid()}" for p in outputs]
    files, pool, spool = [], None, None

    def write(text: bytes, sentences: int) -> None:
        files[summary.kept % len(files)].write(text)
        summary.keep(sentences, len(text))

    try:
        for p in outputs:
            os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
        files = [open(t, "wb") for t in tmps]
        if o.dedup:
            spool = deduplicator(o, f"{tmps[0]}.dedup")
        chunks = _chunks(inputs, o, progress)
        if num_workers <= 1:
            results = ((clean_chunk(c, o), pos) for c, pos in chunks)
        else:
            context = mp.get_context("fork" if workers.fork_safe() else "spawn")
            pool = ProcessPoolExecutor(num_workers, mp_context=context)
            results = workers.ordered(pool, clean_chunk, (((c, o), pos) for c, pos in chunks),
                                      2 * num_workers)
        done = 0
        for cleaned, position in results:
            for c, fp in cleaned:
                summary.documents += 1
                if c.reason is not None:
                    summary.drop(c.reason, c.note)
                    continue
                text = format_document(c.sentences).encode("utf-8")
                if spool is not None:  # decided at the end, over all documents
                    spool.add(*fp, text, len(c.sentences))
                else:
                    write(text, len(c.sentences))
            bar.update(position - done)
            done = position
        summary.bytes_in = progress.done
        if spool is not None:
            bar.set_description("prepare_corpus: deduplicating")
            spool.finish()
            summary.dropped["exact duplicate"] += spool.exact
            summary.dropped["near duplicate"] += spool.near
            with tqdm(total=spool.kept, unit="doc", desc="prepare_corpus: writing",
                      disable=not o.progress, file=sys.stderr) as wbar:
                for text, sentences in spool.kept_payloads():
                    write(text, sentences)
                    wbar.update()
        if not summary.kept:
            raise PrepareError(nothing_usable(o, summary))
        for f in files:
            f.close()
        for t, p in zip(tmps, outputs):
            os.replace(t, p)
    except BaseException:
        for f in files:
            f.close()
        for t in tmps:
            if os.path.exists(t):
                os.remove(t)
        raise
    finally:
        bar.close()
        if spool is not None:
            spool.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    summary.seconds = time.time() - t0
    return summary


# ----------------------------------------------------------------------------- command line

FLAGS = flags.FLAGS


def _define_flags() -> None:
    define = {"bool": flags.DEFINE_bool, "int": flags.DEFINE_integer,
              "float": flags.DEFINE_float}
    for f in dataclasses.fields(Options):
        kind = str(f.type).split(" ")[0]
        define.get(kind, flags.DEFINE_string)(f.name, f.default, f.metadata["help"])


def _main_sample(o: Options) -> int:
    """--format=sample: the raw sample corpus's converter over a folder of .txt files, into
    one output file."""
    paths = sorted(glob.glob(os.path.join(o.input, "**", "*.txt"), recursive=True))
    if not paths:
        raise app.UsageError(f"no .txt files under {o.input}")
    out, empty = [], []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            docs = convert_text(f.read(), o.paragraphs_per_doc)
        out.append(format_documents(docs))
        if not docs:
            empty.append(path)
    if len(empty) == len(paths):  # before writing: an older output stays
        print(f"prepare_corpus: error: --input={o.input}: no text in its {len(paths)} "
              f".txt file(s) ({files_named(empty)}): empty, blank or only headings; "
              f"{o.output} not written", file=sys.stderr)
        return 2
    if empty:
        print(f"prepare_corpus: warning: {len(empty)} of {len(paths)} files hold no text "
              f"(empty, blank or only headings): {files_named(empty)}", file=sys.stderr)
    tmp = o.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(out))
    os.replace(tmp, o.output)
    print(f"wrote {o.output} from {len(paths)} files")
    return 0


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    o = Options(**{f.name: FLAGS[f.name].value for f in dataclasses.fields(Options)})
    if not o.input or not o.output:
        raise app.UsageError("--input and --output are required")
    for flag in ("input", "output"):
        if "://" in getattr(o, flag) and o.runner == "local":
            raise app.UsageError(f"--{flag}={getattr(o, flag)}: prepare_corpus reads and "
                                 f"writes local files; on Beam (--runner) it reads and "
                                 f"writes buckets")
    if o.format == "sample":
        return _main_sample(o)
    try:
        summary = prepare(o)  # a PrepareError: one line, exit 2 (cli.run)
    except KeyboardInterrupt:
        print("prepare_corpus: interrupted; no output written", file=sys.stderr)
        return 130
    print(summary.text())
    print("wrote " + ", ".join(summary.outputs))
    if summary.dropped["bad input"]:
        print(f"prepare_corpus: warning: {summary.dropped['bad input']} bad input(s) skipped "
              f"(named in the summary)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from bert_jax import cli

    cli.quiet_native_logs()
    _define_flags()
    cli.run(main)
