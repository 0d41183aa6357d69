"""The corpus front door (data_prep/prepare_corpus.py) on inputs written here: a MediaWiki
export (plain, bz2, a truncated multistream bz2), JSON lines (plain, gzip, zstd, with bad
lines), a `datasets` folder and parquet, plain text; the exact text, the document count and
the drops; the same bytes for 1 and 2 workers; then create_pretraining_data and the data
doctor on what it wrote."""

from __future__ import annotations

import bz2
import gzip
import json
import os
import re
import subprocess
import sys
from xml.sax.saxutils import escape

import pytest

from data_prep import prepare_corpus as pc
from data_prep.corpus import clean, read
from data_prep.corpus import wiki as mediawiki
from data_prep.corpus.output import format_document
from data_prep.corpus.types import Options, PrepareError
from data_prep.dedup import DiskDeduplicator
from data_prep.sentences import splitter
from tests.data_prep.helpers import REPO, SAMPLE, VOCAB

ARTICLE = """{{Short description|Political philosophy}}
{{Infobox ideology
| name = Anarchism
| image = {{Flag|black}}
}}
'''Anarchism''' is a [[political philosophy|philosophy]] and [[Social movement|movement]] \
that is skeptical of all [[authority]].<ref name="ms">{{cite book |last=McLaughlin \
|title=Anarchism |year=2007}}</ref> Its followers are called [[anarchist]]s.<ref name="ms"/> \
The word comes from ''an'' and ''archos'' ({{lang-grc|ἀρχός}}), "ruler".<!-- etymology -->
[[File:Anarchy-symbol.svg|thumb|The [[circle-A]] symbol of ''anarchy'']]

{| class="wikitable"
|-
! Year !! Event
|-
| 1840 || {{nowrap|Proudhon writes}}
|}

== History ==
The earliest anarchist themes appear in ''the 6th century BC, among the works of \
[[Taoism|Taoist]] philosopher [[Laozi]]''. <span class="x">Modern anarchism</span> grew out \
of the [[Age of Enlightenment|Enlightenment]] &ndash; see \
[https://example.org/history the history page] for more.
* A list item that is not prose.
# A numbered item.

=== Thought ===
Anarchists value freedom.<ref>{{cite web |url=https://example.org}}</ref> <math>x^2</math>They \
reject the state.

== See also ==
* [[Libertarianism]]

== References ==
{{reflist}}

[[Category:Anarchism]]
[[de:Anarchismus]]
"""

LAOZI = """'''Laozi''' was an ancient [[China|Chinese]] philosopher and writer. He is the \
reputed author of the ''[[Tao Te Ching]]''.<ref>{{cite|x}}</ref>

He is a founder of [[philosophical Taoism]], and a deity in religious Taoism. The text is \
short."""

ARTICLE_TEXT = (
    "Anarchism is a philosophy and movement that is skeptical of all authority.\n"
    "Its followers are called anarchists.\n"
    "The word comes from an and archos, \"ruler\".\n"
    "The earliest anarchist themes appear in the 6th century BC, among the works of Taoist "
    "philosopher Laozi.\n"
    "Modern anarchism grew out of the Enlightenment \u2013 see the history page for more.\n"
    "Anarchists value freedom.\n"
    "They reject the state.\n\n")
LAOZI_TEXT = ("Laozi was an ancient Chinese philosopher and writer.\n"
              "He is the reputed author of the Tao Te Ching.\n"
              "He is a founder of philosophical Taoism, and a deity in religious Taoism.\n"
              "The text is short.\n\n")

HEADER = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" '
          'xml:lang="en">\n  <siteinfo>\n    <sitename>Wikipedia</sitename>\n'
          '    <namespaces>\n      <namespace key="0" case="first-letter" />\n'
          '      <namespace key="1" case="first-letter">Talk</namespace>\n'
          '    </namespaces>\n  </siteinfo>\n')
FOOTER = "</mediawiki>\n"


def page(pid: int, title: str, text: str, ns: int = 0, redirect: str | None = None) -> str:
    r = f'    <redirect title="{escape(redirect)}" />\n' if redirect else ""
    return (f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n"
            f"    <id>{pid}</id>\n{r}    <revision>\n      <id>{pid}00</id>\n"
            f"      <timestamp>2024-01-01T00:00:00Z</timestamp>\n"
            f"      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
            f"      <text bytes=\"{len(text)}\" xml:space=\"preserve\">{escape(text)}</text>\n"
            f"    </revision>\n  </page>\n")


PAGES = [
    page(12, "Anarchism", ARTICLE),
    page(10, "AccessibleComputing", "#REDIRECT [[Computer accessibility]]",
         redirect="Computer accessibility"),
    page(20, "Mercury", "'''Mercury''' may refer to:\n* [[Mercury (planet)]]\n"
         "* [[Mercury (element)]]\n{{disambiguation}}"),
    page(30, "Talk:Anarchism", "This talk page discusses the article at length. " * 3, ns=1),
    page(40, "Stub", "A stub.{{stub}}"),
    page(50, "Anarchism (copy)", ARTICLE),
    # Not well-formed: a bare '&' in the title.
    "  <page>\n    <title>Broken & page</title>\n    <ns>0</ns>\n    <id>60</id>\n"
    "    <revision><text>x</text></revision>\n  </page>\n",
    page(70, "Laozi", LAOZI),
]
WIKI_DROPS = {"non-article": 1, "redirect": 1, "disambiguation": 1, "too short": 1,
              "exact duplicate": 1, "near duplicate": 0, "bad input": 1}


def options(path, out, **kw) -> Options:
    return Options(input=str(path), output=str(out),
                   **{"progress": False, "num_workers": 1, "min_doc_chars": 40, **kw})


def cli(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(REPO / "data_prep" / "prepare_corpus.py"),
                           "--noprogress", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)


def make_tfrecords_and_check(text_file, tmp_path) -> int:
    """create_pretraining_data then the data doctor on a prepared corpus; the records."""
    from bert_jax.data import inspect
    from data_prep import create_pretraining_data as cpd

    out = tmp_path / "records.tfrecord"
    result = cpd.create(cpd.Options(
        input_file=str(text_file), output_file=str(out), vocab_file=VOCAB, max_seq_length=32,
        max_predictions_per_seq=5, dupe_factor=1, num_workers=1, progress=False))
    assert result.stats.instances > 0
    report = inspect.report(str(out), vocab_file=VOCAB, max_seq_length=32,
                            max_predictions_per_seq=5, verify=True)
    assert report["problems"] == [] and report["num_records"] == result.stats.instances
    return report["num_records"]


@pytest.fixture(scope="module")
def wiki(tmp_path_factory):
    d = tmp_path_factory.mktemp("wiki")
    xml = HEADER + "".join(PAGES) + FOOTER
    (d / "pages.xml").write_text(xml, encoding="utf-8")
    (d / "pages.xml.bz2").write_bytes(bz2.compress(xml.encode()))
    # Multistream, as Wikipedia's dumps: the second stream cut in its middle.
    second = bz2.compress(("".join(PAGES[3:]) + FOOTER).encode())
    (d / "cut.xml.bz2").write_bytes(bz2.compress((HEADER + "".join(PAGES[:3])).encode())
                                    + second[:len(second) // 2])
    return d


def test_wikipedia_export_to_text_then_tfrecords(wiki, tmp_path):
    out = tmp_path / "corpus.txt"
    r = cli(f"--input={wiki / 'pages.xml'}", f"--output={out}", "--min_doc_chars=40",
            "--num_workers=1")
    assert r.returncode == 0, r.stderr
    assert out.read_text(encoding="utf-8") == ARTICLE_TEXT + LAOZI_TEXT
    lines = r.stdout.splitlines()
    assert "documents in     8" in lines and "kept             2" in lines
    for reason, n in WIKI_DROPS.items():
        assert f"dropped, {reason + ':':<16} {n}" in lines
    assert "sentences        11" in lines
    assert (f"bad input: {wiki / 'pages.xml'}: page 60: malformed XML (not well-formed "
            f"(invalid token): line 2, column 19)") in lines
    assert r.stderr.strip().endswith("1 bad input(s) skipped (named in the summary)")
    assert make_tfrecords_and_check(out, tmp_path) > 0


def test_bz2_and_truncated_multistream_bz2(wiki, tmp_path):
    s = pc.prepare(options(wiki / "pages.xml.bz2", tmp_path / "a.txt"))
    assert (tmp_path / "a.txt").read_text() == ARTICLE_TEXT + LAOZI_TEXT
    assert (s.documents, s.kept, dict(s.dropped)) == (8, 2, WIKI_DROPS)
    # The first stream's pages are kept; the cut is one bad input, named.
    s = pc.prepare(options(wiki / "cut.xml.bz2", tmp_path / "b.txt"))
    assert (tmp_path / "b.txt").read_text() == ARTICLE_TEXT
    assert (s.documents, s.kept) == (4, 1)
    assert (s.dropped["redirect"], s.dropped["disambiguation"], s.dropped["bad input"]) == (1, 1, 1)
    assert s.bad == [f"{wiki / 'cut.xml.bz2'}: truncated or corrupt (Compressed file ended "
                     f"before the end-of-stream marker was reached); what was read before is "
                     f"kept"]


def _compact(xml: str) -> str:
    """The same export laid out as ElementTree writes it: no line breaks between tags, so
    `</revision></page>` share a line (and `<page>` follows `</page>` on it)."""
    return re.sub(r">\s+<", "><", xml)


@pytest.mark.parametrize("chunk", [None, 5, 64])
def test_every_page_of_a_complete_export_is_read_whatever_its_layout(tmp_path, monkeypatch,
                                                                      chunk):
    """A valid export keeps its last page (a normal article here) in any line layout, and
    tags cut by the reader's chunk boundaries are found whole."""
    if chunk:
        monkeypatch.setattr(mediawiki, "READ_BYTES", chunk)
    pages = [page(12, "Anarchism", ARTICLE), page(70, "Laozi", LAOZI)]
    for name, xml in (("lines", HEADER + "".join(pages) + FOOTER),
                      ("compact", _compact(HEADER + "".join(pages) + FOOTER))):
        (tmp_path / f"{name}.xml").write_text(xml, encoding="utf-8")
        s = pc.prepare(options(tmp_path / f"{name}.xml", tmp_path / f"{name}.txt", dedup=False))
        assert (s.documents, s.kept, s.bad) == (2, 2, []), name
        assert (tmp_path / f"{name}.txt").read_text() == ARTICLE_TEXT + LAOZI_TEXT, name


@pytest.mark.parametrize("layout", ["lines", "compact"])
def test_an_export_cut_inside_its_last_page_names_that_page(tmp_path, layout):
    xml = HEADER + page(12, "Anarchism", ARTICLE) + page(70, "Laozi", LAOZI)
    xml = _compact(xml) if layout == "compact" else xml
    cut = xml[:xml.rindex("He is the reputed author")]
    (tmp_path / "cut.xml").write_text(cut, encoding="utf-8")
    s = pc.prepare(options(tmp_path / "cut.xml", tmp_path / "cut.txt", dedup=False))
    assert (tmp_path / "cut.txt").read_text() == ARTICLE_TEXT
    assert (s.documents, s.kept, s.dropped["bad input"]) == (2, 1, 1)
    assert s.bad == [f"{tmp_path / 'cut.xml'}: page 70: the file ends inside this page "
                     f"(truncated); the pages before it were read"]


def test_same_bytes_for_any_worker_count_and_shards(wiki, tmp_path):
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}" / "part"
        pc.prepare(options(f"{wiki / 'pages.xml'},{wiki / 'pages.xml.bz2'}", out,
                           num_workers=workers, num_output_shards=2, chunk_size_mb=0.001,
                           dedup=False))
        outs.append([p.read_bytes() for p in sorted(out.parent.iterdir())])
        assert sorted(p.name for p in out.parent.iterdir()) == [
            "part-00000-of-00002.txt", "part-00001-of-00002.txt"]
    assert outs[0] == outs[1]
    # Without dedup each file gives the article, its copy and Laozi, dealt round-robin.
    assert outs[0][0].decode() == ARTICLE_TEXT + LAOZI_TEXT + ARTICLE_TEXT
    assert outs[0][1].decode() == ARTICLE_TEXT + ARTICLE_TEXT + LAOZI_TEXT


def _long_doc(k: int) -> str:
    """~150 words of the sample corpus, the k-th such piece."""
    words = open(SAMPLE[1], encoding="utf-8").read().split()
    return " ".join(words[k * 150:(k + 1) * 150]) + "."


def test_json_lines_with_bad_lines_plain_gzip_zstd(tmp_path):
    import zstandard

    a, b = _long_doc(3), _long_doc(5)
    near = a.split()
    near[40] = "changed"
    lines = [json.dumps({"text": a, "id": 1}).encode(), b"{not json",
             json.dumps({"body": b}).encode(), b"", json.dumps({"text": b}).encode(),
             json.dumps({"text": " ".join(near)}).encode(),
             b'{"text": "caf\xe9 latin-1"}', json.dumps({"text": a}).encode()]
    data = b"\n".join(lines) + b"\n"
    files = {"docs.jsonl": data, "docs.jsonl.gz": gzip.compress(data),
             "docs.jsonl.zst": zstandard.ZstdCompressor().compress(data)}
    texts = []
    for name, blob in files.items():
        (tmp_path / name).write_bytes(blob)
        out = tmp_path / f"{name}.txt"
        s = pc.prepare(options(tmp_path / name, out))
        assert (s.documents, s.kept) == (7, 2)
        assert dict(s.dropped) == {"non-article": 0, "redirect": 0, "disambiguation": 0,
                                   "too short": 0, "exact duplicate": 1, "near duplicate": 1,
                                   "bad input": 3}
        path = tmp_path / name
        assert s.bad == [
            f"{path}: line 2: not JSON (Expecting property name enclosed in double quotes: "
            f"line 1 column 2 (char 1))",
            f"{path}: line 3: no key 'text'",
            f"{path}: line 7: not JSON ('utf-8' codec can't decode byte 0xe9 in position 13: "
            f"invalid continuation byte)"]
        texts.append(out.read_text())
    assert texts[0] == texts[1] == texts[2]
    assert texts[0].split("\n\n")[:2] == [
        "\n".join(splitter("en").split(a)), "\n".join(splitter("en").split(b))]
    assert make_tfrecords_and_check(tmp_path / "docs.jsonl.txt", tmp_path) > 0


def _save_dataset(folder, texts: list[str | None]) -> None:
    """A folder as `datasets`' save_to_disk writes it: Arrow IPC stream + state.json."""
    import pyarrow as pa

    folder.mkdir()
    table = pa.table({"text": pa.array(texts, pa.string()),
                      "id": pa.array(range(len(texts)), pa.int64())})
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=2):
                writer.write_batch(batch)
    (folder / "dataset_info.json").write_text("{}")
    (folder / "state.json").write_text(json.dumps(
        {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": "train"}))


def test_datasets_folder_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [_long_doc(1), None, _long_doc(2), "short", _long_doc(4)]
    _save_dataset(tmp_path / "ds", texts)
    assert read.detect_format(str(tmp_path / "ds")) == "hf"
    s = pc.prepare(options(tmp_path / "ds", f"{tmp_path / 'out'}/"))
    out = tmp_path / "out" / "corpus-00000-of-00001.txt"
    split = splitter("en").split
    expected = "".join(format_document(split(t)) for t in (texts[0], texts[2], texts[4]))
    assert out.read_text() == expected
    assert (s.documents, s.kept, s.dropped["too short"], s.dropped["bad input"]) == (5, 3, 1, 1)
    assert s.bad == [f"{tmp_path / 'ds' / 'data-00000-of-00001.arrow'}: row 2: no text (null)"]

    pq.write_table(pa.table({"content": texts}), tmp_path / "d.parquet")
    s = pc.prepare(options(tmp_path / "d.parquet", tmp_path / "p.txt", text_key="content"))
    assert (tmp_path / "p.txt").read_text() == expected
    assert make_tfrecords_and_check(tmp_path / "p.txt", tmp_path) > 0

    with pytest.raises(PrepareError, match=r"nothing usable: 1 document\(s\) read, none "
                       r"kept \(bad input 1\); .*d.parquet: no column 'text' \(columns: "
                       r"content\); set --text_key; .* not written$"):
        pc.prepare(options(tmp_path / "d.parquet", tmp_path / "q.txt"))
    _save_dataset(tmp_path / "empty", [])
    with pytest.raises(PrepareError, match=r"nothing usable: 0 document\(s\) read, none "
                       r"kept \(no documents\)"):
        pc.prepare(options(tmp_path / "empty", tmp_path / "e.txt"))
    assert not (tmp_path / "q.txt").exists() and not (tmp_path / "e.txt").exists()


def test_text_files_per_file_and_per_block_and_not_utf8(tmp_path):
    (tmp_path / "in").mkdir()
    a, b = _long_doc(6), _long_doc(7)
    (tmp_path / "in" / "a.txt").write_text(f"{a}\n\n{b}\n", encoding="utf-8")
    (tmp_path / "in" / "b.txt").write_bytes(b"Caf\xe9 " * 50)
    split = splitter("en").split
    s = pc.prepare(options(tmp_path / "in", tmp_path / "f.txt"))
    assert (tmp_path / "f.txt").read_text() == format_document(split(a) + split(b))
    assert s.bad == [f"{tmp_path / 'in' / 'b.txt'}: not UTF-8 (byte 0xe9 at offset 3)"]
    pc.prepare(options(tmp_path / "in", tmp_path / "g.txt", doc_split="blank_line"))
    assert (tmp_path / "g.txt").read_text() == (format_document(split(a))
                                                + format_document(split(b)))


def test_ftfy_repairs_mojibake_and_entities_keeps_typography():
    assert clean.fix_text("The Mona Lisa doesn\u00c3\u00a2\u00e2\u201a\u00ac\u00e2\u201e\u00a2t "
                          "have eyebrows.") == "The Mona Lisa doesn\u2019t have eyebrows."
    assert clean.fix_text("caf&eacute; &amp; cr\u00c3\u00a8me") == "caf\u00e9 & cr\u00e8me"
    assert clean.fix_text("a\x00b\x1b") == "ab"
    assert (clean.fix_text("cafe\u0301 \u201cquoted\u201d \ufb01")
            == "caf\u00e9 \u201cquoted\u201d \ufb01")


def test_fingerprint_check_answers_as_deduplicator_check():
    """The front door checks fingerprints made by its workers; the answers and the counts
    must be Deduplicator.check's on the same documents in the same order."""
    from data_prep.dedup import Deduplicator

    o = Options()
    a, b = _long_doc(8), _long_doc(9)
    near = a.replace(a.split()[30], "other", 1)
    docs = [a, b, a, near, b.upper(), _long_doc(10)]
    ref, mine = Deduplicator(), clean.deduplicator(o)
    answers = [ref.check(clean.dedup_text([d])) for d in docs]
    assert answers == [None, None, "exact", "near", "exact", None]
    assert [clean.check_fingerprint(mine, *clean.fingerprint([d], o)) for d in docs] == answers
    assert (mine.kept, mine.exact, mine.near) == (ref.kept, ref.exact, ref.near)


def test_dedup_spool_is_removed_after_success_and_failure(tmp_path, monkeypatch):
    """Deduplication spools documents, signatures and band entries beside the output's
    temporary name; a run leaves only its outputs, and a failed one nothing."""
    docs = [_long_doc(k) for k in range(12)]
    docs += [docs[3], docs[5].upper(), docs[7].replace(docs[7].split()[20], "other", 1)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    s = pc.prepare(options(tmp_path / "in.jsonl", tmp_path / "out" / "part",
                           num_output_shards=3))
    assert (s.documents, s.kept, s.dropped["exact duplicate"],
            s.dropped["near duplicate"]) == (15, 12, 2, 1)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        f"part-0000{i}-of-00003.txt" for i in range(3)]

    def fail(self):
        assert os.listdir(self.folder)  # the spool is there until the end
        raise OSError("disk full")

    monkeypatch.setattr(DiskDeduplicator, "finish", fail)
    with pytest.raises(OSError, match="disk full"):
        pc.prepare(options(tmp_path / "in.jsonl", tmp_path / "again" / "part"))
    assert list((tmp_path / "again").iterdir()) == []


def test_nothing_usable_is_one_line_and_an_older_output_stays(wiki, tmp_path):
    out = tmp_path / "corpus.txt"
    out.write_text("an older corpus\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"x": 1}\nnot json\n')
    r = cli(f"--input={bad}", f"--output={out}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        f"error: --input={bad}: nothing usable: 2 document(s) read, none kept "
        f"(bad input 2); {bad}: line 1: no key 'text'; {out} not written"]
    assert out.read_text() == "an older corpus\n"
    assert [p.name for p in tmp_path.iterdir()] == ["corpus.txt", "bad.jsonl"] or sorted(
        p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "corpus.txt"]
    with pytest.raises(PrepareError, match="--input=nope: no such file or folder"):
        pc.prepare(options("nope", out))


def test_format_detection_and_training_names_the_command():
    assert [read.detect_format(p) for p in ("a.xml", "a.xml.bz2", "b.jsonl.zst", "c.json.gz",
                                             "d.parquet", "e.arrow", "f.txt", "g")] == [
        "wiki", "wiki", "jsonl", "jsonl", "parquet", "arrow", "text", "text"]
    assert read.needs_conversion("f.txt") is None
    assert read.needs_conversion("f.txt.gz") == "text"
    assert read.needs_conversion("a.xml.bz2") == "wiki"


def test_text_files_of_a_dump_name_the_prepare_corpus_command(wiki, tmp_path):
    from bert_jax.data.features import DataCheckError
    from bert_jax.tasks.pretraining import data as data_lib
    from tests.train.common import text_config

    with pytest.raises(DataCheckError) as e:
        data_lib.make_train_data(text_config(str(wiki / "pages.xml.bz2")), str(tmp_path))
    assert str(e.value) == (
        f"config.data.text_files: {wiki / 'pages.xml.bz2'} is a MediaWiki XML dump, not text "
        f"in the input format (UTF-8 text, one sentence per line, a blank line between "
        f"documents); make it text first: python data_prep/prepare_corpus.py "
        f"--input={wiki / 'pages.xml.bz2'} --output=corpus/ then "
        f"--config.data.text_files='corpus/*.txt'")
