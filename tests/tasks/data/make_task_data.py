"""Authors the fine-tuning test sets in tests/tasks/data/ from the Shakespeare corpus.

    python tests/tasks/data/make_task_data.py --corpus /work/shared/corpus/shakespeare

Deterministic (seeded); the outputs are committed, so tests never need the corpus.

pairs/  (GLUE "tsv" format: index, sentence1, sentence2, label)
    "Does B quote A?" A: the opening (<= 18 words) of a speech. Label 1: B is a contiguous
    part of A with one or two words dropped; label 0: B is a span of a neighbouring speech
    of the same scene (same names and topic). 50/50.
squad/  (SQuAD JSON, v1.1 and v2.0)
    Context: 3-4 consecutive speeches (<= 12 words each) written "SPEAKER: words", at least
    two speakers. Question: "Who says '<opening 4-7 words of one speech>'?"; answer: that
    speech's SPEAKER span in the context.
    v2.0 adds unanswerable questions quoting a speech of the same play that is NOT in the
    context (its speaker may well be in it, so the name alone does not answer).
conll/  (CoNLL columns `word POS chunk tag`, IOB1 like CoNLL-2003)
    Speech lines that mention a character of the play by name: names tagged I-PER.
choice/  (SWAG's CSV layout: train.csv, val.csv)
    "Which ending quotes the speech?" sent1: "SPEAKER: <speech opening, <= 18 words>", sent2
    empty; the right ending quotes part of it with a word or two dropped, the three others
    are spans of neighbouring speeches of the same scene. Label position uniform. (A first
    design, "which speech comes next" against openings from other plays, was not learnable
    from 320 questions: MiniLM stayed at chance on dev.)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re

SPEAKER = re.compile(r"^([A-Z][A-Za-z' ]{1,28}[A-Za-z])\.$")
HERE = os.path.dirname(os.path.abspath(__file__))


def speeches(path):
    """[(scene_number, speaker, text)] of a play; text joined to one line."""
    out, scene = [], 0
    with open(path, encoding="utf-8") as f:
        blocks = re.split(r"\n\s*\n", f.read())
    for block in blocks:
        lines = [l.strip() for l in block.strip().split("\n") if l.strip()]
        if not lines:
            continue
        if re.match(r"^(SCENE|Scene)\b", lines[0]):
            scene += 1
            continue
        m = SPEAKER.match(lines[0])
        if not m or len(lines) < 2:
            continue
        text = " ".join(l for l in lines[1:] if not l.startswith("["))
        text = re.sub(r"\[[^\]]*\]", "", text)
        text = re.sub(r"\s+", " ", text).strip()
        if len(text.split()) >= 4:
            out.append((scene, m.group(1).strip(), text))
    return out


def clip(text, max_words):
    words = text.split()
    return " ".join(words[:max_words])


def make_pairs(plays, rng, n):
    """Label 1: B quotes a contiguous part of A with a word or two dropped (a noisy quote);
    label 0: B is a span of the same length from a neighbouring speech of the same scene,
    so topic and names do not give the answer away."""
    names = sorted(plays)
    rows = []
    while len(rows) < n:
        sp = plays[rng.choice(names)]
        i = rng.randrange(2, len(sp) - 2)
        words = sp[i][2].split()[:18]
        if len(words) < 8:
            continue
        if len(rows) % 2 == 0:
            lo = rng.randrange(0, len(words) // 3)
            quote = words[lo:lo + rng.randint(len(words) // 2, len(words) - lo)]
            for _ in range(rng.randint(1, 2)):
                if len(quote) > 4:
                    quote.pop(rng.randrange(1, len(quote) - 1))
            b, label = " ".join(quote), "1"
        else:
            j = i + rng.choice([-2, -1, 1, 2])
            if sp[j][0] != sp[i][0]:
                continue
            other = sp[j][2].split()
            if len(other) < 6:
                continue
            lo = rng.randrange(0, max(1, len(other) - 6))
            b, label = " ".join(other[lo:lo + rng.randint(5, 12)]), "0"
        rows.append((" ".join(words), b, label))
    rng.shuffle(rows)
    return rows


def write_tsv(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("index\tsentence1\tsentence2\tlabel\n")
        for i, (a, b, label) in enumerate(rows):
            f.write(f"{i}\t{a}\t{b}\t{label}\n")


def make_squad(plays, rng, n, version, prefix):
    names = sorted(plays)
    articles = []
    count = 0
    while count < n:
        play = rng.choice(names)
        sp = plays[play]
        k = rng.randint(3, 4)
        i = rng.randrange(len(sp) - k)
        window = sp[i:i + k]
        if len({s[0] for s in window}) != 1 or len({s[1] for s in window}) < 2:
            continue
        context, starts = "", []
        for _, speaker, text in window:
            starts.append(len(context))
            context += f"{speaker}: {clip(text, 12)}\n"
        context = context.rstrip("\n")
        j = rng.randrange(k)
        speaker, text = window[j][1], window[j][2]
        quote = clip(text, rng.randint(4, 7))
        qas = [{"id": f"{prefix}{count}", "question": f"Who says '{quote}'?",
                "answers": [{"text": speaker, "answer_start": starts[j]}]}]
        if version == "2.0":
            qas[0]["is_impossible"] = False
            # An unanswerable twin: a speech of the same play outside the context.
            far = [s for s in sp[:max(0, i - 20)] + sp[i + k + 20:] if s[2] not in context]
            if far and rng.random() < 0.5:
                other = rng.choice(far)
                qas.append({"id": f"{prefix}{count}n",
                            "question": f"Who says '{clip(other[2], rng.randint(4, 7))}'?",
                            "answers": [], "is_impossible": True})
        count += 1
        articles.append({"title": play, "paragraphs": [{"context": context, "qas": qas}]})
    return {"version": version, "data": articles}


def make_conll(plays, rng, n):
    sentences = []
    names = sorted(plays)
    while len(sentences) < n:
        play = rng.choice(names)
        cast = {s[1].title() for s in plays[play] if s[1].isupper() and " " not in s[1]}
        cast = {c for c in cast if len(c) > 2}
        if not cast:
            continue
        _, _, text = rng.choice(plays[play])
        words = re.findall(r"[A-Za-z']+|[^\sA-Za-z']", text)[:40]
        tags = ["I-PER" if w in cast else "O" for w in words]
        if "I-PER" in tags:
            sentences.append(list(zip(words, tags)))
    return sentences


def write_conll(path, sentences):
    with open(path, "w", encoding="utf-8") as f:
        f.write("-DOCSTART- -X- -X- O\n\n")
        for sent in sentences:
            for w, t in sent:
                f.write(f"{w} X X {t}\n")
            f.write("\n")


def make_choice(plays, rng, n):
    """Which ending quotes the speech? sent1 "SPEAKER: <speech opening, <= 18 words>";
    the right ending is a contiguous part of it with a word or two dropped (as pairs/), the
    three others spans of neighbouring speeches of the same scene (same names and topic)."""
    names = sorted(plays)
    rows = []
    while len(rows) < n:
        sp = plays[rng.choice(names)]
        i = rng.randrange(3, len(sp) - 3)
        scene, speaker, text = sp[i]
        words = text.split()[:18]
        if len(words) < 8:
            continue
        lo = rng.randrange(0, len(words) // 3)
        quote = words[lo:lo + rng.randint(len(words) // 2, len(words) - lo)]
        for _ in range(rng.randint(1, 2)):
            if len(quote) > 4:
                quote.pop(rng.randrange(1, len(quote) - 1))
        near = [s[2].split() for s in sp[i - 3:i] + sp[i + 1:i + 4]
                if s[0] == scene and len(s[2].split()) >= 6]
        if len(near) < 3:
            continue
        wrong = []
        for other in rng.sample(near, 3):
            a = rng.randrange(0, max(1, len(other) - 6))
            wrong.append(" ".join(other[a:a + rng.randint(5, 12)]))
        label = rng.randrange(4)
        endings = wrong[:label] + [" ".join(quote)] + wrong[label:]
        rows.append((speaker, f"{speaker}: {' '.join(words)}", "", endings, label))
    return rows


def write_swag_csv(path, rows):
    """SWAG's columns, with pandas' unnamed index column first, as in the real files."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
                    "ending0", "ending1", "ending2", "ending3", "label"])
        for i, (play, sent1, sent2, endings, label) in enumerate(rows):
            w.writerow([i, play, i, f"{sent1} {sent2}".strip(), sent1, sent2, "gold", *endings,
                        label])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default="/work/shared/corpus/shakespeare")
    args = parser.parse_args()
    files = sorted(f for f in os.listdir(args.corpus) if f.endswith(".txt"))
    plays = {}
    for f in files:
        sp = speeches(os.path.join(args.corpus, f))
        if len(sp) > 200:
            plays[f[:-4]] = sp
    # Disjoint plays for train and dev: dev measures generalisation, not memory.
    names = sorted(plays)
    rng = random.Random(1234)
    rng.shuffle(names)
    dev_names, train_names = names[:8], names[8:]
    train = {k: plays[k] for k in train_names}
    dev = {k: plays[k] for k in dev_names}
    for d in ("pairs", "squad", "conll", "choice"):
        os.makedirs(os.path.join(HERE, d), exist_ok=True)
    write_tsv(os.path.join(HERE, "pairs", "train.tsv"), make_pairs(train, random.Random(1), 320))
    write_tsv(os.path.join(HERE, "pairs", "dev.tsv"), make_pairs(dev, random.Random(2), 200))
    for version in ("1.1", "2.0"):
        for split, src, n, seed in (("train", train, 320, 3), ("dev", dev, 150, 4)):
            doc = make_squad(src, random.Random(seed), n, version, f"{split}-")
            with open(os.path.join(HERE, "squad", f"{split}-v{version}.json"), "w",
                      encoding="utf-8") as f:
                json.dump(doc, f, ensure_ascii=False)
    write_conll(os.path.join(HERE, "conll", "train.txt"), make_conll(train, random.Random(5), 300))
    write_conll(os.path.join(HERE, "conll", "dev.txt"), make_conll(dev, random.Random(6), 100))
    write_swag_csv(os.path.join(HERE, "choice", "train.csv"),
                   make_choice(train, random.Random(7), 320))
    write_swag_csv(os.path.join(HERE, "choice", "val.csv"), make_choice(dev, random.Random(8), 160))
    print("plays:", len(plays), "train:", train_names, "dev:", dev_names)


if __name__ == "__main__":
    main()
