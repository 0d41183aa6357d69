r"""The attention kernels alone, fwd and fwd+bwd, at the suite's shapes: the Pallas kernel's
tilings swept against cuDNN, the XLA path and PyTorch's SDPA on the same GPU, in one short
run. What to run in a GPU session after benchmarks/gpu_suite.py, whose profile puts the
Pallas backward kernel first (H200, BERT-Base 256 x 128: 8.6 of 53 ms of kernels, 4.8x its
forward kernel; benchmarks/RESULTS.md).

    python benchmarks/attention_sweep.py                     # all shapes; figures under $OUT
    python benchmarks/attention_sweep.py --shapes=base128 --deadline_s=240
    python benchmarks/attention_sweep.py --smoke --out=/tmp/sweep   # CPU (interpret mode)

Each shape ([batch, length, heads, head_dim] of a suite case; every row full length, as the
suite's synthetic batches) runs the model's own call, attention_ops.fused("pallas", ...)
with the per-head Q/K/V biases inside the kernel and the hash dropout at 0.1, for:
  - the default tiling, then a coordinate sweep of the six model.pallas_* options (one
    option at a time over its values, keeping the best so far by fwd+bwd time; two passes);
  - the Pallas default without dropout and cuDNN (no dropout: cuDNN has none), on equal
    terms;
  - the XLA path (model.attention=xla) with the same dropout;
  - torch.nn.functional.scaled_dot_product_attention, bf16, dropout 0.1 and 0, with the
    [batch, 1, 1, length] additive mask Hugging Face's BERT passes (torch picks its
    memory-efficient kernel) and without a mask (its flash kernel), when torch and CUDA
    are there.
Timing: jit, `--warmup` calls, then the median over `--repeats` of `--iters` calls each
(jax.block_until_ready / torch.cuda.synchronize around each repeat). TFLOP/s counts
4 b h n^2 d for the forward and 10 b h n^2 d for the backward (FlashAttention-2's count:
its recomputed scores included), whatever a path actually computes.

The last lines name the best tiling per shape as config flags
(--config.model.pallas_bwd_block_q=32 ...) with its time against the default's. A tiling
that fails to compile (e.g. out of shared memory) is a row with its one-line error.
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
    "large512": (32, 512, 16, 64),
}
SMOKE_SHAPE = (2, 32, 2, 16)
DROPOUT = 0.1
# model.pallas_* option -> values swept (0 = the kernel's default).
SWEEP = {
    "pallas_bwd_block_q": (16, 32, 64, 128),
    "pallas_num_warps": (4, 8),
    "pallas_num_stages": (1, 2, 3, 4),
    "pallas_bwd_block_k": (32, 64, 128),
    "pallas_block_q": (32, 64, 128),
    "pallas_block_k": (32, 64, 128),
}
SMOKE_SWEEP = {"pallas_bwd_block_q": (16,)}
OPTION_ARGS = {"pallas_block_q": "block_q", "pallas_block_k": "block_k",
               "pallas_bwd_block_q": "bwd_block_q", "pallas_bwd_block_k": "bwd_block_k",
               "pallas_num_warps": "num_warps", "pallas_num_stages": "num_stages"}


def flops(shape) -> tuple[float, float]:
    b, n, h, d = shape
    unit = b * h * n * n * d
    return 4.0 * unit, 10.0 * unit


def one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= 200 else line[:197] + "..."


# ------------------------------------------------------------------------------- JAX side


def jax_inputs(shape, seed: int = 0):
    import jax
    import jax.numpy as jnp

    b, n, h, d = shape
    keys = jax.random.split(jax.random.PRNGKey(seed), 8)
    q, k, v, cot = (jax.random.normal(keys[i], shape, jnp.float32).astype(jnp.bfloat16)
                    for i in range(4))
    biases = tuple(0.1 * jax.random.normal(keys[4 + i], (h, d), jnp.float32) for i in range(3))
    mask = jnp.ones((b, n), bool)
    return (q, k, v, biases), cot, mask, keys[7]


def jax_fns(path: str, rate: float, options: dict, mask, drop_key):
    """(fwd, fwd_bwd) jitted functions of (q, k, v, biases) for one path."""
    import jax

    from bert_jax.models import attention_ops
    from bert_jax.models.attention_ops import xla as xla_attention
    from bert_jax.models.dropout import Dropout
    from bert_jax.models.layers import add_bias

    # The key the model's hash Dropout draws its mask from under `drop_key`: the fused paths
    # then drop the same probabilities as the XLA path (benchmarks/gpu/kernel_check.py).
    fused_key = (Dropout(rate, impl="hash").apply({}, rngs={"dropout": drop_key},
                                                  method="make_key") if rate else None)

    def attend(q, k, v, biases):
        if path == "xla":
            q, k, v = (add_bias(x, bb) for x, bb in zip((q, k, v), biases))
            drop = None
            if rate:
                drop = lambda p: Dropout(rate, impl="hash").apply(  # noqa: E731
                    {}, p, deterministic=False, rngs={"dropout": drop_key})
            return xla_attention.attention(q, k, v, mask[:, None, :], dropout=drop)
        return attention_ops.fused(path, q, k, v, mask, dropout_rate=rate,
                                   dropout_key=fused_key,
                                   pallas_options=options, biases=biases)

    def fwd_bwd(args, cot):
        out, vjp = jax.vjp(attend, *args)
        return out, vjp(cot)

    return jax.jit(lambda args: attend(*args)), jax.jit(fwd_bwd)


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


def measure_jax(path: str, rate: float, options: dict, shape, args, refs: dict) -> dict:
    """One row; `refs` maps a dropout rate to the first (output, q/k/v gradients) measured
    at it (the default Pallas tiling): each later row reports its max relative difference
    ("err"), since a tiling may change results only by summation order."""
    import jax

    row = {"path": path, "dropout": rate, "options": dict(options)}
    inputs, cot, mask, drop_key = jax_inputs(shape)
    fwd, fwd_bwd = jax_fns(path, rate, {OPTION_ARGS[k]: v for k, v in options.items()},
                           mask, drop_key)
    try:
        t0 = time.perf_counter()
        out, grads = jax.block_until_ready(fwd_bwd(inputs, cot))
        row["compile_s"] = time.perf_counter() - t0
        result = (out, grads[:3])  # q, k, v (the bias gradients follow from them)
        if rate in refs:
            row["err"] = rel_err(result, refs[rate])
        else:
            refs[rate] = result
        row["fwd_ms"] = time_calls(lambda: fwd(inputs), jax.block_until_ready, args.warmup,
                                   args.iters, args.repeats)
        row["fwd_bwd_ms"] = time_calls(lambda: fwd_bwd(inputs, cot), jax.block_until_ready,
                                       args.warmup, args.iters, args.repeats)
    except Exception as e:  # noqa: BLE001 - one row's error; the sweep goes on
        row["error"] = one_line(e)
    return row


# ----------------------------------------------------------------------------- torch side


def measure_torch(shape, rate: float, masked: bool, args) -> dict:
    """SDPA fwd and fwd+bwd in bf16 on [batch, heads, length, head_dim] tensors."""
    row = {"path": "torch_sdpa" + ("_mask" if masked else ""), "dropout": rate, "options": {}}
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

        def fwd():
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=rate)

        def fwd_bwd():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=rate)
            return torch.autograd.grad(out, (q, k, v), cot)

        sync = lambda _: torch.cuda.synchronize()  # noqa: E731
        row["fwd_ms"] = time_calls(fwd, sync, args.warmup, args.iters, args.repeats)
        row["fwd_bwd_ms"] = time_calls(fwd_bwd, sync, args.warmup, args.iters, args.repeats)
    except Exception as e:  # noqa: BLE001
        row["error"] = one_line(e)
    return row


# --------------------------------------------------------------------------------- driver


def sweep_shape(name: str, shape, args, emit, left) -> list:
    """All rows of one shape: the default tiling, the coordinate sweep, the references."""
    import jax

    rows, refs = [], {}

    def run(path, rate, options, note=""):
        if left() < 20:
            row = {"path": path, "dropout": rate, "options": dict(options),
                   "error": "skipped: --deadline_s reached"}
        else:
            row = measure_jax(path, rate, options, shape, args, refs)
        row.update(shape_name=name, shape=list(shape), note=note)
        rows.append(row)
        emit(row)
        return row

    gpu = jax.devices()[0].platform == "gpu"
    default = run("pallas", DROPOUT, {}, "default")
    best, best_ms = {}, default.get("fwd_bwd_ms", float("inf"))
    sweep = SMOKE_SWEEP if args.smoke else SWEEP
    for _ in range(1 if args.smoke else args.passes):
        for key, values in sweep.items():
            for value in values:
                trial = dict(best, **{key: value})
                if trial == best or any(r.get("options") == trial and r["path"] == "pallas"
                                        and r["dropout"] == DROPOUT for r in rows):
                    continue
                row = run("pallas", DROPOUT, trial, "sweep")
                if row.get("fwd_bwd_ms", float("inf")) < best_ms:
                    best, best_ms = trial, row["fwd_bwd_ms"]
    run("pallas", 0.0, {}, "no dropout")
    if best:
        run("pallas", 0.0, best, "best, no dropout")
    if gpu:
        run("cudnn", 0.0, {}, "no dropout")
    run("xla", DROPOUT, {}, "")
    if gpu and not args.no_torch:
        for masked in (True, False):
            for rate in (DROPOUT, 0.0):
                if left() < 20:
                    break
                row = measure_torch(shape, rate, masked, args)
                row.update(shape_name=name, shape=list(shape),
                           note="HF BERT's call" if masked else "no mask")
                rows.append(row)
                emit(row)
    summary = {"shape_name": name, "best": best, "best_ms": best_ms,
               "default_ms": default.get("fwd_bwd_ms")}
    rows.append({"summary": summary})
    return rows


def fmt_row(row: dict) -> str:
    f_fwd, f_bwd = flops(row["shape"])
    opts = ",".join(f"{k.replace('pallas_', '')}={v}" for k, v in row["options"].items())
    label = f"{row['path']}{'(' + opts + ')' if opts else ''}"
    head = f"{row['shape_name']:9s} {label:58s} drop {row['dropout']:.1f}"
    if "error" in row:
        return f"{head}  ERROR {row['error']}"
    fwd, tot = row["fwd_ms"], row["fwd_bwd_ms"]
    bwd = max(tot - fwd, 1e-9)
    return (f"{head}  fwd {fwd:8.3f} ms  fwd+bwd {tot:8.3f} ms  (bwd ~{bwd:7.3f})  "
            f"{(f_fwd + f_bwd) / tot / 1e9:6.1f} TFLOP/s"
            + (f"  err {row['err']:.1e}" if "err" in row else "") + f"  {row.get('note', '')}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated (%(default)s)")
    p.add_argument("--out", default=None, help="folder for sweep.json / sweep.txt "
                   "($OUT, else /tmp/attention_sweep)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls (3; smoke 1)")
    p.add_argument("--iters", type=int, default=None, help="calls per repeat (10; smoke 1)")
    p.add_argument("--repeats", type=int, default=None, help="repeats, median (5; smoke 1)")
    p.add_argument("--passes", type=int, default=2, help="coordinate-sweep passes (2)")
    p.add_argument("--deadline_s", type=float, default=None,
                   help="wall-clock budget: later rows are skipped, the summary printed")
    p.add_argument("--no_torch", action="store_true", help="no PyTorch rows")
    p.add_argument("--smoke", action="store_true", help="CPU, one tiny shape, interpret mode")
    args = p.parse_args(argv)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    args.iters = args.iters if args.iters is not None else (1 if args.smoke else 10)
    args.repeats = args.repeats if args.repeats is not None else (1 if args.smoke else 5)
    names = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in names if s not in SHAPES]
    if unknown:
        p.error(f"unknown shape(s) {unknown}; known: {list(SHAPES)}")
    out_dir = args.out or os.environ.get("OUT") or "/tmp/attention_sweep"
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()
    left = lambda: (args.deadline_s - (time.perf_counter() - t0)  # noqa: E731
                    if args.deadline_s else float("inf"))

    import jax

    lines = []

    def emit(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    dev = jax.devices()[0]
    versions = [f"jax {jax.__version__}"]
    try:
        import torch
        versions.append(f"torch {torch.__version__}")
    except Exception:  # noqa: BLE001
        pass
    emit(f"== attention sweep: {dev.device_kind} ({dev.platform}); {', '.join(versions)}; "
         f"bf16, dropout {DROPOUT} unless said; median of {args.repeats} x {args.iters} "
         f"calls ==")
    all_rows = []
    for name in names:
        shape = SMOKE_SHAPE if args.smoke else SHAPES[name]
        rows = sweep_shape(name, shape, args, lambda r: emit(fmt_row(r)), left)
        all_rows += rows
    emit("")
    emit("== best Pallas tiling per shape (fwd+bwd, dropout 0.1) ==")
    for r in all_rows:
        s = r.get("summary")
        if not s:
            continue
        if not s["best"] or s["default_ms"] is None:
            emit(f"{s['shape_name']}: the default tiling ({s['default_ms']} ms) is the best "
                 "measured")
            continue
        flags = " ".join(f"--config.model.{k}={v}" for k, v in s["best"].items())
        emit(f"{s['shape_name']}: {flags}: {s['best_ms']:.3f} ms against the default's "
             f"{s['default_ms']:.3f} ms ({s['default_ms'] / s['best_ms']:.2f}x)")
    emit(f"total {time.perf_counter() - t0:.0f} s")
    with open(os.path.join(out_dir, "sweep.json"), "w") as f:
        json.dump({"device": dev.device_kind, "versions": versions, "rows": all_rows}, f,
                  indent=1)
    with open(os.path.join(out_dir, "sweep.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
