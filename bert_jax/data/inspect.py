r"""The data doctor: what is in a set of pre-training TFRecords, and does it fit the config?

    python -m bert_jax.data.inspect --input='gs://bucket/pretrain/*.tfrecord' \
        --vocab_file=vocab.txt --max_seq_length=128 --max_predictions_per_seq=20

Reads a sample (--num_records, spread over up to --max_files files) and prints: the
feature names, kinds and lengths found (and whether they match the given lengths; without
them the lengths are inferred), token ids outside the vocabulary, the real mask ratio and
its [MASK] / random / unchanged split (with the vocab), the IsNext ratio, a histogram of
sequence lengths, and the first examples decoded back to text. Packed files (data_prep
--pack) are recognised by their features: the doctor then also prints the sequences per
row and the padding, and checks each row's layout (sequences back to back, positions
restarting, a [CLS] at each next_sentence_position, the NSP weights; checks.packed_problems);
a file of the other layout among them is a problem. Exits with status 1 when a
record does not match (the same checks `pretrain.check_input` runs before training), a file
is empty, or (with --vocab_file) most tokens are [UNK] (tokenization.UNK_ERROR; a warning
from UNK_WARN on). --verify also reads and parses every record of every file: it names
corrupt, truncated and empty shards, and the first record of a file that training could not
parse (a missing feature, other lengths).
"""

from __future__ import annotations

import collections
import concurrent.futures
import math
import sys
from typing import Any, Sequence

from bert_jax import cli

if __name__ == "__main__":
    cli.quiet_native_logs()  # before TensorFlow loads (below)

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from bert_jax.data import checks  # noqa: E402
from bert_jax.data import features as features_lib  # noqa: E402
from bert_jax import tokenization  # noqa: E402
from bert_jax.data import pretrain, shards  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("input", None, "Comma-separated TFRecord glob(s).")
flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt or SentencePiece .model.")
flags.DEFINE_integer("max_seq_length", None, "Expected sequence length (default: inferred).")
flags.DEFINE_integer("max_predictions_per_seq", None,
                     "Expected masked-LM slots (default: inferred).")
flags.DEFINE_integer("num_records", 1000, "Records to sample.")
flags.DEFINE_integer("max_files", 64, "Files to sample from (evenly spaced).")
flags.DEFINE_integer("show", 2, "Examples to print decoded.")
flags.DEFINE_bool("verify", False, "Also read EVERY record of EVERY file (CRCs, framing, "
                  "file size) and count them: finds corrupt or truncated shards.")


def sample(files: Sequence[str], num_records: int, max_files: int):
    """[(file, index, decoded or None, error)] from up to max_files evenly spaced files."""
    if len(files) > max_files:
        files = [files[int(i)] for i in np.linspace(0, len(files) - 1, max_files)]
    per_file = max(1, math.ceil(num_records / len(files)))
    out, unreadable = [], []
    for path, records, error in checks.first_records(files, per_file):
        if error:
            unreadable.append((path, error))
        elif not records:
            unreadable.append((path, _EMPTY))
        for i, raw in enumerate(records):
            try:
                out.append((path, i, checks.decode_example(raw)))
            except Exception as e:  # not an Example
                unreadable.append((path, f"record {i} is not a tf.train.Example: {e}"))
    return files, out[:max(num_records, len(files))], unreadable


_EMPTY = "empty file (no records), expected TFRecords of create_pretraining_data.py"


def _mode(values):
    return collections.Counter(values).most_common(1)[0][0] if values else None


def report(patterns: str, *, vocab_file: str | None = None, max_seq_length: int | None = None,
           max_predictions_per_seq: int | None = None, num_records: int = 1000,
           max_files: int = 64, verify: bool = False, show: int = 2) -> dict[str, Any]:
    """The doctor's findings as a dict (see `format_report`)."""
    all_files = shards.expand_files(patterns, "--input")
    files, records, unreadable = sample(all_files, num_records, max_files)
    r: dict[str, Any] = dict(num_files=len(all_files), sampled_files=len(files),
                             num_records=len(records), unreadable=unreadable)
    vocab, tokens = None, None
    if vocab_file:
        cfg = pretrain.data_config(vocab_file=vocab_file)
        vocab = tokenization.vocab_info(cfg, with_unk=True)
        tok = (tokenization.load_tokenizer(spm_model_file=vocab_file)
               if vocab_file.endswith(".model") else
               tokenization.load_tokenizer(vocab_file=vocab_file))
        tokens = tok.convert_ids_to_tokens
    r["vocab"] = vocab

    found = collections.defaultdict(lambda: {"kinds": collections.Counter(),
                                             "lengths": collections.Counter()})
    for _, _, dec in records:
        for name, (kind, values) in dec.items():
            found[name]["kinds"][kind] += 1
            found[name]["lengths"][len(values)] += 1
    packs = [features_lib.packing_of(checks.value_counts(d)) for _, _, d in records]
    pack = packs[0] if packs else 0  # the layout of the first record read
    slots = _mode([len(d["masked_lm_ids"][1]) for _, _, d in records if "masked_lm_ids" in d])
    inferred = dict(
        max_seq_length=_mode([len(d["input_ids"][1]) for _, _, d in records if "input_ids" in d]),
        max_predictions_per_seq=slots and features_lib.predictions_per_seq_of_pack(slots, pack))
    seq = max_seq_length or inferred["max_seq_length"] or 0
    preds = max_predictions_per_seq or inferred["max_predictions_per_seq"] or 0
    r.update(inferred=inferred, max_seq_length=seq, max_predictions_per_seq=preds,
             lengths_given=bool(max_seq_length and max_predictions_per_seq),
             max_sequences_per_pack=pack)
    table = features_lib.feature_table(pack)
    expected = features_lib.feature_lengths(seq, preds, pack)
    r["features"] = {
        name: dict(kinds=dict(info["kinds"]), lengths=dict(info["lengths"]),
                   expected_kind=table.get(name, (None,))[0],
                   expected_length=expected.get(name))
        for name, info in sorted(found.items())}
    r["missing"] = [n for n in table if n not in found]

    problems = [(p, e if e == _EMPTY else f"unreadable: {e}") for p, e in unreadable]
    warnings = []
    if verify:
        scanned = shards.scan_files(all_files)
        bad = [(f, n, e) for f, (n, e) in scanned.items() if e]
        r["verified"] = dict(files=len(all_files), records=sum(n for n, _ in scanned.values()),
                             corrupt=len(bad))
        problems += [(f, f"corrupt shard after {n} good records: {e}") for f, n, e in bad]
        problems += [(f, _EMPTY) for f, (n, e) in scanned.items()
                     if not n and not e and (f, _EMPTY) not in problems]
        # Every record parsed as training parses it: a record missing a feature, or of
        # other lengths, anywhere in a file (the sample above reads only the first ones).
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            parsed = pool.map(lambda f: checks.first_bad_record(
                f, max_seq_length=seq, max_predictions_per_seq=preds,
                max_sequences_per_pack=pack), all_files)
            problems += [(f"{f} {bad[0]}", bad[1]) for f, bad in zip(all_files, parsed) if bad]
    if not records and not problems:
        problems.append((checks.files_named(all_files), "no records to check"))
    for (path, i, dec), own in zip(records, packs):
        if own != pack:
            problems.append((f"{path} record {i}", checks.layout_problem(
                own, pack, f"{records[0][0]} record {records[0][1]}", "--input")))
            continue
        for p in checks.check_record(dec, max_seq_length=seq, max_predictions_per_seq=preds,
                                     vocab_size=vocab and vocab["vocab_size"],
                                     max_sequences_per_pack=pack,
                                     cls_id=vocab and vocab["cls_id"]):
            problems.append((f"{path} record {i}", p))
    if vocab and vocab.get("unk_id") is not None and records:
        unk, total = checks.unk_counts([d for _, _, d in records], vocab)
        r["unk_fraction"] = unk / total if total else 0.0
        where = f"{checks.files_named(files)} (the {len(records)} records read)"
        try:
            warning = tokenization.check_unk_rate(unk, total, where, vocab_file)
        except tokenization.VocabError as e:
            problems.append((where, str(e)[len(where) + 2:]))
        else:
            warnings += [warning] if warning else []
    r["problems"] = checks.group(problems)
    r["warnings"] = warnings

    # Statistics over the records that have the features with consistent lengths.
    good = [d for _, _, d in records
            if all(n in d and len(d[n][1]) == expected[n] for n in table)]
    r["num_well_formed"] = len(good)
    if good:
        get = lambda n: np.stack([d[n][1] for d in good])  # noqa: E731
        ids, mask = get("input_ids"), get("input_mask")
        pos, labels, w = get("masked_lm_positions"), get("masked_lm_ids"), get("masked_lm_weights")
        real = w > 0
        lengths = mask.sum(1)
        r["mask_ratio"] = float(real.sum() / max(1, lengths.sum()))
        r["masked_per_example"] = float(real.sum(1).mean())
        if vocab_size := (vocab and vocab["vocab_size"]):
            bad = lambda a: (a < 0) | (a >= vocab_size)  # noqa: E731
            r["out_of_vocab_records"] = int((bad(ids).any(1) | bad(labels).any(1)).sum())
        if vocab:
            at = np.take_along_axis(ids, np.clip(pos, 0, ids.shape[1] - 1), 1)[real]
            orig = labels[real]
            is_mask = at == vocab["mask_id"]
            same = (at == orig) & ~is_mask
            n = max(1, real.sum())
            r["mask_split"] = dict(mask=float(is_mask.sum() / n), unchanged=float(same.sum() / n),
                                   random=float((~is_mask & ~same).sum() / n))
        r["padding_fraction"] = float(1 - mask.sum() / mask.size)
        nsp = get("next_sentence_labels")
        nsp_w = get("next_sentence_weights") if pack else np.ones_like(nsp, np.float32)
        r["sequences_per_row"] = float(nsp_w.sum() / len(good))
        r["is_next_ratio"] = float(((nsp == features_lib.IS_NEXT) * nsp_w).sum()
                                   / max(nsp_w.sum(), 1))
        nsp = nsp[:, 0]  # the row's first sequence, for the examples below
        edges = np.linspace(0, max(seq, 1), 9).astype(int)
        hist, _ = np.histogram(lengths, bins=edges)
        r["length_histogram"] = [(int(a), int(b), int(c)) for a, b, c in
                                 zip(edges[:-1], edges[1:], hist)]
        r["mean_length"] = float(lengths.mean())
        r["examples"] = []
        for k in range(min(show, len(good))):
            n = int(lengths[k])
            row = ids[k][:n]
            shown = tokens(row) if tokens else [str(t) for t in row]
            if tokens:
                for p_, l_, w_ in zip(pos[k], labels[k], w[k]):
                    if w_ > 0 and p_ < n:
                        shown[p_] = f"{shown[p_]}({tokens([l_])[0]})"
            r["examples"].append(dict(text=" ".join(shown), is_next=int(nsp[k]) == 0,
                                      length=n, sequences=int(nsp_w[k].sum())))
    return r


def format_report(r: dict[str, Any]) -> str:
    out = [f"files: {r['num_files']} matched, {r['sampled_files']} sampled; "
           f"records read: {r['num_records']} ({r['num_well_formed']} well-formed)"]
    given = "given" if r["lengths_given"] else "inferred from the data"
    out.append(f"lengths: max_seq_length={r['max_seq_length']}, max_predictions_per_seq="
               f"{r['max_predictions_per_seq']} ({given})")
    out.append("features:")
    for name, f in r["features"].items():
        ok = (f["expected_length"] is not None and set(f["lengths"]) == {f["expected_length"]}
              and set(f["kinds"]) == {f["expected_kind"]})
        status = "ok" if ok else ("extra" if f["expected_kind"] is None else
                                  f"MISMATCH (expected {f['expected_kind']} x "
                                  f"{f['expected_length']})")
        kinds = ",".join(sorted(f["kinds"]))
        lengths = ",".join(str(n) for n in sorted(f["lengths"]))
        out.append(f"  {name:<22} {kinds:<6} length {lengths:<10} {status}")
    for name in r["missing"]:
        out.append(f"  {name:<22} MISSING")
    if "padding_fraction" in r:
        out.append(f"layout: {features_lib.describe_packing(r['max_sequences_per_pack'])}; "
                   f"{r['sequences_per_row']:.3f} sequences per row, padding "
                   f"{r['padding_fraction']:.2%} of the tokens")
    if "verified" in r:
        v = r["verified"]
        out.append(f"verified: {v['records']} records in {v['files']} files, "
                   f"{v['corrupt']} corrupt or truncated file(s)")
    if r["vocab"]:
        out.append(f"vocab: {r['vocab']['vocab_size']} tokens; records with ids outside it: "
                   f"{r.get('out_of_vocab_records', 0)}"
                   + (f"; [UNK]: {r['unk_fraction']:.2%} of the real tokens"
                      if "unk_fraction" in r else ""))
    if "mask_ratio" in r:
        out.append(f"masked: {r['mask_ratio']:.2%} of real tokens, {r['masked_per_example']:.1f} "
                   f"per example (the recipe: 15%, at most max_predictions_per_seq)")
    if "mask_split" in r:
        s = r["mask_split"]
        out.append(f"  of the masked: [MASK] {s['mask']:.1%}, random {s['random']:.1%}, "
                   f"unchanged {s['unchanged']:.1%} (the recipe: 80/10/10)")
    elif "mask_ratio" in r:
        out.append("  (give --vocab_file for the [MASK]/random/unchanged split and text)")
    if "is_next_ratio" in r:
        out.append(f"IsNext: {r['is_next_ratio']:.1%} (the recipe: 50%)")
        out.append(f"lengths (real tokens per row, mean {r['mean_length']:.1f}):")
        top = max(1, max(c for _, _, c in r["length_histogram"]))
        for a, b, c in r["length_histogram"]:
            out.append(f"  {a:>5}-{b:<5} {'#' * round(40 * c / top):<40} {c}")
        for k, ex in enumerate(r["examples"]):
            what = (f"{ex['sequences']} sequence(s), the first " if r["max_sequences_per_pack"]
                    else "")
            out.append(f"example {k} ({what}{'IsNext' if ex['is_next'] else 'random B'}, "
                       f"{ex['length']} tokens; masked shown as token(original)):")
            out.append("  " + ex["text"])
    for warning in r.get("warnings", []):
        out.append(f"WARNING: {warning}")
    if r["problems"]:
        out.append(f"PROBLEMS: {len(r['problems'])}")
        out += ["  " + p for p in r["problems"][:20]]
        if len(r["problems"]) > 20:
            out.append(f"  ... and {len(r['problems']) - 20} more")
    else:
        out.append("no problems found")
    return "\n".join(out)


def main(argv):
    del argv
    if not FLAGS.input:
        raise app.UsageError("--input=GLOB is required")
    r = report(FLAGS.input, vocab_file=FLAGS.vocab_file, max_seq_length=FLAGS.max_seq_length,
               max_predictions_per_seq=FLAGS.max_predictions_per_seq,
               num_records=FLAGS.num_records, max_files=FLAGS.max_files, verify=FLAGS.verify,
               show=FLAGS.show)
    print(format_report(r))
    sys.exit(1 if r["problems"] else 0)


if __name__ == "__main__":
    cli.run(main, also=(FileNotFoundError,))  # an input glob that matches nothing
