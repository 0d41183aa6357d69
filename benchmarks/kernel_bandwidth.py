r"""The memory-bound kernels against the card's bandwidth: the FFN's bias + GELU backward pass
(bert_jax/models/kernels/gelu.py) and the residual + LayerNorm forward and backward kernels
(kernels/residual_norm.py), each beside XLA's fusion of the same expression, at BERT-Base and
BERT-Large shapes, bf16; with --sweep, a grid of launch parameters (GeluTuning, NormTuning)
per kernel and the best per case. The instrument for "80% of the card's bandwidth".

    python benchmarks/kernel_bandwidth.py --sweep --json=$OUT/kernel_bandwidth.json  # GPU
    python benchmarks/kernel_bandwidth.py --smoke        # CPU, interpret mode, tiny shapes
    PYTHONPATH=.:<jax-cuda12 plugin wheels> python benchmarks/kernel_bandwidth.py --audit \
        [--gpu_target_config=benchmarks/gpu/h200.txtpb]  # every grid tuning compiles?

Cases (tokens, hidden, FFN width): base128 and large128 are the GPU suite's 256 x 128
(32,768 tokens; 768 / 3072 and 1024 / 4096), base512 and large512 its 32 x 512 (16,384).
The GELU rows of the large cases also write the GELU's output (with_output: gelu_matmul,
what configs/bert_large.py's remat=minimal_ffn runs); the base cases do not (bias_gelu).
The LayerNorm rows use hash dropout 0.1 and two copies of the output, as every post-LN
layer of models/encoder.py does (the backward kernel adds their two cotangents).

Paths: "pallas" is the kernel as the model calls it, the XLA sum of its per-program column
sums included; "xla" is jax's expression jitted, computing the same outputs: the GELU's
vjp (with its output for the large cases); the forward as jnp (z = residual +
hash_dropout(p + bias), flax's mean and fast variance, y); the backward as jax's vjp of the
model's XLA expression (flax's LayerNorm) applied to the sum of the two cotangents, its
residuals computed beforehand.

Bytes: the minimum each call must move, every operand read once and every output written
once in its dtype (bf16 activations: 2 bytes; float32 vectors and statistics: 4), for
R tokens, hidden H, FFN width F, c = 2 copies:
  gelu backward     reads p, g [R, F], bias [F]; writes dh [R, F] (and y [R, F]), db [F]:
                    (3 or 4) x 2RF + 8F
  LayerNorm fwd     reads p, residual [R, H], the [4, H] vectors; writes y, z [R, H],
                    mean, rstd [R]: 8RH + 16H + 8R
  LayerNorm bwd     reads c cotangents and z [R, H], mean, rstd [R], vectors [4, H];
                    writes d_residual, d_p [R, H], d_vectors [4, H]: (2c + 6)RH + 8R + 32H
The kernels' partial sums ([programs, F] or [programs, 4H] float32) are theirs to hide and
count against them. GB/s = bytes / time; "% peak" against the device's nominal HBM
bandwidth (PEAK_TBPS; --peak_tbps otherwise). Target: 80% for the GELU and LayerNorm
backward kernels (TARGET_FRACTION).

Timing: jit, --warmup calls, then the median over --repeats of --iters calls, each group
closed by jax.block_until_ready: wall clock of queued calls, so a call's dispatch counts only
where it is longer than the kernel. A line after the first kernel's rows prints that floor
(a jitted call that reads one element of the same operands): a row near it is launch-bound.

Numerics, checked for every tuning against the default tuning's outputs before it is timed
(a tuning that fails is rejected, not timed): tunings change block shapes, so only the
order of float32 sums may change. Elementwise outputs (the GELU's dh and y, the LayerNorm's
z) must be equal bit for bit. A float32 sum of n terms (the bias gradient, the LayerNorm's
parameter gradients, the mean) must be within 2 n 2^-24 sum|terms| of the default's: each
order is within (n - 1) 2^-24 sum|terms| of the exact sum (Higham's bound), so two are
within twice that. rstd follows the variance's bound through d rstd = rstd^3 / 2 d var.
bf16 outputs computed from such sums (the LayerNorm's y, d_residual, d_p) must be within
2^-6 of the array's largest magnitude: one bf16 rounding step at the top (2^-7 of it)
where a reordered float32 value rounds to the other neighbour, and as much again for the
sums' own reordering, which the bound above keeps far smaller. A wrong block is off by O(1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# case: (tokens, hidden, FFN width, GELU with its output)
CASES = {
    "base128": (256 * 128, 768, 3072, False),
    "large128": (256 * 128, 1024, 4096, True),
    "base512": (32 * 512, 768, 3072, False),
    "large512": (32 * 512, 1024, 4096, True),
}
# Tiny, yet large enough that every grid tuning is a launch of its own (rows 256, widths
# 512 and 1024: each row, column and chunk cap of the grids binds).
SMOKE_CASES = {"smoke": (256, 512, 1024, True)}
KERNELS = ("gelu_bwd", "norm_bwd", "norm_fwd")  # the sweep's order: the backward kernels first
COPIES, RATE, EPS = 2, 0.1, 1e-12
# Nominal HBM bandwidth, TB/s, by a substring of jax's device_kind (the first that matches).
PEAK_TBPS = (("GH200", 4.0), ("H200", 4.8), ("H100 PCIe", 2.0), ("H100 NVL", 3.9),
             ("H100", 3.35), ("A100-SXM4-80GB", 2.039), ("A100", 1.555), ("L4", 0.3))
TARGET_FRACTION = 0.8

# The sweep's grids: overrides of the default tuning, at most 24 a kernel. A tuning whose
# effective blocks at a case equal another's (caps: the largest power of two dividing the
# rows or the width) runs once. Every one lowers for the H100 and H200 descriptions
# (--audit). What they span is occupancy: the defaults are register-bound (each GELU
# thread holds 32 float32 values of every tile, the LayerNorm backward three float32
# [step, hidden] arrays), so an SM holds few warps to hide memory latency with (ptxas'
# counts: benchmarks/RESULTS.md). Fewer values a thread (smaller tiles or more warps) buys
# warps; the sweep measures that against fewer bytes in flight a warp.
# GELU: (chunk, cols, warps) by values a thread (chunk x cols / 32 / warps): 32, 16, 8, 4.
GELU_GRID = (
    [dict(num_warps=8)]  # the default's tiles over twice the threads
    + [dict(chunk=c, cols=w, num_warps=nw)
       for c, w, nw in ((16, 512, 8), (8, 1024, 8),
                        (4, 512, 4), (8, 256, 4), (16, 256, 8), (4, 1024, 8),
                        (2, 1024, 4),
                        (4, 256, 4), (2, 512, 4), (8, 256, 8), (4, 512, 8), (2, 1024, 8),
                        (1, 1024, 4),
                        (2, 256, 4), (4, 256, 8), (1, 512, 4), (1, 256, 2))]
    + [dict(chunk=c, cols=w, num_stages=2) for c, w in ((4, 512), (2, 256))]
    + [dict(rows=r, chunk=4) for r in (64, 256)])
# LayerNorm backward: (step, warps), from 8 to 40 warps an SM; then wider loads at hidden
# 1024, other row blocks, and Triton's stages (no register change in the audit).
NORM_BWD_GRID = (
    [dict(bwd_step=st, bwd_num_warps=nw)
     for st, nw in ((4, 8), (2, 8), (1, 4), (1, 8), (4, 16), (2, 16), (8, 16), (1, 2), (2, 4),
                    (1, 16))]
    + [dict(bwd_step=st, bwd_num_warps=nw, bwd_chunk=1024) for st, nw in ((2, 8), (1, 8), (2, 16))]
    + [dict(bwd_step=2, bwd_num_warps=8, bwd_rows=r) for r in (64, 256)]
    + [dict(bwd_step=st, bwd_num_warps=8, bwd_num_stages=2) for st in (2, 1)])
# LayerNorm forward: (rows, warps), from 20 to 64 warps an SM; wider and narrower loads.
NORM_FWD_GRID = (
    [dict(fwd_rows=r, fwd_num_warps=nw)
     for r, nw in ((4, 4), (8, 8), (4, 8), (16, 16), (2, 4), (1, 2), (8, 16), (2, 2), (1, 4),
                   (16, 8), (2, 8), (1, 1))]
    + [dict(fwd_rows=r, fwd_num_warps=nw, fwd_chunk=1024)
       for r, nw in ((4, 8), (8, 8), (2, 4), (1, 4), (16, 16))]
    + [dict(fwd_rows=r, fwd_num_warps=nw, fwd_chunk=128) for r, nw in ((8, 8), (1, 4))])
GRIDS = {"gelu_bwd": GELU_GRID, "norm_fwd": NORM_FWD_GRID, "norm_bwd": NORM_BWD_GRID}


def kernel_bytes(kernel: str, rows: int, hidden: int, ffn: int, with_output: bool) -> int:
    """The minimum bytes a call moves (module doc), bf16 activations."""
    if kernel == "gelu_bwd":
        return (4 if with_output else 3) * 2 * rows * ffn + 8 * ffn
    if kernel == "norm_fwd":
        return 8 * rows * hidden + 16 * hidden + 8 * rows
    return (2 * COPIES + 6) * rows * hidden + 8 * rows + 32 * hidden


def peak_tbps(device_kind: str, override: float | None) -> float | None:
    if override:
        return override
    for name, tbps in PEAK_TBPS:
        if name.lower() in device_kind.lower():
            return tbps
    return None


def tuning_of(kernel: str, overrides: dict):
    """The GeluTuning / NormTuning of the default with `overrides`."""
    from bert_jax.models.kernels import gelu, residual_norm

    base = gelu.TUNING if kernel == "gelu_bwd" else residual_norm.TUNING
    return dataclasses.replace(base, **overrides)


def effective(kernel: str, tuning, rows: int, hidden: int, ffn: int):
    """The launch a tuning gives at a case (its caps applied), or None if it does not tile."""
    from bert_jax.models.kernels import gelu, residual_norm as norm

    if kernel == "gelu_bwd":
        blocks = gelu.blocks(rows, ffn, tuning)
        return blocks and (*blocks, tuning.chunk, tuning.num_warps, tuning.num_stages)
    if not norm.tiles(rows, hidden, tuning):
        return None
    if kernel == "norm_fwd":
        return (tuning.fwd_rows, norm.chunk(hidden, tuning.fwd_chunk), tuning.fwd_num_warps,
                tuning.fwd_num_stages)
    return (norm.backward_rows(rows, tuning), tuning.bwd_step,
            norm.chunk(hidden, tuning.bwd_chunk), tuning.bwd_num_warps, tuning.bwd_num_stages)


def label(overrides: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "default"


# ------------------------------------------------------------------------ inputs and calls


def inputs(kernel: str, rows: int, hidden: int, ffn: int, seed: int = 0):
    """(operands, expression's inputs): the operands of one kernel's call (bf16
    activations, float32 vectors) and, for the LayerNorm backward, the inputs of the
    forward expression whose vjp is XLA's path (else None)."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models.kernels import residual_norm as norm

    k = jax.random.split(jax.random.PRNGKey(seed), 8)
    def act(key, n, s=1.0):
        return (s * jax.random.normal(key, (rows, n))).astype(jnp.bfloat16)

    if kernel == "gelu_bwd":
        return (act(k[0], ffn, 2.0), 0.5 * jax.random.normal(k[1], (ffn,)), act(k[2], ffn)), None
    p, residual = act(k[0], hidden), act(k[1], hidden, 2.0)
    bias, shift = (0.3 * jax.random.normal(key, (hidden,)) for key in k[2:4])
    scale = 1 + 0.2 * jax.random.normal(k[4], (hidden,))
    seeds = jax.random.bits(k[5], (2,), jnp.uint32)
    v = norm.vectors(bias, scale, shift, seeds)
    if kernel == "norm_fwd":
        return (p, residual, v), None
    _, z, mean, rstd = jax.jit(lambda *a: norm.forward(*a, rate=RATE, eps=EPS, interpret=(
        jax.devices()[0].platform == "cpu")))(p, residual, v)
    dys = (act(k[6], hidden), act(k[7], hidden))
    return (dys, z, mean, rstd, v), (p, bias, residual, scale, shift, seeds)


def pallas_call(kernel: str, tuning, with_output: bool, interpret: bool):
    """jit of the kernel as the model calls it, taking inputs()'s operands."""
    import functools

    import jax

    from bert_jax.models.kernels import gelu, residual_norm as norm

    if kernel == "gelu_bwd":
        return jax.jit(functools.partial(gelu.gelu_backward, with_output=with_output,
                                         interpret=interpret, tuning=tuning))
    if kernel == "norm_fwd":
        return jax.jit(functools.partial(norm.forward, rate=RATE, eps=EPS, interpret=interpret,
                                         tuning=tuning))
    return jax.jit(functools.partial(norm.backward, rate=RATE, interpret=interpret,
                                     tuning=tuning))


def xla_call(kernel: str, with_output: bool, expression_inputs):
    """XLA's fusion of the same expression (module doc): a callable taking the kernel's
    operands (inputs())."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models.dropout import hash_dropout
    from bert_jax.models.kernels import gelu
    from bert_jax.models.layers import LayerNorm

    if kernel == "gelu_bwd":
        def gelu_bwd(p, bias, g):
            y, vjp = jax.vjp(gelu.reference, p, bias)
            return (y, *vjp(g)) if with_output else vjp(g)
        return jax.jit(gelu_bwd)

    def dropped(p, bias, seeds):
        return hash_dropout((p.astype(jnp.float32) + bias).astype(p.dtype), seeds, RATE)

    if kernel == "norm_fwd":
        def norm_fwd(p, residual, v):
            seeds = jax.lax.bitcast_convert_type(v[3, :2], jnp.uint32)
            z = residual + dropped(p, v[0], seeds)
            zf = z.astype(jnp.float32)
            mean = jnp.mean(zf, -1)
            var = jnp.maximum(jnp.mean(zf * zf, -1) - mean * mean, 0.0)
            rstd = jax.lax.rsqrt(var + EPS)
            y = (zf - mean[:, None]) * (rstd[:, None] * v[1]) + v[2]
            return y.astype(z.dtype), z, mean, rstd
        return jax.jit(norm_fwd)

    p, bias, residual, scale, shift, seeds = expression_inputs

    def expression(p, bias, residual, scale, shift):  # the model's XLA path
        ln = LayerNorm(epsilon=EPS, dtype=p.dtype, param_dtype=jnp.float32)
        return ln.apply({"params": {"scale": scale, "bias": shift}},
                        residual + dropped(p, bias, seeds))

    _, vjp = jax.vjp(expression, p, bias, residual, scale, shift)
    apply = jax.jit(lambda f, dy1, dy2: f(dy1 + dy2))  # XLA adds the two cotangents
    return lambda dys, *_: apply(vjp, *dys)


# ------------------------------------------------------------------------------ numerics


def check(kernel: str, want, got, args) -> str | None:
    """None if `got` (a tuning's outputs) matches `want` (the default's) as the module doc
    states, else the first failure in one line. Computed where the arrays are."""
    import jax.numpy as jnp

    gamma = lambda n: 2.0 * n * 2.0 ** -24  # noqa: E731
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731

    def exact(name, a, b):
        return None if bool(jnp.array_equal(a, b)) else (
            f"{name} not bit for bit (max |diff| {float(jnp.max(jnp.abs(f32(a) - f32(b)))):.3g})")

    def bounded(name, a, b, bound):
        excess = float(jnp.max(jnp.abs(f32(a) - f32(b)) - bound))
        return None if excess <= 0 else f"{name} off by {excess:.3g} beyond its bound"

    def top(name, a, b):
        return bounded(name, a, b, 2.0 ** -6 * float(jnp.max(jnp.abs(f32(a)))))

    if kernel == "gelu_bwd":
        *elementwise, db = want
        *elementwise_got, db_got = got
        rows = elementwise[-1].shape[0]
        errs = [exact(n, a, b) for n, a, b in zip(("y", "dh")[-len(elementwise):],
                                                 elementwise, elementwise_got)]
        errs.append(bounded("db", db, db_got,
                            gamma(rows) * jnp.sum(jnp.abs(f32(elementwise[-1])), 0)))
    elif kernel == "norm_fwd":
        y, z, mean, rstd = want
        width = z.shape[1]
        zf = f32(z)
        d_mean = gamma(width) * jnp.mean(jnp.abs(zf), 1)
        d_var = gamma(width) * jnp.mean(zf * zf, 1) + 2 * jnp.abs(mean) * d_mean
        errs = [exact("z", z, got[1]), bounded("mean", mean, got[2], d_mean),
                bounded("rstd", rstd, got[3], 0.5 * rstd ** 3 * d_var + 2.0 ** -21 * rstd),
                top("y", y, got[0])]
    else:
        dr, dp, dv = want
        dys, z, mean, rstd = args[:4]
        rows = z.shape[0]
        dy = f32(dys[0]) + f32(dys[1])
        xhat = (f32(z) - mean[:, None]) * rstd[:, None]
        terms = jnp.stack([jnp.sum(jnp.abs(f32(dp)), 0), jnp.sum(jnp.abs(dy * xhat), 0),
                           jnp.sum(jnp.abs(dy), 0), jnp.zeros(z.shape[1])])
        errs = [top("d_residual", dr, got[0]), top("d_p", dp, got[1]),
                bounded("d_vectors", dv, got[2], gamma(rows) * terms)]
    return next((e for e in errs if e), None)


# -------------------------------------------------------------------------------- timing


def time_call(call, args, warmup: int, iters: int, repeats: int) -> float:
    """Median microseconds a call over `repeats` groups of `iters` queued calls."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(call(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters - 1):
            call(*args)
        jax.block_until_ready(call(*args))
        times.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(times)


def dispatch_floor(operands, args) -> float:
    """Microseconds a queued call of a trivial jitted function of the same operands takes."""
    import jax

    call = jax.jit(lambda *a: jax.tree_util.tree_leaves(a)[0][0, 0])
    return time_call(call, operands, args.warmup + 1, args.iters, args.repeats)


def one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def fmt(row: dict) -> str:
    head = f"{row['case']:9s} {row['kernel']:8s} {row['path']:6s} {row['tuning']:44s}"
    if "us" not in row:
        return f"{head} {row.get('error') or 'rejected: ' + row['rejected']}"
    pct = f"{row['pct_peak']:5.1f}%" if row.get("pct_peak") is not None else "     -"
    same = {True: "  bit for bit", False: "  within bounds"}.get(row.get("exact"), "")
    return f"{head} {row['us']:9.1f} {row['gbps']:8.1f} {pct}{same}"


# -------------------------------------------------------------------------------- driver


def measure(args) -> tuple[list, list]:
    """(rows, lines): the default and XLA rows of every case, then (--sweep) the grids."""
    import jax

    dev = jax.devices()[0]
    interpret = dev.platform == "cpu"
    peak = peak_tbps(dev.device_kind, args.peak_tbps)
    cases = SMOKE_CASES if args.smoke else {c: CASES[c] for c in args.cases}
    deadline = time.perf_counter() + args.budget_s
    rows, lines, skipped = [], [], []

    def emit(text):
        print(text, flush=True)
        lines.append(text)

    emit(f"== kernel bandwidth: {dev.device_kind} ({dev.platform}), jax {jax.__version__}; "
         f"bf16; peak {peak or '?'} TB/s; median of {args.repeats} x {args.iters} calls; "
         f"budget {args.budget_s:.0f} s ==")
    emit(f"{'case':9s} {'kernel':8s} {'path':6s} {'tuning':44s} {'us':>9s} {'GB/s':>8s} "
         f"{'peak':>6s}")
    defaults = {}  # (case, kernel) -> (outputs, inputs, effective launch)

    def run(case, kernel, path, overrides):
        n, hidden, ffn, with_output = cases[case]
        row = dict(case=case, kernel=kernel, path=path, tuning=label(overrides),
                   overrides=overrides, bytes=kernel_bytes(kernel, n, hidden, ffn, with_output))
        if time.perf_counter() > deadline:
            skipped.append(f"{case}/{kernel}/{path}/{row['tuning']}")
            return None
        try:
            if (case, kernel) not in defaults:
                defaults[case, kernel] = (None, inputs(kernel, n, hidden, ffn), None)
            want, (operands, expression_inputs), _ = defaults[case, kernel]
            if path == "xla":
                call = xla_call(kernel, with_output, expression_inputs)
            else:
                tuning = tuning_of(kernel, overrides)
                row["launch"] = effective(kernel, tuning, n, hidden, ffn)
                call = pallas_call(kernel, tuning, with_output, interpret)
            t0 = time.perf_counter()
            out = jax.block_until_ready(call(*operands))
            row["compile_s"] = round(time.perf_counter() - t0, 3)
            if path == "pallas" and not overrides:
                defaults[case, kernel] = (out, (operands, expression_inputs), row["launch"])
            elif path == "pallas":
                row["rejected"] = check(kernel, want, out, operands)
                if row["rejected"]:
                    rows.append(row)
                    emit(fmt(row))
                    return row
                del row["rejected"]
                row["exact"] = all(bool(jax.numpy.array_equal(a, b)) for a, b in zip(
                    jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(out)))
            row["us"] = time_call(call, operands, args.warmup, args.iters, args.repeats)
            row["gbps"] = row["bytes"] / row["us"] / 1e3
            row["pct_peak"] = 100 * row["gbps"] / (peak * 1e3) if peak else None
        except Exception as e:  # noqa: BLE001 - one row's error; the rest goes on
            row["error"] = one_line(e)
        rows.append(row)
        emit(fmt(row))
        return row

    for case in cases:
        for kernel in args.kernels:
            run(case, kernel, "pallas", {})
            run(case, kernel, "xla", {})
            if (case, kernel) in defaults and len(defaults) == 1:  # the first kernel run
                emit(f"-- dispatch floor: {dispatch_floor(defaults[case, kernel][1][0], args):.1f}"
                     " us a queued call (rows near it are launch-bound)")
    if args.sweep or args.smoke:
        for case in cases:
            n, hidden, ffn, _ = cases[case]
            for kernel in args.kernels:
                seen = {defaults.get((case, kernel), (None, None, None))[2]}
                for overrides in GRIDS[kernel]:
                    launch = effective(kernel, tuning_of(kernel, overrides), n, hidden, ffn)
                    if (launch is None or launch in seen
                            or defaults.get((case, kernel), (None,))[0] is None):
                        continue  # a repeat, or a kernel whose default did not run
                    seen.add(launch)
                    run(case, kernel, "pallas", overrides)
        emit("== best per case and kernel (against the default tuning and XLA) ==")
        for line in best_lines(rows):
            emit(line)
    if skipped:
        emit(f"-- past the budget ({args.budget_s:.0f} s), not run: {len(skipped)} rows: "
             + ", ".join(skipped[:12]) + (" ..." if len(skipped) > 12 else ""))
    return rows, lines


def best_lines(rows: list) -> list[str]:
    lines = []
    timed = [r for r in rows if "us" in r]
    for case, kernel in dict.fromkeys((r["case"], r["kernel"]) for r in timed):
        group = [r for r in timed if (r["case"], r["kernel"]) == (case, kernel)]
        pallas = [r for r in group if r["path"] == "pallas"]
        default = next((r for r in pallas if not r["overrides"]), None)
        xla = next((r for r in group if r["path"] == "xla"), None)
        if not pallas or default is None:
            continue
        best = min(pallas, key=lambda r: r["us"])
        pct = f", {best['pct_peak']:.1f}% of peak" if best.get("pct_peak") is not None else ""
        hit = ""
        if best.get("pct_peak") is not None and kernel != "norm_fwd":
            hit = (" (target met)" if best["pct_peak"] >= 100 * TARGET_FRACTION
                   else " (target not met)")
        vs_xla = f", XLA {xla['us']:.1f} us" if xla else ""
        lines.append(f"{case:9s} {kernel:8s} {best['tuning']}: {best['us']:.1f} us{pct}{hit}; "
                     f"default {default['us']:.1f} us ({default['us'] / best['us']:.2f}x)"
                     f"{vs_xla}; {len(pallas)} tunings timed")
    return lines


KERNEL_NAMES = {"gelu_bwd": "gelu_backward", "norm_fwd": "residual_norm_fwd",
                "norm_bwd": "residual_norm_bwd"}  # the pallas_call names, the PTX entries
SM_REGISTERS, SM_WARPS, SM_BLOCKS = 65536, 64, 32  # per SM on sm_90 (H100, H200)


def ptxas_stats(dump_dir: str, entry: str, ptxas: str, warps: int) -> str:
    """"regs R, spill S B, ~W warps/SM" of the kernel `entry` in XLA's dumped PTX, by ptxas
    -v for the PTX's own target; W: the warps an SM holds at R registers a thread (the
    register file, 8-register granules), the occupancy a memory-bound kernel hides its
    latency with."""
    import glob
    import re
    import subprocess

    for path in sorted(glob.glob(os.path.join(dump_dir, "*.ptx"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if f".entry {entry}(" not in text:
            continue
        arch = re.search(r"^\.target (\S+)", text, re.M).group(1).rstrip(",")
        proc = subprocess.run([ptxas, f"-arch={arch}", "-v", path, "-o", os.devnull],
                              capture_output=True, text=True, timeout=600)
        info = proc.stderr[proc.stderr.find(f"'{entry}'"):]
        regs = re.search(r"Used (\d+) registers", info)
        spill = re.search(r"(\d+) bytes spill stores", info)
        if not regs:
            return "ptxas: " + (proc.stderr.strip().splitlines() or ["no figures"])[-1][:80]
        r = int(regs.group(1))
        blocks = min(SM_BLOCKS, SM_REGISTERS // (-(-r // 8) * 8 * 32 * warps))
        return (f"regs {r:3d}, spill {int(spill.group(1)) if spill else 0:5d} B, "
                f"~{min(SM_WARPS, blocks * warps):2d} warps/SM")
    return "no PTX for " + entry


def audit(args) -> int:
    """Compile every grid tuning of every case for a GPU description (Triton lowering), on
    any host with jax's CUDA plugin wheels; print the ones that fail and, with ptxas, each
    kernel's registers, spills and the warps an SM holds."""
    import shutil
    import tempfile

    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from benchmarks import compiled_step

    target = args.gpu_target_config or compiled_step.DEFAULT_GPU_TARGET
    dev = compiled_step.gpu_target_devices(target)[0]
    sh = SingleDeviceSharding(dev)
    def spec(shape, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)

    ptxas = args.ptxas or shutil.which("ptxas")
    print(f"== kernel_bandwidth audit: every grid tuning compiled for {os.path.basename(target)}"
          f" ({dev.device_kind}); ptxas: {ptxas or 'none'} ==", flush=True)
    failed, total = [], 0
    for case in args.cases:
        n, hidden, ffn, with_output = CASES[case]
        for kernel in args.kernels:
            if kernel == "gelu_bwd":
                shapes = (spec((n, ffn)), spec((ffn,), jnp.float32), spec((n, ffn)))
            elif kernel == "norm_fwd":
                shapes = (spec((n, hidden)), spec((n, hidden)), spec((4, hidden), jnp.float32))
            else:
                shapes = ((spec((n, hidden)),) * COPIES, spec((n, hidden)),
                          spec((n,), jnp.float32), spec((n,), jnp.float32),
                          spec((4, hidden), jnp.float32))
            seen = set()
            for overrides in [{}] + GRIDS[kernel]:
                tuning = tuning_of(kernel, overrides)
                launch = effective(kernel, tuning, n, hidden, ffn)
                if launch is None or launch in seen:
                    continue
                seen.add(launch)
                total += 1
                fn = pallas_call(kernel, tuning, with_output, interpret=False)
                t0 = time.perf_counter()
                dump = tempfile.mkdtemp(prefix="kernel_bandwidth_")
                try:
                    options = {"xla_dump_to": dump} if ptxas else None
                    fn.trace(*shapes).lower().compile(compiler_options=options)
                    status = f"ok {time.perf_counter() - t0:5.1f} s"
                    if ptxas:
                        warps = (tuning.num_warps if kernel == "gelu_bwd" else
                                 tuning.fwd_num_warps if kernel == "norm_fwd" else
                                 tuning.bwd_num_warps)
                        status += "  " + ptxas_stats(dump, KERNEL_NAMES[kernel], ptxas, warps)
                except Exception as e:  # noqa: BLE001
                    status = "FAILED " + one_line(e)
                    failed.append(f"{case}/{kernel}/{label(overrides)}")
                finally:
                    shutil.rmtree(dump, ignore_errors=True)
                print(f"{case:9s} {kernel:8s} {label(overrides):44s} {launch} {status}",
                      flush=True)
    print(f"{total - len(failed)} of {total} launches compile"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated (%(default)s)")
    p.add_argument("--kernels", default=",".join(KERNELS),
                   help="comma-separated, in this order (%(default)s)")
    p.add_argument("--sweep", action="store_true", help="time the grids too")
    p.add_argument("--budget_s", type=float, default=None,
                   help="wall-clock budget from the first row, s (90; smoke 600): later rows "
                   "are skipped and listed")
    p.add_argument("--json", default=None, help="write the rows and the table here")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls (3; smoke 0)")
    p.add_argument("--iters", type=int, default=None, help="calls per repeat (30; smoke 1)")
    p.add_argument("--repeats", type=int, default=None, help="repeats, median (5; smoke 1)")
    p.add_argument("--peak_tbps", type=float, default=None,
                   help="the device's HBM bandwidth, TB/s (default: PEAK_TBPS by device kind)")
    p.add_argument("--smoke", action="store_true",
                   help="CPU: interpret mode, tiny shapes, every grid tuning checked")
    p.add_argument("--audit", action="store_true",
                   help="compile every grid tuning for a GPU description (no device)")
    p.add_argument("--gpu_target_config", default=None,
                   help="--audit's GPU description (default: compiled_step's H100 one)")
    p.add_argument("--ptxas", default=None,
                   help="--audit: CUDA's ptxas for registers and spills (default: on PATH)")
    args = p.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    args.kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    unknown = ([c for c in args.cases if c not in CASES]
               + [k for k in args.kernels if k not in KERNELS])
    if unknown or not args.kernels:
        p.error(f"unknown case(s) or kernel(s) {unknown}; known: {list(CASES)}, {list(KERNELS)}")
    if args.smoke or args.audit:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.audit:
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
        return audit(args)
    small = args.smoke
    args.warmup = args.warmup if args.warmup is not None else (0 if small else 3)
    args.iters = args.iters if args.iters is not None else (1 if small else 30)
    args.repeats = args.repeats if args.repeats is not None else (1 if small else 5)
    if args.budget_s is None:
        args.budget_s = 600.0 if small else 90.0  # the smoke run checks the whole grid
    rows, lines = measure(args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(dict(rows=rows, table=lines), f, indent=1, default=str)
    failed = [r for r in rows if r.get("error") or r.get("rejected")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
