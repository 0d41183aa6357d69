"""Bad input never gives a traceback: invalid UTF-8, control characters, empty documents,
huge lines, one-sentence documents, arbitrary unicode (hypothesis); CLI errors are clear."""

import os
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.data_prep.helpers import REPO, SAMPLE, VOCAB, check_invariants, read_examples, run_tool

CLS, SEP = 101, 102


def test_hostile_input(tmp_path):
    src = tmp_path / "bad.txt"
    lines = [
        b"A first document with one sentence.",
        b"",
        b"\xff\xfe invalid \xc3\x28 utf-8 \xe2\x82 here.",     # 2 + 1 + 2 bad bytes
        b"control \x00\x01\x07\x1b chars \x7f and tabs\tinside.",
        b"\x00\x01\x02",                                       # a sentence of nothing
        b"   \t  ",                                            # whitespace-only: a boundary
        b"",
        b"",
        b"word " * 200_000,                                    # a 1,000,000-character line
        b"And a short one after it.",
        b"",
        b"x" * 300 + b" " + "日本語".encode() * 50,
        b"\r",
        b"single",
        b"",
        b"\x00",
        b"",
    ]
    src.write_bytes(b"\n".join(lines))  # no final newline
    out = tmp_path / "out.tfrecord"
    stats = run_tool([src], [out], dupe_factor=3, max_seq_length=32, max_predictions_per_seq=5)
    assert stats.replaced_bytes == 5
    assert stats.documents == 5  # the "\x00" document has no tokens and is dropped
    assert stats.instances > 0 and stats.tokens > 200_000
    assert os.path.exists(out) and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
    ex = read_examples([out], 32, 5)
    assert len(ex["input_ids"]) == stats.instances
    check_invariants(ex, cls_id=CLS, sep_id=SEP, max_seq_length=32, max_predictions_per_seq=5)


def test_empty_and_blank_inputs_give_empty_output(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.txt"
    blank.write_bytes(b"\n\n  \n\t\n")
    out = tmp_path / "o.tfrecord"
    stats = run_tool([empty, blank], [out], num_workers=2)
    assert stats.instances == 0 and stats.documents == 0
    assert out.read_bytes() == b""


def test_single_document_takes_random_b_from_itself(tmp_path):
    src = tmp_path / "one.txt"
    src.write_text("\n".join(f"Sentence number {i} of the only document." for i in range(40)))
    out = tmp_path / "o.tfrecord"
    stats = run_tool([src], [out], dupe_factor=2)
    ex = read_examples([out], 128, 20)
    check_invariants(ex, cls_id=CLS, sep_id=SEP, max_seq_length=128, max_predictions_per_seq=20)
    assert stats.documents == 1 and 0 < stats.is_next < stats.instances


_docs = st.lists(st.lists(st.text(max_size=80), min_size=0, max_size=6), min_size=1, max_size=6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=_docs, seq=st.integers(5, 40), wwm=st.booleans(), no_nsp=st.booleans(),
       prob=st.sampled_from([0.15, 0.5, 1.0]))
def test_arbitrary_unicode_documents(tmp_path, docs, seq, wwm, no_nsp, prob):
    """Any text, any small sequence length: no crash, and every invariant holds."""
    src = tmp_path / "h.txt"
    # Documents separated by blank lines; a sentence may itself contain newlines/blanks.
    src.write_text("\n\n".join("\n".join(d) for d in docs), encoding="utf-8",
                   errors="surrogatepass")
    out = tmp_path / "h.tfrecord"
    stats = run_tool([src], [out], dupe_factor=2, max_seq_length=seq, max_predictions_per_seq=4,
                     masked_lm_prob=prob, do_whole_word_mask=wwm, no_nsp=no_nsp)
    ex = read_examples([out], seq, 4)
    assert len(ex["input_ids"]) == stats.instances
    check_invariants(ex, cls_id=CLS, sep_id=SEP, max_seq_length=seq, max_predictions_per_seq=4,
                     masked_lm_prob=prob, no_nsp=no_nsp, whole_word=wwm)
    if stats.tokens:
        assert stats.instances > 0


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, str(REPO / "data_prep" / "create_pretraining_data.py"),
                           *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_cli_errors_are_clear_and_early(tmp_path):
    out = tmp_path / "o.tfrecord"
    bad_vocab = tmp_path / "vocab.txt"
    bad_vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    cases = [
        ([f"--input_file={tmp_path}/missing.txt"], "file not found: " + f"{tmp_path}/missing.txt"),
        ([f"--input_file={tmp_path}/*.nothing"], "no file matches"),
        ([f"--input_file={SAMPLE[0]}", f"--vocab_file={bad_vocab}"], f"{bad_vocab}"),
        ([f"--input_file={SAMPLE[0]}", "--max_seq_length=4"], "max_seq_length must be >= 5"),
    ]
    for extra, msg in cases:
        args = [f"--output_file={out}", f"--vocab_file={VOCAB}", *extra]
        r = _cli(*args)
        assert r.returncode == 2, r.stderr
        assert msg in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not out.exists()
    assert "[MASK]" in _cli(f"--input_file={SAMPLE[0]}", f"--output_file={out}",
                            f"--vocab_file={bad_vocab}").stderr
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    r = _cli(f"--input_file={SAMPLE[0]}", f"--output_file={blocker}/sub/o.tfrecord",
             f"--vocab_file={VOCAB}", "--noprogress")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"create_pretraining_data: error: --output_file: {blocker} is a file, so "
        f"{blocker}/sub/o.tfrecord cannot be written there: pass another path"]


def test_cli_end_to_end_with_shards(tmp_path):
    r = _cli(f"--input_file={SAMPLE[1]},{REPO}/data_prep/sample_corpus/brit*.txt",
             f"--output_file={tmp_path}/part", "--num_output_shards=2", f"--vocab_file={VOCAB}",
             "--dupe_factor=1", "--num_workers=2", "--max_seq_length=64",
             "--max_predictions_per_seq=10", "--noprogress")
    assert r.returncode == 0, r.stderr
    for key in ("documents", "sentences", "tokens", "instances", "UNK rate", "replaced bytes",
                "masked fraction", "IsNext fraction", "seconds", "instances/s"):
        assert key in r.stdout
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["part-00000-of-00002", "part-00001-of-00002"]
    ex = read_examples([tmp_path / n for n in names], 64, 10)
    check_invariants(ex, cls_id=CLS, sep_id=SEP, max_seq_length=64, max_predictions_per_seq=10)
    n = int(r.stdout.split("instances")[1].split()[0].replace(",", ""))
    assert len(ex["input_ids"]) == n


def test_local_only_tools_refuse_a_bucket_by_name(tmp_path):
    """build_vocab's trainers and prepare_corpus open local files by name: a gs:// output is
    an error naming it (exit 2, before any work), not a local ./gs:/ folder."""
    for tool, args, msg in (
            ("build_vocab.py", [f"--input_file={SAMPLE[0]}", "--output=gs://b/vocab.txt",
                                "--vocab_size=300"],
             "gs://b/vocab.txt: build_vocab reads and writes local files"),
            ("prepare_corpus.py", [f"--input={tmp_path}", "--output=gs://b/corpus.txt"],
             "--output=gs://b/corpus.txt: prepare_corpus reads and writes local files")):
        r = subprocess.run([sys.executable, str(REPO / "data_prep" / tool), *args],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert r.returncode != 0 and msg in r.stderr, (tool, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "gs:").exists()
