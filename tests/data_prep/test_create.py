"""create_pretraining_data: statistics against the original algorithm, format invariants,
determinism across workers, sharding, whole-word masking, --no_nsp, atomic output."""

import json
import os
import shutil

import numpy as np
import pytest

from bert_jax.tokenization import load_tokenizer
from data_prep import instances as inst
from data_prep import pipeline, tfrecord
from data_prep.workers import fork_safe
from data_prep.paths import InputError
from tests.data_prep.helpers import (GOLDENS, SAMPLE, VOCAB, check_invariants, read_examples,
                                     restore, run_tool)

S, P = 128, 20


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(vocab_file=VOCAB)


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory):
    """The whole sample corpus with the golden's settings (dupe 5, seq 128, 20 predictions)."""
    out = tmp_path_factory.mktemp("sample") / "sample.tfrecord"
    stats = run_tool(SAMPLE, [out], dupe_factor=5, max_seq_length=S, max_predictions_per_seq=P)
    return stats, read_examples([out], S, P)


def test_statistics_match_original_algorithm(sample_run, tok):
    stats, ex = sample_run
    golden = json.loads((GOLDENS / "original_stats.json").read_text())["mean"]
    n = len(ex["input_ids"])
    assert n == stats.instances
    assert abs(n - golden["instances"]) / golden["instances"] < 0.05
    is_next = (ex["next_sentence_labels"][:, 0] == 0).mean()
    assert abs(is_next - golden["is_next_fraction"]) < 0.03, (is_next, golden)
    assert is_next == pytest.approx(stats.is_next / n)
    ids = restore(ex)
    real = ex["input_mask"] > 0
    non_special = (real & (ids != tok.cls_id) & (ids != tok.sep_id)).sum()
    w = ex["masked_lm_weights"] > 0
    masked = w.sum()
    assert abs(masked / non_special - 0.15) < 0.01
    assert abs(masked / non_special - golden["masked_fraction"]) < 0.003
    rows = np.nonzero(w)[0]
    now = ex["input_ids"][rows, ex["masked_lm_positions"][w]]
    orig = ex["masked_lm_ids"][w]
    frac_mask = (now == tok.mask_id).mean()
    frac_keep = ((now == orig) & (now != tok.mask_id)).mean()
    frac_rand = 1 - frac_mask - frac_keep
    assert abs(frac_mask - 0.8) < 0.03 and abs(frac_keep - 0.1) < 0.03
    assert abs(frac_rand - 0.1) < 0.03
    assert abs(real.sum(1).mean() - golden["mean_tokens"]) < 3
    assert stats.documents == 269 and stats.sentences == 9459 and stats.unk_tokens == 0


def test_format_invariants(sample_run, tok):
    _, ex = sample_run
    check_invariants(ex, cls_id=tok.cls_id, sep_id=tok.sep_id, max_seq_length=S,
                     max_predictions_per_seq=P)


def test_segments_are_corpus_text(sample_run, tok):
    """A and B are contiguous token spans of the corpus; IsNext B follows A's document."""
    _, ex = sample_run
    flat, _ = tok.encode_batch_flat([l.strip() for p in SAMPLE for l in open(p, encoding="utf-8")])
    hay = flat.astype("<i4").tobytes()

    def find(seg):
        needle = np.asarray(seg, dtype="<i4").tobytes()
        at = hay.find(needle)
        while at >= 0 and at % 4:
            at = hay.find(needle, at + 1)
        return at

    ids = restore(ex)
    rng = np.random.default_rng(0)
    for i in rng.choice(len(ids), 150, replace=False):
        L = int(ex["input_mask"][i].sum())
        sep = int(np.argmax(ids[i] == tok.sep_id))
        a, b = ids[i, 1:sep], ids[i, sep + 1:L - 1]
        assert find(a) >= 0 and find(b) >= 0
        if ex["next_sentence_labels"][i, 0] == 0 and L < S - 5:  # untruncated IsNext pair
            assert find(np.concatenate([a, b])) >= 0


def test_identical_bytes_whatever_num_workers(tmp_path, monkeypatch):
    # A process with TensorFlow loaded (as this test session), whose threads do not survive
    # fork(): a forked worker once hung for ever on a tf.data iterator it inherited. The
    # workers must be spawned here; the CLI, which loads none of them, forks.
    import tensorflow  # noqa: F401

    assert not fork_safe()
    methods = []
    get_context = pipeline.mp.get_context
    monkeypatch.setattr(pipeline.mp, "get_context",
                        lambda method: methods.append(method) or get_context(method))
    outs = {}
    for w in (1, 2):
        out = tmp_path / f"w{w}.tfrecord"
        stats = run_tool(SAMPLE, [out], num_workers=w, chunk_chars=60_000, dupe_factor=2)
        outs[w] = out.read_bytes()
        assert stats.instances > 4000
    assert outs[1] == outs[2]
    assert methods == ["spawn"]
    # Another seed gives another file; the same seed again the same file.
    other = tmp_path / "seed.tfrecord"
    run_tool(SAMPLE, [other], num_workers=1, chunk_chars=60_000, dupe_factor=2, seed=7)
    assert other.read_bytes() != outs[1]


def test_shards_are_round_robin_of_single_file(tmp_path):
    one = tmp_path / "one.tfrecord"
    run_tool([SAMPLE[1]], [one], chunk_chars=50_000)
    shards = [tmp_path / f"s{i}.tfrecord" for i in range(3)]
    run_tool([SAMPLE[1]], shards, chunk_chars=50_000)
    recs = list(tfrecord.read_records(str(one)))
    per = [list(tfrecord.read_records(str(s))) for s in shards]
    assert [len(p) for p in per] == [len(recs[i::3]) for i in range(3)]
    for i in range(3):
        assert per[i] == recs[i::3]


def test_whole_word_masking_never_splits_a_word(tmp_path, tok):
    out = tmp_path / "wwm.tfrecord"
    run_tool([SAMPLE[1]], [out], do_whole_word_mask=True, dupe_factor=2)
    ex = read_examples([out], S, P)
    check_invariants(ex, cls_id=tok.cls_id, sep_id=tok.sep_id, max_seq_length=S,
                     max_predictions_per_seq=P, whole_word=True)
    ids = restore(ex)
    cont = tok.is_continuation[ids]
    special = (ids == tok.cls_id) | (ids == tok.sep_id) | (ex["input_mask"] == 0)
    masked = np.zeros_like(ids, dtype=bool)
    w = ex["masked_lm_weights"] > 0
    masked[np.nonzero(w)[0], ex["masked_lm_positions"][w]] = True
    # A continuation piece (not right after a special token) is masked iff the piece before it is.
    inner = cont[:, 1:] & ~special[:, 1:] & ~special[:, :-1]
    assert (masked[:, 1:][inner] == masked[:, :-1][inner]).all()
    assert inner.sum() > 1000 and (masked[:, 1:] & inner).sum() > 50  # multi-piece words masked
    frac = w.sum() / (~special).sum()
    assert 0.13 < frac <= 0.155


def test_no_nsp_packs_full_sentences(tmp_path, tok):
    out = tmp_path / "nonsp.tfrecord"
    stats = run_tool([SAMPLE[0]], [out], no_nsp=True, dupe_factor=1)
    ex = read_examples([out], S, P)
    check_invariants(ex, cls_id=tok.cls_id, sep_id=tok.sep_id, max_seq_length=S,
                     max_predictions_per_seq=P, no_nsp=True)
    L = ex["input_mask"].sum(1)
    # Whole sentences only, and 10% short targets (short_seq_prob): ~80% full on average.
    assert L.mean() > 0.75 * S
    # One pass covers every text token of the corpus exactly once.
    ids = restore(ex)
    text = ((ids != tok.cls_id) & (ids != tok.sep_id) & (ex["input_mask"] > 0)).sum()
    assert text == stats.tokens
    # Document boundaries inside an instance are marked by an extra [SEP].
    inner_sep = ((ids[:, 1:-1] == tok.sep_id) & (ex["input_mask"][:, 2:] > 0)).sum()
    assert 0 < inner_sep < stats.documents


def test_truncation_amounts_match_token_by_token_loop():
    for la in range(0, 40):
        for lb in range(0, 40):
            for m in (2, 5, 17, 30):
                a, b = la, lb
                while a + b > m:
                    if a > b:
                        a -= 1
                    else:
                        b -= 1
                assert inst.truncation_amounts(la, lb, m) == (la - a, lb - b)


_REAL_CHUNK_TO_FILE = pipeline.process_chunk_to_file


def _chunk_to_file_failing_at_2(chunk_index, docs_path, spool):
    """A pool worker's task that fails on chunk 2. Module-level: the spawned workers (this
    test process has TensorFlow loaded, so the pool is not forked) import it by name."""
    if chunk_index == 2:
        raise RuntimeError("disk on fire")
    return _REAL_CHUNK_TO_FILE(chunk_index, docs_path, spool)


@pytest.mark.parametrize("workers", [1, 2])
def test_failure_leaves_no_partial_output(tmp_path, monkeypatch, workers):
    """A failing chunk: the old file stays, no temp file or worker spool is left behind."""
    out = tmp_path / "out.tfrecord"
    out.write_bytes(b"previous complete file")
    calls = []
    real = pipeline.process_chunk

    def flaky(k, docs):
        calls.append(k)
        if k == 2:
            raise RuntimeError("disk on fire")
        return real(k, docs)

    monkeypatch.setattr(pipeline, "process_chunk", flaky)  # one worker: in this process
    monkeypatch.setattr(pipeline, "process_chunk_to_file", _chunk_to_file_failing_at_2)
    with pytest.raises(RuntimeError, match="disk on fire"):
        run_tool([SAMPLE[1]], [out], chunk_chars=50_000, num_workers=workers)
    if workers == 1:
        assert calls == [0, 1, 2]
    assert out.read_bytes() == b"previous complete file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tfrecord"]


def test_masked_positions_are_uniform_over_candidates(sample_run, tok):
    """Every non-special position is masked equally often (no bias to the start, the end,
    segment A or B), at the rate n_pred / n_candidates."""
    _, ex = sample_run
    ids = restore(ex)
    cand = (ex["input_mask"] > 0) & (ids != tok.cls_id) & (ids != tok.sep_id)
    masked = np.zeros_like(cand)
    w = ex["masked_lm_weights"] > 0
    masked[np.nonzero(w)[0], ex["masked_lm_positions"][w]] = True
    full = ex["input_mask"].sum(1) == S  # rate 19 / 125 on every full-length instance
    rate = masked[full].sum(0)[1:S - 1] / np.maximum(cand[full].sum(0)[1:S - 1], 1)
    n = full.sum()
    assert n > 5000
    sd = np.sqrt(0.152 * 0.848 / n)
    seen = cand[full].sum(0)[1:S - 1] > n / 2  # positions that are text in most rows
    assert seen.sum() > 100
    assert np.abs(rate[seen] - 19 / 125).max() < 5 * sd * np.sqrt(2), rate[seen]


def test_corpus_and_shards_in_a_bucket(tmp_path, monkeypatch, own_tempdir):
    """gs:// inputs (a glob) and outputs, as google-research/bert's tool took them: read and
    written through etils.epath (faked here onto a local folder, tests/test_paths.py), the
    same bytes as a local run, no local ./gs:/ folder and no staging files left (in this
    test's own temp folder). A run that fails uploads nothing."""
    from data_prep.paths import resolve_inputs, resolve_outputs
    from tests.test_paths import fake_gcs

    monkeypatch.chdir(tmp_path)  # a URI taken for a local path would land here
    root = tmp_path / "bucket_root"
    (root / "b" / "corpus").mkdir(parents=True)
    for p in SAMPLE:
        shutil.copy(p, root / "b" / "corpus")
    local = [tmp_path / f"local-{i}" for i in range(2)]
    run_tool(SAMPLE, local, chunk_chars=200_000, num_workers=2)
    with fake_gcs(str(root)):
        inputs = resolve_inputs("gs://b/corpus/*.txt")
        assert inputs == [f"gs://b/corpus/{os.path.basename(p)}" for p in SAMPLE]
        outputs = resolve_outputs("gs://b/pretrain/train", 2)
        assert outputs == [f"gs://b/pretrain/train-0000{i}-of-00002" for i in range(2)]
        stats = run_tool(inputs, outputs, chunk_chars=200_000, num_workers=2)
        assert stats.input_bytes == sum(os.path.getsize(p) for p in SAMPLE)
        with pytest.raises(InputError, match="gs://b/pretrain is a directory"):
            resolve_outputs("gs://b/pretrain", 1)
        with pytest.raises(InputError, match=r"no file matches 'gs://b/none/\*.txt'"):
            resolve_inputs("gs://b/none/*.txt")
        # A failing run leaves the bucket as it was.
        monkeypatch.setattr(pipeline, "process_chunk", lambda k, docs: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            run_tool(inputs, ["gs://b/failed/train"], chunk_chars=200_000)
    for i in range(2):
        assert (root / "b" / "pretrain" / f"train-0000{i}-of-00002").read_bytes() == \
            local[i].read_bytes()
    assert not (root / "b" / "failed").exists() or not list((root / "b" / "failed").iterdir())
    assert not (tmp_path / "gs:").exists()
    assert os.listdir(own_tempdir) == []
