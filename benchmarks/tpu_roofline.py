r"""What the training step should cost on a TPU, from its compile on a CPU host: what
benchmarks/step_hlo.py prints for --target=tpu:<topology>. Not a script.

    python benchmarks/step_hlo.py --config=configs/bert_large.py --batch=64 --seq=512 --target=tpu:v5e:2x2

The step's cost. XLA's cost analysis of the compiled step (`compiled.cost_analysis()`: FLOPs
and bytes accessed per device, by the TPU compiler's own counting) at the chip's published
bf16 peak and HBM bandwidth (CHIPS): compute time = FLOPs / peak, memory time = bytes /
bandwidth; the estimate is the larger (every kernel overlapping its reads with its math,
the roofline's floor) and the sum bounds it from above. The cost analysis counts a while
loop's body once, and a TPU compile keeps the stacked layers in a loop (scan_unroll "auto"
is 1 there), so with rolled layers the step is compiled a second time with twice the
layers per trip: body = (second - first) / unroll, and the step = first + (layers - unroll)
x body. FLOPs include the elementwise work the vector units do (softmax, GELU, dropout's
hash), timed here at the matrix units' peak: a floor for those too.

The cost analysis is the TPU compiler's own count; step_hlo's audit (written for GPU
programs) finds the attention's kernels and counts their bytes, but it does not know the
TPU's memory spaces (prefetches into on-chip memory, asynchronous slices), so its bytes
are an upper bound there and its byte total no estimate of the step: the attention
verdict's XLA side is as large as it can be (benchmarks/RESULTS.md sets a lower bound
beside it, from a splash compile). On a rolled layer loop the corrected cost analysis runs well above
the same step compiled unrolled (benchmarks/RESULTS.md): `--config.model.scan_unroll=0`
compiles the loop-free program, whose count needs no correction.

The attention at [length, length]. The XLA path (the TPU path with attention dropout;
splash has none) writes and reads the scores, probabilities and their gradients as
[batch, heads, length, length] arrays in HBM. step_hlo's audit finds every kernel with an
operand or output with two dims equal to the length: their bytes (and the square arrays'
share of them) and their products. A flash kernel (a Pallas TPU kernel with the hash
dropout inside, its mask recomputed from the same hash in the backward pass) keeps those
arrays on chip: it moves per layer Q, K, V, O, dO, dQ, dK, dV and float32 softmax
statistics per row (flash_io), and does 7 products of batch x heads x length^2 x head_dim
multiply-adds (S = QK^T and PV forward; S again, dV, dP, dQ and dK backward). Each side is
timed as max(products at peak, bytes at bandwidth); the difference is what the kernel
would save a step, set against the step's estimate in the verdict.
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    peak_flops: float  # dense bf16 FLOP/s per chip
    hbm_bps: float  # HBM bytes/s per chip
    source: str


# Published per-chip figures (Google Cloud's TPU system architecture pages, read
# 2026-12): the bf16 peak and the HBM bandwidth. A v4 chip has two TensorCores, which
# its topology description shows as two devices; the others one device per chip (v5p
# chips as one megacore device).
CHIPS = {
    "v4": Chip("TPU v4", 275e12, 1200e9, "cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16, "
               "32 GiB HBM2 at 1,200 GB/s"),
    "v5e": Chip("TPU v5e", 197e12, 819e9, "cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, "
                "16 GB HBM2 at 819 GB/s"),
    "v5p": Chip("TPU v5p", 459e12, 2765e9, "cloud.google.com/tpu/docs/v5p: 459 TFLOP/s "
                "bf16, 95 GB HBM2e at 2,765 GB/s"),
    "v6e": Chip("TPU v6e", 918e12, 1638e9, "cloud.google.com/tpu/docs/v6e: 918 TFLOP/s "
                "bf16, 32 GB HBM at 1,638 GB/s"),
}
_KINDS = (("TPU v5 lite", "v5e"), ("TPU v6 lite", "v6e"), ("TPU v4", "v4"), ("TPU v5", "v5p"))


def chip_of(devices) -> tuple[Chip, int]:
    """(the chip, devices per chip) of a TPU topology's devices: devices on one chip share
    its coords."""
    kind = devices[0].device_kind
    gen = next((g for prefix, g in _KINDS if kind.startswith(prefix)), None)
    if gen is None:
        raise ValueError(f"no published figures for {kind!r} in CHIPS")
    chips = {tuple(getattr(d, "coords", (i,))) for i, d in enumerate(devices)}
    return CHIPS[gen], max(1, len(devices) // max(1, len(chips)))


def xla_cost(compiled) -> dict:
    """{flops, bytes, transcendentals} per device of XLA's cost analysis."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0)),
            "transcendentals": float(cost.get("transcendentals", 0.0))}


def step_cost(compiled, mcfg, recompile) -> tuple[dict, str]:
    """(cost of the whole step, how it was counted). recompile(unroll) compiles the same
    step with model.scan_unroll=unroll (called only when the layers run as a rolled
    loop)."""
    first = xla_cost(compiled)
    layers = mcfg.num_hidden_layers
    unroll = mcfg.unroll_for("tpu") if mcfg.scan_layers else 0
    if not unroll or unroll >= layers:
        return first, "XLA's cost analysis (no layer loop)"
    if layers % (2 * unroll):
        return first, (f"XLA's cost analysis, the layer loop's body counted once ({layers} "
                       f"layers do not split into trips of {2 * unroll})")
    second = xla_cost(recompile(2 * unroll))
    body = {k: (second[k] - first[k]) / unroll for k in first}
    total = {k: first[k] + (layers - unroll) * body[k] for k in first}
    return total, (f"XLA's cost analysis, the layer loop's body counted {layers} times (from "
                   f"a second compile with scan_unroll={2 * unroll})")


def roofline(cost: dict, chip: Chip, per_chip: int) -> dict:
    """Seconds per step on one device: compute, memory, estimate (the larger), sum."""
    peak, bw = chip.peak_flops / per_chip, chip.hbm_bps / per_chip
    out = {"compute_s": cost["flops"] / peak, "memory_s": cost["bytes"] / bw}
    out["estimate_s"] = max(out["compute_s"], out["memory_s"])
    out["sum_s"] = out["compute_s"] + out["memory_s"]
    return out


def square(shape: str, seq: int) -> bool:
    """Whether an HLO shape holds an array with two dims equal to `seq`."""
    for dims in re.findall(r"\[([0-9,]*)\]", shape):
        if [int(d) for d in dims.split(",") if d].count(seq) >= 2:
            return True
    return False


def square_kernels(kernels: list, seq: int) -> list:
    """The kernels (step_hlo.audit's) that read or write a [.., seq, .., seq] array."""
    return [k for k in kernels if any(square(shape, seq) for shape, _ in k.traffic)]


def square_bytes(kernel, seq: int) -> int:
    """Bytes of the [.., seq, .., seq] arrays a kernel reads and writes, per launch."""
    return sum(b for shape, b in kernel.traffic if square(shape, seq))


def attention_products(batch: int, heads: int, seq: int, head_dim: int) -> float:
    """FLOPs of one attention product over a layer's local batch (2 x b h s^2 d)."""
    return 2.0 * batch * heads * seq * seq * head_dim


def flash_io(batch: int, seq: int, hidden: int, heads: int, itemsize: int = 2) -> float:
    """Bytes a flash kernel moves per layer, forward and backward: reads Q, K, V and writes
    O and a float32 log-sum-exp per row forward; a small kernel reads O, dO and writes
    delta = rowsum(dO * O); backward reads Q, K, V, dO, the two row statistics and writes
    dQ, dK, dV."""
    act = batch * seq * hidden * itemsize
    row = batch * heads * seq * 4
    return (3 * act + act + row) + (2 * act + row) + (4 * act + 2 * row + 3 * act)


FLASH_PRODUCTS = 7  # S, PV forward; S, dV, dP, dQ, dK backward


def _short(shape: str) -> str:
    """An HLO shape without its layouts, cut to 60 characters."""
    shape = re.sub(r"\{[^}]*\}", "", shape)
    return shape if len(shape) <= 60 else shape[:57] + "..."


def attention_section(kernels: list, mcfg, batch: int, seq: int, chip: Chip, per_chip: int,
                      top: int = 6) -> tuple[list, float]:
    """(lines, seconds a step the flash kernel saves): the XLA path's [seq, seq] kernels
    (their bytes, the square arrays' share, products, the `top` largest) against a flash
    kernel's, each timed as max(products at peak, bytes at bandwidth)."""
    peak, bw = chip.peak_flops / per_chip, chip.hbm_bps / per_chip
    layers, heads, hidden = mcfg.num_hidden_layers, mcfg.num_attention_heads, mcfg.hidden_size
    sq = square_kernels(kernels, seq)
    nbytes = sum(k.count * square_bytes(k, seq) for k in sq)
    whole = sum(k.count * k.all_bytes for k in sq)
    products = sum(k.count for k in sq if k.kind == "gemm")
    one = attention_products(batch, heads, seq, hidden // heads)
    launches = sum(k.count for k in sq)
    f_bytes = layers * flash_io(batch, seq, hidden, heads)
    f_products = layers * FLASH_PRODUCTS
    xla_s = max(products * one / peak, whole / bw)
    flash_s = max(f_products * one / peak, f_bytes / bw)
    lines = [
        f"attention at [{seq}, {seq}] (per device, batch {batch}, {heads} heads):",
        f"  XLA path: {launches:,} kernels touch a [.., {seq}, .., {seq}] array "
        f"({launches / layers:.1f} a layer) and move {whole / 1e9:.2f} GB, "
        f"{nbytes / 1e9:.2f} GB of it those arrays; {products} attention products "
        f"({products / layers:.0f} a layer), {products * one / 1e12:.2f} TFLOP -> "
        f"max({1e3 * products * one / peak:.1f} ms at peak, {1e3 * whole / bw:.1f} ms at HBM "
        f"bandwidth) = {1e3 * xla_s:.1f} ms; the largest:"]
    for k in sorted(sq, key=lambda k: -k.count * square_bytes(k, seq))[:top]:
        where = re.sub(r".*/(attention|layers)/", r"\1/", k.op_name)
        arrays = sorted({_short(shape) for shape, _ in k.traffic if square(shape, seq)})
        lines.append(f"    {k.count * square_bytes(k, seq) / 1e9:6.2f} GB x{k.count:<3} "
                     f"{k.phase:8} {k.kind:5} {', '.join(arrays)} {where}")
    lines.append(
        f"  flash kernel (hash dropout inside): {f_bytes / 1e9:.2f} GB, {f_products} products "
        f"({FLASH_PRODUCTS} a layer), {f_products * one / 1e12:.2f} TFLOP -> "
        f"max({1e3 * f_products * one / peak:.1f} ms, {1e3 * f_bytes / bw:.1f} ms) = "
        f"{1e3 * flash_s:.1f} ms")
    return lines, xla_s - flash_s


def loops_line(loops: list) -> str:
    """What the step's while loops are: the layer loops (forward and backward) and any
    other, whose bodies the cost analysis counts once (an FSDP mesh's collective matmuls
    run in loops of their own)."""
    layer = [t for name, t in loops if name.endswith("/encoder/while")]
    other = [t for name, t in loops if not name.endswith("/encoder/while")]
    line = f"loops: {len(layer)} over the layers ({', '.join(map(str, layer)) or '-'} trips)"
    if other:
        line += (f"; {len(other)} others ({sum(other)} trips in all), each body counted once by "
                 f"the cost analysis, so the estimate undercounts them (a data-parallel mesh, "
                 f"--config.mesh.data=-1 --config.mesh.fsdp=1, has no collective-matmul loops)")
    return line


def report(compiled, mcfg, devices, batch: int, seq: int, kernels: list, recompile,
           loops: list = ()) -> list:
    """The lines step_hlo.py prints for a TPU target, the estimate last. `batch` is the
    per-device batch; kernels are step_hlo.audit's of the compiled step, loops its
    step_hlo.while_loops."""
    chip, per_chip = chip_of(devices)
    cost, how = step_cost(compiled, mcfg, recompile)
    roof = roofline(cost, chip, per_chip)
    mem = compiled.memory_analysis()
    peak_mem = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                - mem.alias_size_in_bytes + mem.temp_size_in_bytes)
    lines = [f"chip: {chip.name}, {per_chip} device(s) per chip ({chip.source}); figures "
             f"per device: {chip.peak_flops / per_chip / 1e12:.1f} TFLOP/s, "
             f"{chip.hbm_bps / per_chip / 1e9:.0f} GB/s; the step's memory per device: "
             f"{peak_mem / 2**30:.2f} GiB at its peak ({mem.temp_size_in_bytes / 2**30:.2f} "
             f"GiB temporaries)",
             f"step cost: {cost['flops'] / 1e12:.3f} TFLOP, {cost['bytes'] / 1e9:.2f} GB "
             f"accessed, {cost['transcendentals'] / 1e9:.2f} G transcendentals ({how})",
             f"  compute {1e3 * roof['compute_s']:.1f} ms at peak, memory "
             f"{1e3 * roof['memory_s']:.1f} ms at HBM bandwidth (no overlap: "
             f"{1e3 * roof['sum_s']:.1f} ms)", loops_line(loops)]
    if "second compile" in how:  # benchmarks/RESULTS.md: 3x the unrolled program's bytes
        lines.append("  (a rolled loop's bytes run above the unrolled program's: the cost "
                     "analysis reads its stacked buffers whole each trip; "
                     "--config.model.scan_unroll=0 for the estimate)")
    attention, saved = attention_section(kernels, mcfg, batch, seq, chip, per_chip)
    lines += attention
    lines.append(
        "  verdict: " + (f"a Pallas TPU kernel with the hash dropout would win: "
                         f"{1e3 * saved:.1f} ms a step less, "
                         f"{100 * saved / roof['estimate_s']:.0f}% of the estimate"
                         if saved > 0 else "the XLA attention holds: a flash kernel saves "
                         "nothing here"))
    per_s = batch * per_chip / roof["estimate_s"]
    lines.append(f"estimate: {1e3 * roof['estimate_s']:.1f} ms a step, {per_s:,.0f} "
                 f"sequences/s per chip ({per_s * seq:,.0f} tokens/s), "
                 f"{'memory' if roof['memory_s'] > roof['compute_s'] else 'compute'}-bound")
    return lines
