r"""The attention candidates alone, forward + backward, at BERT-Base and BERT-Large shapes: the
instrument that decides which path `model.attention=auto` should take on a GPU. One call fits
about 3 minutes on an H200 (`--deadline_s`, default 170: later rows are skipped, the table and
the rule's verdict still printed).

    python benchmarks/attention_sweep.py                        # figures under $OUT
    python benchmarks/attention_sweep.py --shapes=base128 --torch
    python benchmarks/attention_sweep.py --smoke --out=/tmp/sweep   # CPU (interpret mode)

Shapes ([batch, length, heads, head_dim] of the GPU suite's cases): base128, large128,
base512, large512; each with two layouts of its rows: "padded" (BERT's rows: 90% full, the
rest cut at a length drawn from [length / 8, length), padding at the end; a <bool> key mask)
and "packed" (three sequences a row then padding, data_prep --pack's layout; <int32>
sequence ids). Every candidate is the model's own call, kernels.attention.fused(...) (the XLA
path as attention.py calls it), bf16, with the Q/K/V biases:
  xla           the reference, hash dropout 0.1;
  pallas        our kernel, hash dropout 0.1 inside: the default tiling, then (padded rows
                of the shapes in TILED) the tilings of TILINGS, model.pallas_* options;
  pallas 0      the default tiling without dropout: what the hash costs;
  cudnn 0       cuDNN without dropout (what `auto` takes for evaluation today);
  cudnn 0.1     cuDNN with its own dropout (kernels/attention/cudnn.py: other masks than ours,
                with the limits it states); packed rows as a bias, and as cuDNN's packed
                layout ("segments");
  torch         (--torch) PyTorch SDPA, HF BERT's call and without a mask, padded rows.
Order: every shape's fixed candidates first, the tilings last, so a deadline drops tilings.

Timing: jit, `--warmup` calls, then the median over `--repeats` of `--iters` calls
(block_until_ready around each repeat). TFLOP/s counts 4 b h n^2 d forward and 10 b h n^2 d
backward (FlashAttention-2's count, the recomputed scores included) at the full length,
whatever a path skips. "err" is max |diff| / max |reference| over the output and the q, k,
v gradients against the XLA path at the same dropout (the same hash masks; a tiling may
change only the summation order), or for rows without dropout against `pallas 0`.

The last lines apply `auto_rule` (in this file) to the table: per shape and layout the path
it should take for training (dropout 0.1) and whether that differs from today's `auto`, and
BERT-Base's attention per step (12 layers x base128) against a 4 ms target (TARGET_BASE_MS).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

SHAPES = {  # the gpu_suite cases' attention: [batch, length, heads, head_dim]
    "base128": (256, 128, 12, 64),
    "large128": (256, 128, 16, 64),
    "base512": (32, 512, 12, 64),
    "large512": (32, 512, 16, 64),
}
SMOKE_SHAPE = (2, 32, 1, 16)
LAYOUTS = ("padded", "packed")
DROPOUT = 0.1
LAYERS = {"base": 12, "large": 24}
TARGET_BASE_MS = 4.0  # attention at most 4 ms of BERT-Base's step: a target set for it
# Where the tilings are swept (one shape per length, padded rows: the other shape differs in
# heads only, and our kernel visits every block of a packed row as of a padded one), and
# which: the model.pallas_* options of each, as config keys.
TILED = ("base128", "large512")
TILINGS = {
    128: ({"pallas_bwd_num_warps": 8},
          {"pallas_bwd_num_warps": 8, "pallas_bwd_num_stages": 3},
          {"pallas_bwd_block_k": 64, "pallas_bwd_num_warps": 8},  # dK/dV + dQ, not fused
          {"pallas_block_q": 64, "pallas_num_warps": 8}),
    512: ({"pallas_bwd_num_warps": 8},
          {"pallas_bwd_block_q": 64, "pallas_bwd_block_k": 128, "pallas_bwd_num_warps": 8},
          {"pallas_block_k": 128, "pallas_num_warps": 8}),
}
SMOKE_TILINGS = ({"pallas_bwd_block_q": 16},)
OPTION_ARGS = {"pallas_block_q": "block_q", "pallas_block_k": "block_k",
               "pallas_bwd_block_q": "bwd_block_q", "pallas_bwd_block_k": "bwd_block_k",
               "pallas_num_warps": "num_warps", "pallas_num_stages": "num_stages",
               "pallas_bwd_num_warps": "bwd_num_warps",
               "pallas_bwd_num_stages": "bwd_num_stages"}
# The rule: a hash-mask path (xla, pallas: masks from the step's key, exact resume) unless
# cuDNN's own dropout is faster by more than this fraction (its limits: cudnn.py).
CUDNN_MARGIN = 0.10
ERR_TOL = 2e-2  # bf16: a result further from the reference is wrong, whatever its speed


def flops(shape) -> tuple[float, float]:
    b, n, h, d = shape
    unit = b * h * n * n * d
    return 4.0 * unit, 10.0 * unit


def one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= 200 else line[:197] + "..."


# ------------------------------------------------------------------------------- JAX side


def row_masks(shape, layout: str, seed: int = 0):
    """The rows' mask: <bool>[b, n] (padded) or <int32>[b, n] sequence ids (packed)."""
    import jax.numpy as jnp
    import numpy as np

    b, n, _, _ = shape
    rng = np.random.default_rng(seed)
    if layout == "padded":
        lengths = np.where(rng.random(b) < 0.9, n, rng.integers(max(n // 8, 1), n, b))
        return jnp.asarray(np.arange(n)[None, :] < lengths[:, None])
    ids = np.zeros((b, n), np.int32)
    for row in ids:
        used = int(n * rng.uniform(0.9, 1.0))
        cuts = np.sort(rng.choice(np.arange(1, used), 2, replace=False))
        for k, (lo, hi) in enumerate(zip((0, *cuts), (*cuts, used))):
            row[lo:hi] = k + 1
    return jnp.asarray(ids)


def jax_inputs(shape, seed: int = 0):
    import jax
    import jax.numpy as jnp

    b, n, h, d = shape
    keys = jax.random.split(jax.random.PRNGKey(seed), 8)
    q, k, v, cot = (jax.random.normal(keys[i], shape, jnp.float32).astype(jnp.bfloat16)
                    for i in range(4))
    biases = tuple(0.1 * jax.random.normal(keys[4 + i], (h, d), jnp.float32) for i in range(3))
    return (q, k, v, biases), cot, keys[7]


def jax_fwd_bwd(path: str, rate: float, options: dict, mask, drop_key, packed_layout: str):
    """jit((q, k, v, biases), cot -> (out, grads)) of one candidate."""
    import jax

    from bert_jax.models.dropout import Dropout
    from bert_jax.models.kernels import attention as attention_kernels
    from bert_jax.models.kernels.attention import cudnn
    from bert_jax.models.kernels.attention import xla as xla_attention
    from bert_jax.models.layers import add_bias

    # The key the model's hash Dropout draws its mask from under `drop_key`: the Pallas
    # kernel then drops the same probabilities as the XLA path.
    fused_key = (Dropout(rate, impl="hash").apply({}, rngs={"dropout": drop_key},
                                                  method="make_key") if rate else None)
    packed = jax.numpy.issubdtype(mask.dtype, jax.numpy.integer)

    def attend(q, k, v, biases):
        if path == "xla":
            q, k, v = (add_bias(x, bb) for x, bb in zip((q, k, v), biases))
            kv_mask = mask[:, :, None] == mask[:, None, :] if packed else mask[:, None, :]
            drop = None
            if rate:
                drop = lambda p: Dropout(rate, impl="hash").apply(  # noqa: E731
                    {}, p, deterministic=False, rngs={"dropout": drop_key})
            return xla_attention.attention(q, k, v, kv_mask, dropout=drop)
        if path == "cudnn":
            q, k, v = (add_bias(x, bb) for x, bb in zip((q, k, v), biases))
            return cudnn.attention(q, k, v, mask, dropout_rate=rate, seed=1234,
                                   packed_layout=packed_layout)
        return attention_kernels.fused(path, q, k, v, mask, dropout_rate=rate,
                                       dropout_key=fused_key, pallas_options=options,
                                       biases=biases)

    def fwd_bwd(args, cot):
        out, vjp = jax.vjp(attend, *args)
        return out, vjp(cot)[:3]  # q, k, v (the bias gradients follow from them)

    return jax.jit(fwd_bwd)


def time_calls(call, sync, warmup: int, iters: int, repeats: int) -> float:
    """Median ms per call over `repeats` groups of `iters` calls."""
    for _ in range(warmup):
        sync(call())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters - 1):
            call()
        sync(call())
        times.append((time.perf_counter() - t0) / iters * 1e3)
    return statistics.median(times)


def rel_err(got, want) -> float:
    """max |got - want| / max |want| over the output and the q, k, v gradients (float32)."""
    import jax
    import jax.numpy as jnp

    errs = [float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)))
                  / max(float(jnp.max(jnp.abs(w.astype(jnp.float32)))), 1e-30))
            for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))]
    return max(errs)


def measure_jax(cand: dict, shape, layout: str, args, refs: dict) -> dict:
    """One row. refs[rate]: the first result at that rate (xla at 0.1, pallas 0 at 0):
    each later hash-mask row reports its distance ("err"); cuDNN's dropout draws other
    masks, so it has none (benchmarks/attention_masks.py checks it)."""
    import jax

    row = dict(cand, layout=layout, options=dict(cand.get("options", {})))
    inputs, cot, drop_key = jax_inputs(shape)
    mask = row_masks(shape, layout)
    options = {OPTION_ARGS[k]: v for k, v in row["options"].items()}
    try:
        fn = jax_fwd_bwd(cand["path"], cand["dropout"], options, mask, drop_key,
                         cand.get("packed_layout", "bias"))
        t0 = time.perf_counter()
        result = jax.block_until_ready(fn(inputs, cot))
        row["compile_s"] = time.perf_counter() - t0
        if not (cand["path"] == "cudnn" and cand["dropout"]):
            if cand["dropout"] in refs:
                row["err"] = rel_err(result, refs[cand["dropout"]])
            else:
                refs[cand["dropout"]] = result
        row["ms"] = time_calls(lambda: fn(inputs, cot), jax.block_until_ready, args.warmup,
                               args.iters, args.repeats)
    except Exception as e:  # noqa: BLE001 - one row's error; the sweep goes on
        row["error"] = one_line(e)
    return row


def measure_torch(shape, rate: float, masked: bool, args) -> dict:
    """SDPA fwd+bwd in bf16 on [batch, heads, length, head_dim] tensors, padded rows."""
    row = {"path": "torch" + (" HF mask" if masked else ""), "dropout": rate, "options": {},
           "layout": "padded"}
    try:
        import torch
        import torch.nn.functional as F

        if not torch.cuda.is_available():
            row["error"] = "torch sees no CUDA device"
            return row
        b, n, h, d = shape
        dev = torch.device("cuda")
        gen = torch.Generator(device=dev).manual_seed(0)
        q, k, v, cot = (torch.randn(b, h, n, d, device=dev, generator=gen,
                                    dtype=torch.bfloat16) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)
        mask = torch.zeros(b, 1, 1, n, device=dev, dtype=torch.bfloat16) if masked else None

        def fwd_bwd():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=rate)
            return torch.autograd.grad(out, (q, k, v), cot)

        row["ms"] = time_calls(fwd_bwd, lambda _: torch.cuda.synchronize(), args.warmup,
                               args.iters, args.repeats)
    except Exception as e:  # noqa: BLE001
        row["error"] = one_line(e)
    return row


# --------------------------------------------------------------------------------- plan


def candidates(shape_name: str, layout: str, gpu: bool, smoke: bool) -> tuple[list, list]:
    """(fixed candidates, tilings) of one shape and layout, each {path, dropout, note,
    [options], [packed_layout]}."""
    fixed = [dict(path="xla", dropout=DROPOUT, note="reference"),
             dict(path="pallas", dropout=DROPOUT, note="default"),
             dict(path="pallas", dropout=0.0, note="hash cost")]
    if gpu:
        fixed += [dict(path="cudnn", dropout=0.0, note="auto's eval path"),
                  dict(path="cudnn", dropout=DROPOUT, note="cuDNN's masks",
                       packed_layout="bias")]
        if layout == "packed":
            fixed.append(dict(path="cudnn", dropout=DROPOUT, note="cuDNN's masks",
                              packed_layout="segments"))
    length = SMOKE_SHAPE[1] if smoke else SHAPES[shape_name][1]
    grid = () if layout != "padded" and not smoke else SMOKE_TILINGS if smoke else (
        TILINGS.get(length, ()) if shape_name in TILED else ())
    tilings = [dict(path="pallas", dropout=DROPOUT, note="tiling", options=o) for o in grid]
    return fixed, tilings


def label(row: dict) -> str:
    opts = ",".join(f"{k.replace('pallas_', '')}={v}" for k, v in row["options"].items())
    name = row["path"] + (f"[{row['packed_layout']}]" if row.get("packed_layout") == "segments"
                          else "")
    return f"{name}{'(' + opts + ')' if opts else ''} {row['dropout']:g}"


def fmt_row(row: dict) -> str:
    f_fwd, f_bwd = flops(row["shape"])
    head = f"{row['shape_name']:9s} {row['layout']:7s} {label(row):52s}"
    if "error" in row:
        return f"{head} ERROR {row['error']}"
    return (f"{head} {row['ms']:8.3f} ms {(f_fwd + f_bwd) / row['ms'] / 1e9:7.1f} TFLOP/s"
            + (f"  err {row['err']:.1e}" if "err" in row else "           ")
            + f"  {row.get('note', '')}")


# --------------------------------------------------------------------------------- rule


def today_auto(layout: str) -> str:
    """What `auto` takes today on a GPU for a training call of BERT's config in bf16
    (kernels.attention.resolve, the code that decides)."""
    from bert_jax.models import BertConfig
    from bert_jax.models.kernels.attention import resolve

    config = BertConfig(dtype="bfloat16", attention_probs_dropout_prob=DROPOUT)
    return resolve("auto", "gpu", config, training=True, packed=layout == "packed")


def auto_rule(rows: list) -> dict:
    """{(shape_name, layout): verdict} for training (dropout 0.1): the fastest hash-mask
    candidate (xla or any pallas tiling) within ERR_TOL of the reference, and cuDNN's
    dropout where it beats that by more than CUDNN_MARGIN. verdict: {path, options,
    packed_layout, ms, hash_ms, cudnn_ms, today}."""
    out = {}
    groups = {}
    for r in rows:
        if "error" in r or "ms" not in r or r["dropout"] != DROPOUT:
            continue
        groups.setdefault((r["shape_name"], r["layout"]), []).append(r)
    for key, group in groups.items():
        hashed = [r for r in group if r["path"] in ("xla", "pallas")
                  and r.get("err", 0.0) <= ERR_TOL]
        cudnn_rows = [r for r in group if r["path"] == "cudnn"]
        best = min(hashed, key=lambda r: r["ms"]) if hashed else None
        fast_cudnn = min(cudnn_rows, key=lambda r: r["ms"]) if cudnn_rows else None
        pick = best
        if fast_cudnn and (best is None or fast_cudnn["ms"] < (1 - CUDNN_MARGIN) * best["ms"]):
            pick = fast_cudnn
        if pick is None:
            continue
        out[key] = dict(path=pick["path"], options=pick["options"],
                        packed_layout=pick.get("packed_layout"), ms=pick["ms"],
                        hash_ms=best["ms"] if best else None,
                        cudnn_ms=fast_cudnn["ms"] if fast_cudnn else None,
                        today=today_auto(key[1]))
    return out


def verdict_lines(rows: list) -> list[str]:
    lines = []
    rule = auto_rule(rows)
    for (name, layout), v in sorted(rule.items()):
        flags = " ".join(f"--config.model.{k}={x}" for k, x in v["options"].items())
        what = v["path"] + (f" ({v['packed_layout']})" if v["packed_layout"] == "segments"
                            else "")
        change = "same as today" if (v["path"] == v["today"] and not v["options"]) else (
            f"today: {v['today']} (default tiling)")
        cud = f"{v['cudnn_ms']:.3f}" if v["cudnn_ms"] is not None else "-"
        lines.append(f"{name:9s} {layout:7s} -> {what} {flags} {v['ms']:.3f} ms "
                     f"(best hash-mask path {v['hash_ms']:.3f} ms, cuDNN dropout {cud} ms); "
                     f"{change}")
    for size, layers in LAYERS.items():
        for length in (128, 512):
            v = rule.get((f"{size}{length}", "padded"))
            if v:
                total = layers * v["ms"]
                target = (f" (target <= {TARGET_BASE_MS} ms: "
                          f"{'met' if total <= TARGET_BASE_MS else 'not met'})"
                          if (size, length) == ("base", 128) else "")
                lines.append(f"{size}{length}: {layers} layers x {v['ms']:.3f} ms = "
                             f"{total:.2f} ms of attention a step{target}")
    return lines


# ------------------------------------------------------------------------------- driver


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated (%(default)s)")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="(%(default)s)")
    p.add_argument("--out", default=None, help="folder for sweep.json / sweep.txt "
                   "($OUT, else /tmp/attention_sweep)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls (2; smoke 1)")
    p.add_argument("--iters", type=int, default=None, help="calls per repeat (10; smoke 1)")
    p.add_argument("--repeats", type=int, default=None, help="repeats, median (3; smoke 1)")
    p.add_argument("--deadline_s", type=float, default=170.0,
                   help="wall-clock budget (%(default)s s): later rows are skipped")
    p.add_argument("--no_tilings", action="store_true", help="the fixed candidates only")
    p.add_argument("--torch", action="store_true", help="add PyTorch SDPA rows")
    p.add_argument("--smoke", action="store_true", help="CPU, one tiny shape, interpret mode")
    args = p.parse_args(argv)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 2)
    args.iters = args.iters if args.iters is not None else (1 if args.smoke else 10)
    args.repeats = args.repeats if args.repeats is not None else (1 if args.smoke else 3)
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    unknown = [s for s in names if s not in SHAPES] + [s for s in layouts if s not in LAYOUTS]
    if unknown:
        p.error(f"unknown shape(s) or layout(s) {unknown}; known: {list(SHAPES)}, "
                f"{list(LAYOUTS)}")
    out_dir = args.out or os.environ.get("OUT") or "/tmp/attention_sweep"
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()

    import jax

    lines, rows = [], []

    def emit(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    dev = jax.devices()[0]
    gpu = dev.platform == "gpu"
    emit(f"== attention sweep: {dev.device_kind} ({dev.platform}); jax {jax.__version__}; "
         f"bf16, fwd+bwd, median of {args.repeats} x {args.iters} calls ==")
    plan, tiling_plan = [], []
    for name in names:
        shape = SMOKE_SHAPE if args.smoke else SHAPES[name]
        for layout in layouts:
            fixed, tilings = candidates(name, layout, gpu, args.smoke)
            plan += [(name, shape, layout, c) for c in fixed]
            if not args.no_tilings:
                tiling_plan += [(name, shape, layout, c) for c in tilings]
    refs = {}
    for name, shape, layout, cand in plan + tiling_plan:
        if time.perf_counter() - t0 > args.deadline_s:
            row = dict(cand, layout=layout, options=dict(cand.get("options", {})),
                       error="skipped: --deadline_s reached")
        else:
            row = measure_jax(cand, shape, layout, args,
                              refs.setdefault((name, layout), {}))
        row.update(shape_name=name, shape=list(shape))
        rows.append(row)
        emit(fmt_row(row))
    if gpu and args.torch:
        for name in names:
            for masked in (True, False):
                if time.perf_counter() - t0 > args.deadline_s:
                    break
                row = measure_torch(SHAPES[name], DROPOUT, masked, args)
                row.update(shape_name=name, shape=list(SHAPES[name]),
                           note="HF BERT's call" if masked else "no mask")
                rows.append(row)
                emit(fmt_row(row))
    emit("")
    emit(f"== auto_rule: training (dropout {DROPOUT}); a hash-mask path unless cuDNN's "
         f"dropout is faster by > {CUDNN_MARGIN:.0%} ==")
    for line in verdict_lines(rows):
        emit(line)
    emit(f"total {time.perf_counter() - t0:.0f} s")
    with open(os.path.join(out_dir, "sweep.json"), "w") as f:
        json.dump({"device": dev.device_kind, "jax": jax.__version__, "rows": rows,
                   "auto_rule": {f"{k[0]}/{k[1]}": v for k, v in auto_rule(rows).items()}},
                  f, indent=1)
    with open(os.path.join(out_dir, "sweep.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
