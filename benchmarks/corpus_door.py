r"""Speed and peak memory of the corpus front door (data_prep/prepare_corpus.py), end to end:
parse, clean, split, deduplicate, write.

Builds inputs of --mb MB in a temp dir from the sample corpus (data_prep/sample_corpus):
documents of 4 to 30 sentences drawn at random from its 9,459 sentences (so that they are
neither exact nor near duplicates), written as JSON lines and as a MediaWiki export whose
pages carry the markup of real articles (templates, references, links, bold, a table, a
heading, a See also list, categories; one page in 20 a redirect). Then it runs the command
line as a subprocess for each --workers value and prints input MB/s, MB/s per worker,
CPU seconds and the peak memory of the process tree (RSS summed over the main process and
its workers, sampled every 20 ms with psutil). MB per CPU-second (the run's and its
workers' CPU time, start-up included) is the speed of a core that is not shared: where
other work runs, the wall-clock figures are noisy.

    python benchmarks/corpus_door.py                 # 20 MB, 1 and 2 workers
    python benchmarks/corpus_door.py --mb=40 --workers=2   # peak memory against --mb=20
    python benchmarks/corpus_door.py --mb=40 --nodedup     # without deduplication

Targets: >= 2 MB/s per core for JSON lines, >= 1 MB/s per core for wikitext. Figures in
benchmarks/RESULTS.md ("corpus front door").
"""

from __future__ import annotations

import glob
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

FLAGS = flags.FLAGS


def _sentences() -> list[str]:
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, "data_prep", "sample_corpus", "*.txt"))):
        out += [s for s in open(path, encoding="utf-8").read().split("\n") if s.strip()]
    return out


def documents(total_bytes: int, seed: int = 0):
    """Lists of sentences, about total_bytes of text in all."""
    pool = _sentences()
    rng = random.Random(seed)
    size = 0
    while size < total_bytes:
        doc = [rng.choice(pool) for _ in range(rng.randint(4, 30))]
        size += sum(len(s) + 1 for s in doc)
        yield doc


def write_jsonl(path: str, total_bytes: int) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i, doc in enumerate(documents(total_bytes)):
            f.write(json.dumps({"id": i, "text": "\n".join(doc)}) + "\n")


def _wikitext(doc: list[str], rng: random.Random) -> str:
    paras = [doc[i:i + 4] for i in range(0, len(doc), 4)]
    body = []
    for j, para in enumerate(paras):
        words = " ".join(para).split(" ")
        k = rng.randrange(len(words))
        words[k] = f"[[{words[k]}|{words[k]}]]"
        if len(words) > 3:
            words[1] = f"'''{words[1]}'''"
        text = " ".join(words) + '<ref name="r%d">{{cite book |title=Works |year=1911}}</ref>' % j
        body.append(text)
        if j == 0:
            body.append("== History ==")
    return ("{{Short description|An article}}\n{{Infobox person\n| name = X\n| born = 1564\n}}\n"
            + "\n\n".join(body)
            + "\n{| class=\"wikitable\"\n|-\n! A !! B\n|-\n| 1 || 2\n|}\n"
            "== See also ==\n* [[Other article]]\n\n== References ==\n{{reflist}}\n\n"
            "[[Category:Benchmarks]]\n")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_wiki(path: str, total_bytes: int) -> None:
    rng = random.Random(1)
    with open(path, "w", encoding="utf-8") as f:
        f.write('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">\n'
                "  <siteinfo>\n    <sitename>Bench</sitename>\n  </siteinfo>\n")
        for i, doc in enumerate(documents(total_bytes)):
            redirect = i % 20 == 19
            text = "#REDIRECT [[Article 1]]" if redirect else _wikitext(doc, rng)
            f.write(f"  <page>\n    <title>Article {i}</title>\n    <ns>0</ns>\n"
                    f"    <id>{i + 1}</id>\n"
                    + ('    <redirect title="Article 1" />\n' if redirect else "")
                    + f"    <revision>\n      <id>{i + 1}</id>\n"
                    f"      <text xml:space=\"preserve\">{_escape(text)}</text>\n"
                    f"    </revision>\n  </page>\n")
        f.write("</mediawiki>\n")


def _run(cmd: list[str]) -> tuple[float, float, float, str]:
    """(seconds, CPU seconds of the children, peak RSS of the tree in MB, stdout)."""
    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=REPO))
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
            peak = max(peak, sum(p.memory_info().rss for p in tree))
        except psutil.Error:
            pass
        time.sleep(0.02)
    out, err = proc.communicate()
    seconds = time.time() - t0
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{err[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu, peak / 1e6, out


def main(argv):
    del argv
    tmp = tempfile.mkdtemp(prefix="corpus_door-")
    inputs = {"jsonl": os.path.join(tmp, "docs.jsonl"), "wiki": os.path.join(tmp, "pages.xml")}
    write_jsonl(inputs["jsonl"], int(FLAGS.mb * 1e6))
    write_wiki(inputs["wiki"], int(FLAGS.mb * 1e6))
    print(f"{'input':<6} {'MB':>6} {'workers':>7} {'seconds':>8} {'MB/s':>6} "
          f"{'MB/s/worker':>11} {'CPU s':>6} {'MB/CPU-s':>8} {'peak MB':>8} {'kept':>8}")
    for name in FLAGS.formats:
        path = inputs[name]
        mb = os.path.getsize(path) / 1e6
        for workers in map(int, FLAGS.workers):
            out = os.path.join(tmp, f"out-{name}-{workers}")
            seconds, cpu, peak, stdout = _run([
                sys.executable, os.path.join(REPO, "data_prep", "prepare_corpus.py"),
                f"--input={path}", f"--output={out}/", "--num_output_shards=4",
                f"--num_workers={workers}", "--noprogress",
                "--dedup" if FLAGS.dedup else "--nodedup"])
            kept = next(line.split()[-1] for line in stdout.splitlines()
                        if line.startswith("kept"))
            print(f"{name:<6} {mb:>6.1f} {workers:>7} {seconds:>8.1f} {mb / seconds:>6.2f} "
                  f"{mb / seconds / workers:>11.2f} {cpu:>6.1f} {mb / cpu:>8.2f} {peak:>8.0f} "
                  f"{kept:>8}",
                  flush=True)
    if not FLAGS.keep:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    flags.DEFINE_float("mb", 20.0, "Size of each input (MB).")
    flags.DEFINE_list("workers", ["1", "2"], "--num_workers values to run.")
    flags.DEFINE_list("formats", ["jsonl", "wiki"], "Inputs to run: jsonl, wiki.")
    flags.DEFINE_bool("dedup", True, "Deduplicate (spooled to disk, so peak memory stays flat; "
                      "--nodedup shows the memory of the rest).")
    flags.DEFINE_bool("keep", False, "Keep the temp dir (inputs and outputs).")
    app.run(main)
