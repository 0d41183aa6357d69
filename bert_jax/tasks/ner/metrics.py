"""Entity-level precision / recall / F1 for NER, with the semantics of seqeval's default
(non-strict) mode, so IOB1 (CoNLL-2003 as distributed), IOB2 (B- at every entity start) and
IOBES tags of the same entities all score the same way; on IOB1 / IOB2 tags these are also
conlleval's:

  * an entity starts at B-X / S-X, or at I-X / E-X whose previous tag is O, E-*, S-*, or of
    another type (this is what makes IOB1 work: I-X after O opens an entity);
  * an entity ends before O, B-*, S-*, a tag of another type, or after E-* / S-*.

conlleval.pl was written for IOB / IOE chunk tags: it has no S- rules and no rule that
ends an entity at E-X B-X, so it reads S-X S-X and E-X B-X as one phrase (two here).

A tag without a B-/I-/E-/S- prefix ("PER") is read here as I-PER (the IO scheme: a run of
one such tag is one entity). Neither reference does that, and they disagree. conlleval.pl
(and spyysalo's conlleval.py port) splits a tag at its first "-", else takes the whole tag
as the chunk tag with an empty type, the type of O: a bare tag after O or after another
bare tag opens nothing, and after a typed tag it opens a phrase of empty type that O does
not close (sighsmile's conlleval.py port stops with an unpacking error). seqeval warns
"PER seems not to be NE tag." and splits off the first letter (prefix "P", type "ER").
Scores of a bare-tag label set are therefore this module's alone.

`strict=True` follows seqeval's strict IOB2 mode instead: only a B-X opens an entity, an
I-X continues only a B-X/I-X of the same type, and a stray I-X is not an entity.

Hand-written (about 60 lines) so that the runtime needs no seqeval; the tests compare with
seqeval on fixtures and random tag sequences, and with conlleval.pl's rules re-stated.
"""

from __future__ import annotations

from typing import Sequence

Entity = tuple[str, int, int]  # (type, first token, last token), inclusive


def _split(tag: str) -> tuple[str, str]:
    if tag in ("O", ""):
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if not sep or prefix not in ("B", "I", "E", "S"):
        # No B/I/E/S prefix: the whole tag is the type, read as I- (see the module docstring).
        return "I", tag
    return prefix, kind


def _ends(prev_p, prev_t, p, t) -> bool:
    if prev_p == "O":
        return False
    return (prev_p in ("E", "S") or p in ("B", "S", "O") or prev_t != t)


def _starts(prev_p, prev_t, p, t) -> bool:
    if p == "O":
        return False
    return (p in ("B", "S") or prev_p in ("E", "S", "O") or prev_t != t)


def get_entities(tags: Sequence[str]) -> list[Entity]:
    """Entities of one sentence (lenient / conlleval semantics)."""
    out, start, prev_p, prev_t = [], None, "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        p, t = _split(tag)
        if start is not None and _ends(prev_p, prev_t, p, t):
            out.append((prev_t, start, i - 1))
            start = None
        if _starts(prev_p, prev_t, p, t):
            start = i
        prev_p, prev_t = p, t
    return out


def get_entities_strict_iob2(tags: Sequence[str]) -> list[Entity]:
    out, start, kind = [], None, ""
    for i, tag in enumerate(list(tags) + ["O"]):
        p, t = _split(tag)
        if start is not None and not (p == "I" and t == kind):
            out.append((kind, start, i - 1))
            start = None
        if p == "B":
            start, kind = i, t
    return out


def entity_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]],
              strict: bool = False) -> dict[str, float]:
    """Micro precision / recall / F1 over all sentences, plus f1_<TYPE> per entity type.
    gold, pred: per sentence, one tag per word (lengths must match)."""
    if len(gold) != len(pred):
        raise ValueError(f"entity_f1: {len(gold)} gold sentences but {len(pred)} predicted")
    extract = get_entities_strict_iob2 if strict else get_entities
    correct_by, gold_by, pred_by = {}, {}, {}
    for n, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"entity_f1: sentence {n} has {len(g)} gold tags but {len(p)} "
                             "predicted")
        ge, pe = set(extract(g)), set(extract(p))
        for bucket, ents in ((gold_by, ge), (pred_by, pe), (correct_by, ge & pe)):
            for e in ents:
                bucket[e[0]] = bucket.get(e[0], 0) + 1

    def prf(c, n_pred, n_gold):
        precision = c / n_pred if n_pred else 0.0
        recall = c / n_gold if n_gold else 0.0
        f = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return precision, recall, f

    c, np_, ng = (sum(d.values()) for d in (correct_by, pred_by, gold_by))
    precision, recall, f = prf(c, np_, ng)
    out = {"precision": precision, "recall": recall, "f1": f}
    for kind in sorted(set(gold_by) | set(pred_by)):
        out[f"f1_{kind}"] = prf(correct_by.get(kind, 0), pred_by.get(kind, 0),
                                gold_by.get(kind, 0))[2]
    return out


def token_accuracy(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
    total = sum(len(g) for g in gold)
    same = sum(a == b for g, p in zip(gold, pred) for a, b in zip(g, p))
    return same / total if total else 0.0
