"""SQuAD features and post-processing: answers come back as the exact original characters
(odd whitespace, accents, punctuation), across doc_stride windows; v2 follows the threshold."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.tasks.squad.reader import SquadExample, read_squad_json
from bert_jax.tokenization import load_tokenizer
from bert_jax.tasks import squad
from bert_jax.tasks.squad import features as squad_features
from bert_jax.tasks.squad import postprocess as squad_postprocess
from bert_jax.tasks.base import EvalSet

from tests.tasks.conftest import DATA, VOCAB


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(vocab_file=str(VOCAB), do_lower_case=True)


def _example(context, answer, qid="q", question="What is served?", occurrence=0):
    start = -1
    for _ in range(occurrence + 1):
        start = context.index(answer, start + 1)
    return SquadExample(qid, question, context, ((answer, start),))


def _oracle_logits(features, positions):
    """Peaked logits: +10 at the given (start, end) of each feature (None = [CLS])."""
    n, length = features["input_ids"].shape
    s = np.zeros([n, length], np.float32)
    e = np.zeros([n, length], np.float32)
    for row, (a, b) in enumerate(positions):
        s[row, a] += 10.0
        e[row, b] += 10.0
    return s, e


def test_doc_windows_and_max_context():
    assert squad_features.doc_windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert squad_features.doc_windows(3, 4, 2) == [(0, 3)]
    spans = squad_features.doc_windows(10, 4, 2)
    flags = squad_features.max_context_flags(spans)
    # Token 3: window 0 (left 3, right 0 -> 0), window 1 (1, 1 -> 1), window 2 (absent) ...
    owner = {}
    for w, ((start, length), f) in enumerate(zip(spans, flags)):
        for k in range(length):
            if f[k]:
                assert start + k not in owner
                owner[start + k] = w
    assert sorted(owner) == list(range(10))  # every token has exactly one home window
    assert owner[3] == 1 and owner[0] == 0 and owner[9] == 3
    with pytest.raises(ValueError, match="no room"):
        squad_features.doc_windows(10, 0, 2)


@pytest.mark.parametrize("context,answer", [
    ("The  café\u00a0serves   crème  brûlée\tand tea.", "crème  brûlée"),
    ("Zoë's «naïve» answer—yes!—was right.", "«naïve» answer—yes"),
    ("Numbers: 1,234.5 km² at 3:45pm.", "1,234.5 km²"),
    ("Line one.\n\n  Line   two ends here.", "Line   two"),
])
def test_exact_characters_round_trip(tok, context, answer):
    ex = _example(context, answer)
    train = squad_features.convert_examples([ex], tok, 64, 16, 16, is_training=True)
    s_pos, e_pos = train["start_positions"][0], train["end_positions"][0]
    assert s_pos > 0 and e_pos >= s_pos
    c0, c1 = train["char_start"][0, s_pos], train["char_end"][0, e_pos]
    assert context[c0:c1] == answer
    s, e = _oracle_logits(train, [(s_pos, e_pos)])
    preds, nbest, odds = squad_postprocess.postprocess([ex], train, s, e, version_2=False)
    assert preds["q"] == answer
    assert nbest["q"][0]["text"] == answer and odds == {}
    probs = [x["probability"] for x in nbest["q"]]
    assert sum(probs) == pytest.approx(1.0) and probs == sorted(probs, reverse=True)


def test_across_windows_uses_max_context_window(tok):
    words = " ".join(f"w{i}" for i in range(120))
    context = f"{words} the Zoë  Mañana answer {words}"
    ex = _example(context, "Zoë  Mañana")
    f = squad_features.convert_examples([ex], tok, 48, 8, 8, is_training=True)
    n = len(f["input_ids"])
    assert n > 10 and set(f["example_index"]) == {0}
    holders = [r for r in range(n) if f["start_positions"][r] > 0]
    assert len(holders) >= 2  # the answer lies in several overlapping windows
    for r in holders:
        c0, c1 = f["char_start"][r, f["start_positions"][r]], f["char_end"][r, f["end_positions"][r]]
        assert context[c0:c1] == "Zoë  Mañana"
    home = [r for r in holders if f["max_context"][r, f["start_positions"][r]]]
    assert len(home) == 1
    # A higher-scoring span in a window where its start lacks max context must be ignored.
    decoy = next(r for r in holders if r != home[0])
    positions = [(0, 0)] * n
    positions[home[0]] = (f["start_positions"][home[0]], f["end_positions"][home[0]])
    s, e = _oracle_logits(f, positions)
    ds, de = f["start_positions"][decoy], f["end_positions"][decoy]
    s[decoy, ds - 3] += 50.0  # a non-max-context token of the decoy window
    e[decoy, de] += 50.0
    if f["max_context"][decoy, ds - 3]:
        pytest.skip("window layout put the decoy start at max context")
    preds, _, _ = squad_postprocess.postprocess([ex], f, s, e, version_2=False)
    assert preds["q"] == "Zoë  Mañana"


def test_v2_threshold_and_null_odds(tok):
    ex = _example("Paris is the capital of France.", "Paris")
    f = squad_features.convert_examples([ex], tok, 32, 8, 8, is_training=True)
    s_pos, e_pos = f["start_positions"][0], f["end_positions"][0]
    s, e = _oracle_logits(f, [(s_pos, e_pos)])
    s[0, 0], e[0, 0] = 6.0, 5.0  # null score 11, best span 20 -> diff -9
    for thresh, want in ((0.0, "Paris"), (-8.5, "Paris"), (-9.5, "")):
        preds, nbest, odds = squad_postprocess.postprocess(
            [ex], f, s, e, version_2=True, null_score_diff_threshold=thresh)
        assert odds["q"] == pytest.approx(11.0 - 20.0)
        assert preds["q"] == want
        assert any(x["text"] == "" for x in nbest["q"])  # null always listed in v2


def test_span_scores_add_in_float64_as_run_squad(tok):
    """run_squad.py adds start and end logits as Python floats. Two spans that tie in float32
    (both 1.0) are apart in float64: France 1 + 2**-40 beats Spain 1.0, which comes first
    in candidate order and so won the float32 tie."""
    context = "France borders Spain."
    ex = SquadExample("q", "Which country?", context, (("Spain", context.index("Spain")),))
    f = squad_features.convert_examples([ex], tok, 32, 8, 8, is_training=False)

    def span(word):
        c0 = context.index(word)
        (a,) = np.flatnonzero(f["char_start"][0] == c0)
        (b,) = np.flatnonzero(f["char_end"][0] == c0 + len(word))
        return a, b

    s = np.full(f["input_ids"].shape, -10.0, np.float32)
    e = np.full(f["input_ids"].shape, -10.0, np.float32)
    (fa, fb), (sa, sb) = span("France"), span("Spain")
    assert fb < sa  # France ends before Spain starts: (Spain start, France end) is no span
    s[0, sa], e[0, sb] = 1.0, 0.0
    s[0, fa], e[0, fb] = 1 - 2**-24, 2**-24 + 2**-40  # exact in float32
    assert float(s[0, fa]) + float(e[0, fb]) == 1 + 2**-40
    assert s[0, fa] + e[0, fb] == np.float32(1.0)  # the float32 sum rounds to the tie
    preds, nbest, _ = squad_postprocess.postprocess([ex], f, s, e, version_2=False)
    assert preds["q"] == "France"
    assert [x["text"] for x in nbest["q"][:2]] == ["France", "Spain"]
    # v2: null score 1 + 2**-24 (1.0 in float32) beats France by 2**-24 - 2**-40, computed
    # as run_squad.py's score_null - start_logit - end_logit.
    s[0, 0], e[0, 0] = 1.0, 2**-24
    preds, nbest, odds = squad_postprocess.postprocess([ex], f, s, e, version_2=True)
    assert odds["q"] == (1 + 2**-24) - (1 - 2**-24) - (2**-24 + 2**-40) == 2**-24 - 2**-40
    assert preds["q"] == ""
    assert [x["text"] for x in nbest["q"][:3]] == ["", "France", "Spain"]
    preds, _, _ = squad_postprocess.postprocess([ex], f, s, e, version_2=True,
                                                null_score_diff_threshold=1e-7)
    assert preds["q"] == "France"


def test_span_loss_by_hand():
    rng = np.random.default_rng(0)
    s, e = rng.normal(size=(3, 7)).astype(np.float32), rng.normal(size=(3, 7)).astype(np.float32)
    batch = {"start_positions": np.array([1, 0, 6]), "end_positions": np.array([2, 0, 6]),
             "example_weights": np.array([1.0, 1.0, 0.0], np.float32)}
    loss, m = squad.span_loss(jnp.asarray(s), jnp.asarray(e), batch)

    def xent(logits, i):
        return -(logits[i] - np.log(np.sum(np.exp(logits))))

    want = np.mean([(xent(s[0], 1) + xent(e[0], 2)) / 2, (xent(s[1], 0) + xent(e[1], 0)) / 2])
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert float(m["count"]) == 2.0


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_authored_set_oracle_scores_100_and_files(tok, tmp_path, version):
    """Every question of the committed set: the labelled span, fed back as logits, gives the
    gold answer exactly (EM = F1 = 100), through the task's own evaluate / write path."""
    path = DATA / "squad" / f"dev-v{version}.json"
    task = squad.SquadTask(version, train_file=str(path), predict_file=str(path),
                           max_seq_length=64, doc_stride=16, max_query_length=24)
    examples, data = read_squad_json(str(path))
    f = squad_features.convert_examples(examples, tok, 64, 16, 24, is_training=True)
    assert len(f["example_index"]) > 2 * len(examples)  # answers spread over many windows
    positions = [(a, b) for a, b in zip(f["start_positions"], f["end_positions"])]
    s, e = _oracle_logits(f, positions)
    eval_set = EvalSet("dev", f, examples, extra={"data": data})
    # Rows handed back in reverse order: the task must re-order them by feature_index.
    kept = {"start_logits": s[::-1], "end_logits": e[::-1],
            "feature_index": f["feature_index"][::-1]}
    out = task.score(eval_set, kept)
    score_key = "exact_match" if version == "1.1" else "exact"
    assert out[score_key] == pytest.approx(100.0) and out["f1"] == pytest.approx(100.0)
    files = task.write_predictions(eval_set, kept, str(tmp_path))
    names = sorted(p.rsplit("/", 1)[1] for p in files)
    want = ["nbest_predictions.json", "predictions.json"] + (
        ["null_odds.json"] if version == "2.0" else [])
    assert names == sorted(want)
    preds = json.loads((tmp_path / "predictions.json").read_text())
    assert set(preds) == {ex.qid for ex in examples}
