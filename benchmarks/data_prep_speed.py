r"""Throughput and peak memory of data_prep/create_pretraining_data.py, end to end.

Builds the benchmark corpus in a temp dir - ../shared/corpus in BERT's input format
(data_prep/prepare_corpus.py), repeated --repeat times (4: ~19 MB, so start-up is a small
part of the run) - then runs the CLI as a subprocess with the BERT uncased vocab, seq 128,
max_predictions 20, dupe_factor 5, for each --workers value, and prints instances/s,
input MB/s, CPU seconds (the CLI and its workers, from RUSAGE_CHILDREN), instances per
CPU-second (what a run would reach with the cores to itself), and peak memory of the whole
process tree (main + workers, sampled every 20 ms with psutil: RSS summed, which counts
pages shared by the forked workers several times; PSS summed, which counts them once;
and the largest single process).

    python benchmarks/data_prep_speed.py                      # 1 and 2 workers on the 4x corpus
    python benchmarks/data_prep_speed.py --workers=2 --repeat=1,4   # memory must not grow

Target: >= 35,000 instances/s with 2 workers and <= 500 MB peak RSS. On a shared machine
the wall-clock figures are noisy; instances per CPU-second move less. The figures measured
so far, and the original google-research/bert tool's as an anchor, are in
benchmarks/RESULTS.md ("data_prep speed and memory").
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

FLAGS = flags.FLAGS
flags.DEFINE_string("corpus_dir", os.path.join(REPO, "..", "shared", "corpus"),
                    "Raw corpus (Shakespeare + Britannica) to convert and repeat.")
flags.DEFINE_list("repeat", ["4"], "Corpus repetitions to run (one row each).")
flags.DEFINE_list("workers", ["1", "2"], "--num_workers values to run.")
flags.DEFINE_string("vocab_file", os.path.join(REPO, "data_prep", "bert_uncased_vocab.txt"),
                    "WordPiece vocab.")
flags.DEFINE_integer("dupe_factor", 5, "dupe_factor.")
flags.DEFINE_bool("keep", False, "Keep the temp dir (corpus and outputs).")


def build_corpus(tmp: str, repeat: int) -> str:
    import glob

    from data_prep.corpus.sample import convert_text, format_documents

    paths = sorted(glob.glob(os.path.join(FLAGS.corpus_dir, "**", "*.txt"), recursive=True))
    paths = [p for p in paths if os.path.basename(p) != "README.md"]
    if not paths:
        sys.exit(f"benchmark skipped: no corpus under {FLAGS.corpus_dir} (needs ../shared/corpus)")
    text = "".join(format_documents(convert_text(open(p, encoding="utf-8").read()))
                   for p in paths)
    out = os.path.join(tmp, f"corpus_x{repeat}.txt")
    with open(out, "w", encoding="utf-8") as f:
        for _ in range(repeat):
            f.write(text)
    return out


def run_one(corpus: str, out: str, workers: int) -> dict:
    import psutil

    cmd = [sys.executable, os.path.join(REPO, "data_prep", "create_pretraining_data.py"),
           f"--input_file={corpus}", f"--output_file={out}", f"--vocab_file={FLAGS.vocab_file}",
           "--do_lower_case", "--max_seq_length=128", "--max_predictions_per_seq=20",
           f"--dupe_factor={FLAGS.dupe_factor}", "--masked_lm_prob=0.15",
           f"--num_workers={workers}", "--noprogress"]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    peak_tree = peak_one = peak_pss = 0
    while proc.poll() is None:
        try:
            procs = [ps] + ps.children(recursive=True)
            rss, pss = [], []
            for p in procs:
                try:
                    m = p.memory_full_info()  # PSS: shared (forked) pages counted once
                    rss.append(m.rss)
                    pss.append(m.pss)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            peak_tree = max(peak_tree, sum(rss))
            peak_pss = max(peak_pss, sum(pss))
            peak_one = max(peak_one, max(rss, default=0))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.exit(f"create_pretraining_data failed:\n{stderr}")
    # Waited-for descendants (the CLI and its pool workers) add up in RUSAGE_CHILDREN.
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    n = int(stdout.split("instances")[1].split()[0].replace(",", ""))
    return {"instances": n, "wall": wall, "cpu": cpu, "peak_tree": peak_tree, "peak_pss": peak_pss,
            "peak_one": peak_one, "summary": stdout}


def main(argv):
    del argv
    tmp = tempfile.mkdtemp(prefix="bench_data_prep_")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
          "(others share it: timings are noisy)")
    print(f"{'corpus':>8} {'MB':>6} {'workers':>7} {'instances':>10} {'wall s':>7} "
          f"{'inst/s':>8} {'MB/s':>6} {'CPU s':>6} {'inst/CPU-s':>10} {'peak RSS sum':>13} "
          f"{'peak PSS sum':>13} {'largest RSS':>12}")
    for rep in map(int, FLAGS.repeat):
        corpus = build_corpus(tmp, rep)
        mb = os.path.getsize(corpus) / 1e6
        for w in map(int, FLAGS.workers):
            r = run_one(corpus, os.path.join(tmp, f"out_x{rep}_w{w}.tfrecord"), w)
            print(f"{'x%d' % rep:>8} {mb:6.1f} {w:7d} {r['instances']:10,d} {r['wall']:7.2f} "
                  f"{r['instances'] / r['wall']:8,.0f} {mb / r['wall']:6.2f} {r['cpu']:6.1f} "
                  f"{r['instances'] / r['cpu']:10,.0f} {r['peak_tree'] / 2**20:10.0f} MB "
                  f"{r['peak_pss'] / 2**20:10.0f} MB {r['peak_one'] / 2**20:9.0f} MB",
                  flush=True)
    if not FLAGS.keep:
        import shutil
        shutil.rmtree(tmp)


if __name__ == "__main__":
    app.run(main)
