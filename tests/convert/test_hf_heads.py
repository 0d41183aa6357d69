"""Every head exported as its own transformers class: config.json (architecture, labels,
problem_type) and the tokenizer files written from the model directory's task.json with no
flag (fast), and, for tiny models fine-tuned here on the authored task sets, transformers'
AutoModelFor* + AutoTokenizer giving our logits and its token-classification pipeline our
label names (slow: torch, in a child process as verify's reference)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.convert import hf_files, model_dir
from bert_jax.convert.__main__ import main
from tests.tasks.conftest import DATA, VOCAB

TINY = {"model.hidden_size": 32, "model.num_hidden_layers": 1,
        "model.num_attention_heads": 4, "model.intermediate_size": 64,
        "model.max_position_embeddings": 128}
NER_LABELS = ("O", "B-PER", "I-PER")

# kind -> (configs/<file>, overrides): a tiny model, 2 training steps, best_model/ kept.
FINETUNES = {
    "pairs": ("configs/glue.py:tsv", {"task.data_dir": str(DATA / "pairs")}),
    "regression": ("configs/glue.py:tsv", {"task.data_dir": str(DATA / "pairs"),
                                           "task.regression": True}),
    "ner": ("configs/ner.py", {"task.train_file": str(DATA / "conll" / "train.txt"),
                               "task.dev_file": str(DATA / "conll" / "dev.txt"),
                               "task.labels": NER_LABELS}),
    "squad": ("configs/squad.py:1.1", {
        "task.train_file": str(DATA / "squad" / "train-v1.1.json"),
        "task.predict_file": str(DATA / "squad" / "dev-v1.1.json"),
        "task.doc_stride": 48, "task.max_query_length": 24}),
    "choice": ("configs/swag.py", {"task.train_file": str(DATA / "choice" / "train.csv"),
                                   "task.dev_file": str(DATA / "choice" / "val.csv")}),
}
ARCH = {"pairs": "BertForSequenceClassification", "regression": "BertForSequenceClassification",
        "ner": "BertForTokenClassification", "squad": "BertForQuestionAnswering",
        "choice": "BertForMultipleChoice"}


def finetune_tiny(kind: str, workdir) -> str:
    """A tiny random BERT fine-tuned 2 steps on the authored `kind` set; its best_model/."""
    from bert_jax.tasks import finetune
    from bert_jax.train.config import load_config

    spec, overrides = FINETUNES[kind]
    c = load_config(spec, {**TINY, **overrides, "task.max_seq_length": 96,
                           "task.cache_dir": str(workdir / "cache"),
                           "tokenizer.vocab_file": str(VOCAB), "train.steps": 2,
                           "train.batch_size": 8, "train.eval_batch_size": 64,
                           "train.tensorboard": False, "schedule.lr": 1e-3,
                           "schedule.warmup_steps": 0})
    finetune.run(c, str(workdir / "run"), progress=False)
    return str(workdir / "run" / "best_model")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, compile_cache):
    """{kind: best_model/ of a tiny fine-tune} for every head kind (built on first use)."""
    cache: dict = {}

    def get(kind):
        if kind not in cache:
            cache[kind] = finetune_tiny(kind, tmp_path_factory.mktemp(f"tuned_{kind}"))
        return cache[kind]

    return get


# kind -> what a fine-tune of it records in best_model/task.json (None: nothing recorded).
RECORDS = {"pairs": ("glue", ("0", "1")), "regression": ("glue", None),
           "ner": ("ner", NER_LABELS), "squad": ("squad", None), "choice": ("choice", None),
           "pretraining": None, "mlm": None}
ARCH.update(pretraining="BertForPreTraining", mlm="BertForMaskedLM")


def head_dir(tmp_path, kind: str, n: int = 0, task=(), vocab=True) -> str:
    """A model directory of a random tiny BERT with `kind`'s head (n outputs for a
    classifier: default the record's labels) and its task record (`task`: default
    RECORDS[kind]'s, with the casing, as fine-tuning writes it)."""
    import flax
    import jax

    from bert_jax.models import bert
    from bert_jax.models.config import BertConfig

    config = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    if task == ():
        task = RECORDS[kind] and model_dir.task_record(*RECORDS[kind], do_lower_case=True)
    labels = (task or {}).get("labels")
    n = n or (len(labels) if labels else 1)
    model = {"pairs": lambda: bert.BertForSequenceClassification(config, n),
             "regression": lambda: bert.BertForSequenceClassification(config, n),
             "ner": lambda: bert.BertForTokenClassification(config, n),
             "squad": lambda: bert.BertForQuestionAnswering(config),
             "choice": lambda: bert.BertForMultipleChoice(config),
             "pretraining": lambda: bert.BertForPreTraining(config),
             "mlm": lambda: bert.BertForPreTraining(config, nsp=False)}[kind]()
    ids = np.zeros((1, 8), np.int32)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), ids, ids, ids)["params"]
    params = flax.core.meta.unbox(params)
    path = str(tmp_path / f"{kind}_{n}_{bool(task)}_{vocab}")
    model_dir.save_model_dir(path, params, config, str(VOCAB) if vocab else None, task=task)
    return path


@pytest.mark.parametrize("kind", sorted(RECORDS))
def test_to_hf_config_and_tokenizer_files(kind, tmp_path, capsys):
    """The model directory's task.json, no flag: the class of the head, the labels by
    name, problem_type for sequence classifiers, the tokenizer files; from-hf of the
    export records the same task again."""
    out = tmp_path / "hf"
    main(["to-hf", f"--checkpoint={head_dir(tmp_path, kind)}", f"--output={out}"])
    assert capsys.readouterr().err == ""  # a vocabulary and a task record: no warning
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors",
                                       "special_tokens_map.json", "tokenizer_config.json",
                                       "vocab.txt"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [ARCH[kind]]
    labels = {"pairs": ["0", "1"], "regression": ["LABEL_0"], "ner": list(NER_LABELS)}.get(kind)
    if labels is None:
        assert not {"id2label", "label2id", "num_labels", "problem_type"} & set(cfg)
    else:
        assert cfg["num_labels"] == len(labels)
        assert cfg["id2label"] == {str(i): x for i, x in enumerate(labels)}
        assert cfg["label2id"] == {x: i for i, x in enumerate(labels)}
        assert cfg.get("problem_type") == {"pairs": "single_label_classification",
                                           "regression": "regression"}.get(kind)
    tok = json.loads((out / "tokenizer_config.json").read_text())
    assert tok["tokenizer_class"] == "BertTokenizer" and tok["do_lower_case"] is True
    assert tok["model_max_length"] == 32
    specials = json.loads((out / "special_tokens_map.json").read_text())
    assert specials == {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]",
                        "sep_token": "[SEP]", "unk_token": "[UNK]"}
    assert {k: tok[k] for k in specials} == specials
    # ... and from-hf carries the task back into a model directory.
    main(["from-hf", f"--input={out}", f"--output={tmp_path / 'back'}"])
    back = model_dir.dir_task(str(tmp_path / "back"))
    if RECORDS[kind] is None:
        assert back == model_dir.task_record("pretraining", do_lower_case=True)
    else:
        assert back == model_dir.task_record(*RECORDS[kind], do_lower_case=True)


def test_without_a_vocabulary_or_a_task_record_it_warns(tmp_path, capsys):
    """No vocab.txt: one line on stderr naming --vocab_file, no tokenizer files; no
    task.json: a 3-output classifier is a sequence classifier of LABEL_i, and says so;
    --vocab_file adds the tokenizer files, the casing told by the vocabulary."""
    src = head_dir(tmp_path, "pairs", 3, task=None, vocab=False)
    main(["to-hf", f"--checkpoint={src}", f"--output={tmp_path / 'a'}"])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "--vocab_file" in err[1] and "no vocab.txt" in err[1]
    assert "BertForSequenceClassification" in err[0] and "LABEL_0..LABEL_2" in err[0]
    assert sorted(os.listdir(tmp_path / "a")) == ["config.json", "model.safetensors"]
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
    main(["to-hf", f"--checkpoint={src}", f"--output={tmp_path / 'b'}",
          f"--vocab_file={VOCAB}"])
    assert len(capsys.readouterr().err.splitlines()) == 1
    tok = json.loads((tmp_path / "b" / "tokenizer_config.json").read_text())
    assert tok["do_lower_case"] is True  # the uncased vocabulary


def test_recorded_labels_and_casing_are_written(tmp_path, capsys):
    task = model_dir.task_record("ner", ("O", "B-LOC", "I-LOC"), do_lower_case=False)
    main(["to-hf", f"--checkpoint={head_dir(tmp_path, 'ner', 3, task)}",
          f"--output={tmp_path / 'hf'}"])
    assert capsys.readouterr().err == ""
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["BertForTokenClassification"]
    assert cfg["id2label"] == {"0": "O", "1": "B-LOC", "2": "I-LOC"}
    assert "problem_type" not in cfg
    tok = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert tok["do_lower_case"] is False
    # A record that does not fit the head is refused, naming both counts.
    bad = model_dir.task_record("glue", ("a", "b"))
    with pytest.raises(SystemExit, match=r"2 labels \['a', 'b'\] but the classifier has 3"):
        main(["to-hf", f"--checkpoint={head_dir(tmp_path, 'pairs', 3, bad)}",
              f"--output={tmp_path / 'bad'}"])


def test_uncased_vocabulary_test(tmp_path):
    cased = tmp_path / "cased.txt"
    cased.write_text("[PAD]\n[unused0]\n[CLS]\nthe\nThe\n##s\n")
    assert not hf_files.vocab_is_uncased(str(cased))
    assert hf_files.vocab_is_uncased(str(VOCAB))


# --- tiny fine-tunes, and transformers on their exports (slow; torch) -----------------------


@pytest.mark.slow
def test_finetune_records_the_task_in_best_model(tuned):
    got = {k: model_dir.dir_task(tuned(k)) for k in ("pairs", "regression", "ner")}
    assert got["pairs"] == {"kind": "glue", "name": "tsv", "labels": ["0", "1"],
                            "do_lower_case": True}
    assert got["regression"]["kind"] == "glue" and got["regression"]["labels"] is None
    assert got["ner"]["kind"] == "ner" and got["ner"]["labels"] == list(NER_LABELS)
    # The run itself records it too (WORKDIR/run_0/task.json, read by convert.sources when
    # a run's checkpoints are exported), so a run exports as its best_model/ does.
    for k in ("pairs", "ner"):
        run = os.path.join(os.path.dirname(tuned(k)), "run_0")
        assert model_dir.dir_task(run) == got[k], k

TEXTS = [("The quick brown fox jumps over the lazy dog.", "A dog sleeps."),
         ("Where is the station?", "Two streets down, on the left, near Anna's house.")]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(FINETUNES))
def test_transformers_gives_our_logits(tuned, kind, tmp_path):
    for mod in ("torch", "transformers"):
        pytest.importorskip(mod, reason="the reference side needs PyTorch and transformers")
    out = str(tmp_path / "hf")
    main(["to-hf", f"--checkpoint={tuned(kind)}", f"--output={out}"])
    ref = _transformers(out, kind, tmp_path)
    ours = _our_logits(tuned(kind), kind, ref)
    if kind == "ner":  # compared at real tokens only (padding is never looked at)
        ref["logits"] = np.where(ref["attention_mask"][..., None] > 0, ref["logits"], 0.0)
    for name, value in ours.items():
        assert value.shape == ref[name].shape, name
        assert np.max(np.abs(value - ref[name])) <= 1e-4, (name, np.max(np.abs(value - ref[name])))
    # AutoTokenizer tokenizes as ours does.
    from bert_jax.tokenization import load_tokenizer

    tok = load_tokenizer(vocab_file=str(VOCAB), do_lower_case=True)
    for i, (a, b) in enumerate(TEXTS):
        ids = [tok.cls_id] + tok.encode(a) + [tok.sep_id]
        if kind != "ner":  # NER: single sentences
            ids += tok.encode(b) + [tok.sep_id]
        n = int(ref["attention_mask"][i].sum()) if kind != "choice" else None
        if n is not None:
            assert ref["input_ids"][i, :n].tolist() == ids
    if kind == "ner":
        # The pipeline's labels are ours, at every token: our own argmax named by our labels.
        pipe = json.loads(str(ref["pipeline"]))
        labels = [NER_LABELS[j] for j in np.argmax(ours["logits"][0], -1)]
        assert pipe and all(p["entity"] == labels[p["index"]] for p in pipe), pipe
        assert {p["entity"] for p in pipe} <= set(NER_LABELS)
    if kind == "squad" and "pipeline" in ref:  # transformers 5 has no such pipeline
        span = json.loads(str(ref["pipeline"]))
        start, end = _best_span(ours["start_logits"][0], ours["end_logits"][0],
                                ref["context_mask"][0])
        offsets = ref["offsets"][0]
        assert (span["start"], span["end"]) == (int(offsets[start][0]), int(offsets[end][1]))


def _best_span(start, end, context, max_len: int = 15):
    """The question-answering pipeline's choice: the context span (s <= e < s + max_len)
    with the largest start + end logits."""
    s = np.where(context, start, -np.inf)
    e = np.where(context, end, -np.inf)
    score = s[:, None] + e[None, :]
    i, j = np.indices(score.shape)
    score[(j < i) | (j >= i + max_len)] = -np.inf
    return np.unravel_index(np.argmax(score), score.shape)


def _transformers(directory: str, kind: str, tmp_path) -> dict:
    script = os.path.join(os.path.dirname(__file__), "hf_heads_reference.py")
    out = str(tmp_path / "ref.npz")
    r = subprocess.run([sys.executable, script, directory, kind, out,
                        json.dumps(TEXTS)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


def _our_logits(path: str, kind: str, ref: dict) -> dict:
    import jax

    from bert_jax.models import bert

    params, config = model_dir.load_model_dir(path)
    args = (ref["input_ids"], ref["attention_mask"], ref["token_type_ids"])
    n = int(np.shape(params["classifier"]["dense"]["bias"])[0]) if "classifier" in params else 0
    model = {"pairs": lambda: bert.BertForSequenceClassification(config, n),
             "regression": lambda: bert.BertForSequenceClassification(config, n),
             "ner": lambda: bert.BertForTokenClassification(config, n),
             "squad": lambda: bert.BertForQuestionAnswering(config),
             "choice": lambda: bert.BertForMultipleChoice(config)}[kind]()
    res = jax.jit(model.apply)({"params": params}, *args)
    if kind == "squad":
        return {"start_logits": np.asarray(res[0]), "end_logits": np.asarray(res[1])}
    logits = np.asarray(res)
    if kind == "ner":  # compared at real tokens only (padding is never looked at)
        logits = np.where(ref["attention_mask"][..., None] > 0, logits, 0.0)
    return {"logits": logits}
