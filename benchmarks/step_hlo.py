r"""A static audit of the compiled pre-training step: its kernels, GEMMs and memory traffic,
read from the optimized HLO, and a time estimate from them. Nothing is run or timed.

    python benchmarks/step_hlo.py --config=configs/bert_base.py --batch=256 --seq=128 --target=h100
    python benchmarks/step_hlo.py --config=configs/bert_tiny.py --batch=2 --seq=32 --target=cpu

Compiles the step benchmarks/step_memory.py compiles (the trainer's own, on abstract inputs;
same flags and targets) and prints: the compile seconds; XLA's own cost analysis where the
backend gives one; kernel launches; custom calls by kind; GEMMs by dtype with their FLOPs;
the other kernels' bytes by phase; the largest other kernels; and, as the last line, the
estimate: GEMM FLOPs at --gemm_tflops + other kernels' bytes at --hbm_tbps + --launch_us per
launch, summed with no overlap. It is a floor to compare programs by, not a prediction.

Counting rule (`audit`). A kernel is each instruction of the entry computation that is a
fusion, a custom call, a collective, or any other op that does work (copy, reduce, scatter,
sort, a lone dot, ...); parameters, constants, tuples, get-tuple-element, bitcasts and
other bookkeeping are not kernels. A while loop's body counts once per trip
(`known_trip_count`, else the constant its condition's `counter < N` compares with, as in
a TPU compile's layer loops), its condition once more; a call's or async op's computation counts as
if inlined, and of a conditional's branches the one with the most kernels. A kernel is a
GEMM when it is a dot, a fusion holding a dot (XLA's Triton GEMM fusions) or a cuBLAS or
oneDNN matmul custom call; its FLOPs are 2 x output elements x contracted size, from the
shapes. Fused attention kernels (Triton/Pallas, cuDNN) count as other kernels: their
bytes, not their FLOPs. An other kernel's bytes are its operands' (each once) plus its
output's, except that a fusion operand read only through slices counts the slices, one
read only through a gather (elementwise ops between them included) counts the gathered
elements, and a dynamic-update-slice writes in place (the update, not the whole buffer).
GEMMs' bytes, counted the same way, are kept apart (`all_bytes`): the estimate times GEMMs
by their FLOPs.

--target=tpu:<topology> prints, in place of the GPU estimate, benchmarks/tpu_roofline.py's:
XLA's cost analysis of the step at the chip's published peak and HBM bandwidth, and the
XLA attention's [length, length] traffic against a flash kernel's.

Phases come from each instruction's op_name metadata (jax's name stack): `transpose(` is the
backward pass, `jvp(` the forward pass; the MLM and NSP heads and the loss (`/mlm/`, `/nsp/`,
and jvp() of the loss outside the model) are "heads"; what is in neither, the AdamW update,
the gradient norm and the metrics, is "optimizer"; kernels without an op_name (buffers XLA
made itself, such as a layer scan's zero-filled stacks) are "unattributed".
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Before jax: sets the environment a GPU or TPU compile target on a CPU host needs.
from benchmarks import compiled_step  # noqa: E402

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS

GIB = 2.0**30

# Bytes per element; sub-byte types round up to a byte, as buffers do.
_DTYPE_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
                "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
                "c64": 8, "c128": 16, "token": 0}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*(\(.*\))?.*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-]*)\(")

# Instructions that launch nothing: bookkeeping, aliasing, control flow (whose bodies are
# walked instead), and the second half of async pairs.
_NOT_KERNELS = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
    "add-dependency", "opt-barrier", "partition-id", "replica-id", "domain", "iota-barrier",
    "while", "conditional", "call", "async-start", "async-update", "async-done",
    "all-reduce-done", "all-gather-done", "collective-permute-done", "copy-done",
    "send-done", "recv-done", "get-dimension-size", "set-dimension-size",
}
_GEMM_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__onednn$matmul")
# Elementwise ops a fused operand may pass through on its way to a gather (same element
# count): the fusion computes them only for the elements the gather takes.
_ELEMENTWISE = {"convert", "add", "subtract", "multiply", "divide", "maximum", "minimum",
                "negate", "exponential", "log", "select", "compare", "and", "or", "not",
                "abs", "tanh", "rsqrt", "sqrt", "clamp", "bitcast-convert"}


def dtype_bytes(dtype: str) -> int:
    if dtype in _DTYPE_BYTES:
        return _DTYPE_BYTES[dtype]
    if dtype.startswith("f8") or dtype.startswith("f4") or dtype.startswith("f6"):
        return 1
    digits = re.search(r"(\d+)", dtype)
    return max(1, int(digits.group(1)) // 8) if digits else 4


def arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """The (dtype, dims) of every array in an HLO shape string (a tuple's elements in order)."""
    out = []
    for dtype, dims in _ARRAY.findall(shape):
        out.append((dtype, tuple(int(d) for d in dims.split(",") if d)))
    return out


def shape_bytes(shape: str) -> int:
    return sum(dtype_bytes(t) * math.prod(d) for t, d in arrays(shape))


@dataclasses.dataclass
class Instr:
    name: str
    shape: str
    opcode: str
    operands: list[str]
    attrs: str
    root: bool = False
    args: str = ""  # the text inside the opcode's parentheses (a parameter's index)

    def attr(self, key: str) -> str | None:
        m = re.search(r"\b" + re.escape(key) + r"=%?([^\s,}]+)", self.attrs)
        return m.group(1) if m else None

    @property
    def op_name(self) -> str:
        m = re.search(r'op_name="([^"]*)"', self.attrs)
        return m.group(1) if m else ""

    @property
    def target(self) -> str:
        m = re.search(r'custom_call_target="([^"]*)"', self.attrs)
        return m.group(1) if m else ""


def _split_shape(rest: str) -> tuple[str, str]:
    """(shape, remainder) of the text after `name = `: a tuple shape is balanced parens."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[:i + 1], rest[i + 1:]
    shape, _, remainder = rest.partition(" ")
    return shape, " " + remainder


def _parse_instr(line: str) -> Instr | None:
    m = _INSTR.match(line)
    if not m:
        return None
    shape, rest = _split_shape(m.group(3))
    op = _OPCODE.match(rest)
    if not op:
        return None
    body = rest[op.end():]
    depth, end = 1, len(body)
    for i, ch in enumerate(body):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            end = i
            break
    operands = re.findall(r"%([^\s,()]+)", body[:end])
    return Instr(m.group(2), shape, op.group(1), operands, body[end + 1:], bool(m.group(1)),
                 body[:end])


def parse_module(text: str) -> tuple[dict[str, list[Instr]], str]:
    """({computation name: its instructions}, the entry computation's name) of an HLO
    module's text (`compiled.as_text()`)."""
    comps: dict[str, list[Instr]] = {}
    entry, current = None, None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            m = _HEADER.match(stripped)
            if m and not stripped.startswith("HloModule"):
                current = m.group(2)
                comps[current] = []
                if m.group(1):
                    entry = current
            continue
        if stripped == "}":
            current = None
            continue
        instr = _parse_instr(line)
        if instr is not None:
            comps[current].append(instr)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps, entry


def dot_flops(dot: Instr, shapes: dict[str, str]) -> int:
    """2 x output elements x contracted elements of a dot (or a GEMM custom call, whose
    contracting dimensions are in its backend config)."""
    out = arrays(dot.shape)[0][1]
    lhs = arrays(shapes[dot.operands[0]])[0][1]
    m = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", dot.attrs)
    if m:
        contracting = [int(d) for d in m.group(1).split(",") if d]
    else:
        m = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', dot.attrs)
        contracting = [int(d) for d in re.findall(r"\d+", m.group(1))] if m else []
    return 2 * math.prod(out) * math.prod(lhs[d] for d in contracting)


def gemm_dtype(dot: Instr, shapes: dict[str, str]) -> str:
    ins = " x ".join(arrays(shapes[o])[0][0] for o in dot.operands[:2])
    return f"{ins} -> {arrays(dot.shape)[0][0]}"


_PHASES = ("forward", "backward", "heads", "optimizer", "unattributed")


def phase(op_name: str) -> str:
    """forward, backward, heads or optimizer, from jax's name stack in op_name; unattributed
    where XLA left no op_name (buffers it made itself, such as a loop's zero-filled stacks)."""
    if not op_name:
        return "unattributed"
    if "/mlm/" in op_name or "/nsp/" in op_name or "jvp())" in op_name or "jvp()/" in op_name:
        return "heads"
    if "transpose(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    return "optimizer"


@dataclasses.dataclass
class Kernel:
    name: str
    opcode: str
    kind: str  # "gemm", a custom call's or fusion's kind, or "other"
    count: int  # launches per step
    bytes: int  # per launch (other kernels)
    flops: int  # per launch (GEMMs)
    dtype: str  # GEMMs: "bf16 x bf16 -> bf16"
    op_name: str
    shape: str
    impl: str = ""  # GEMMs: what emits them (cuBLAS, a Triton GEMM fusion, ...)
    all_bytes: int = 0  # per launch, operands + output, GEMMs included
    traffic: tuple = ()  # per launch: (array shape, bytes) of each array read or written

    @property
    def phase(self) -> str:
        return phase(self.op_name)


def _custom_kind(instr: Instr) -> str:
    t = instr.target
    if any(t.startswith(g) for g in _GEMM_TARGETS):
        return "cuBLAS GEMM" if "cublas" in t else "oneDNN GEMM"
    if t.startswith("__cudnn$fmha") or "cudnn" in t and "attention" in t:
        return "cuDNN attention"
    if t.startswith("__cudnn"):
        return "cuDNN " + t.split("$", 1)[-1]
    if t == "__gpu$xla.gpu.triton":
        name = instr.op_name.rsplit("/pallas_call", 1)[0].rsplit("/", 1)[-1]
        return f"Triton/Pallas {name}"
    return t or "custom-call"


def _fusion_kind(instr: Instr) -> str:
    m = re.search(r'"fusion_(?:backend_)?config":\{"kind":"([^"]*)"', instr.attrs)
    kind = m.group(1) if m else ""
    name = re.search(r'"custom_fusion_config":\{"name":"([^"]*)"', instr.attrs)
    return f"{kind} {name.group(1)}" if name else kind


def _elements(shape: str) -> int:
    return sum(math.prod(d) for _, d in arrays(shape))


def _fusion_traffic(instr: Instr, fused: list[Instr], shapes: dict[str, str],
                    comps: dict | None = None) -> list:
    """[(array shape, bytes)] a fusion reads (each operand once) and writes, reading through
    its fused computation (and the fusions nested in it, from `comps`): an operand read
    only through (dynamic-)slices counts the slices, one read only through a gather (after
    elementwise ops: a loop fusion computes them for the gathered elements only) counts the
    gathered elements, a dynamic-update-slice into an operand writes the update in place."""
    comps = comps or {}
    by_name = {i.name: i for i in fused}
    users_of: dict[int, dict] = {}

    def users(body: list[Instr]) -> dict:
        if id(body) not in users_of:
            found = collections.defaultdict(list)
            for i in body:
                for o in i.operands:
                    found[o].append(i)
            users_of[id(body)] = found
        return users_of[id(body)]

    def read(body: list[Instr], name: str, full: int, per_element: float, elements: int) -> int:
        if not users(body)[name]:  # the fusion's output: every element
            return full
        total = 0
        for u in users(body)[name]:
            if u.opcode in ("bitcast", "reshape"):
                total += read(body, u.name, full, per_element, elements)
            elif u.opcode in ("slice", "dynamic-slice") and u.operands[0] == name:
                total += _elements(u.shape) * per_element
            elif u.opcode == "gather" and u.operands[0] == name:
                total += _elements(u.shape) * per_element
            elif u.opcode == "dynamic-update-slice" and u.operands[0] == name:
                continue
            elif u.opcode in _ELEMENTWISE and _elements(u.shape) == elements:
                total += read(body, u.name, full, per_element, elements)
            elif u.opcode == "fusion" and u.attr("calls") in comps:  # a nested fusion
                inner = comps[u.attr("calls")]
                params = [i for i in inner if i.opcode == "parameter"]
                for j, o in enumerate(u.operands):
                    if o == name and j < len(params):
                        total += read(inner, _param_by_index(params, j).name, full,
                                      per_element, elements)
            else:
                return full
        return int(min(total, full))

    def written(i: Instr) -> list:
        if i.opcode == "tuple":
            return [w for o in i.operands if o in by_name for w in written(by_name[o])]
        if i.opcode == "bitcast" and i.operands and i.operands[0] in by_name:
            return written(by_name[i.operands[0]])
        if i.opcode == "dynamic-update-slice":
            update = by_name[i.operands[1]].shape
            return [(update, shape_bytes(update))]
        return [(i.shape, shape_bytes(i.shape))]

    param_list = [i for i in fused if i.opcode == "parameter"]
    traffic, seen = [], set()
    for idx, operand in enumerate(instr.operands):
        if operand in seen or idx >= len(param_list):
            continue
        seen.add(operand)
        p = _param_by_index(param_list, idx)
        shape = shapes.get(operand, p.shape)
        full, n = shape_bytes(shape), _elements(shape)
        traffic.append((shape, read(fused, p.name, full, full / max(n, 1), n)))
    root = next((i for i in fused if i.root), fused[-1])
    return traffic + written(root)


def _param_by_index(params: list[Instr], idx: int) -> Instr:
    for p in params:
        if p.args.strip() == str(idx):
            return p
    return params[idx]


def audit(text: str) -> list[Kernel]:
    """The kernels one execution of the module launches, by the counting rule of this
    file's docstring."""
    comps, entry = parse_module(text)
    shapes_of = {c: {i.name: i.shape for i in instrs} for c, instrs in comps.items()}
    kernels: dict[tuple[str, str], Kernel] = {}

    def fused_dots(comp: str) -> list[tuple[str, Instr]]:
        out = []
        for i in comps.get(comp, []):
            if i.opcode in ("dot", "convolution"):
                out.append((comp, i))
            elif i.opcode == "fusion" and i.attr("calls"):
                out.extend(fused_dots(i.attr("calls")))
        return out

    def add(comp: str, i: Instr, mult: int, kind: str, flops: int = 0, dtype: str = "",
            impl: str = "", traffic: list = ()):
        key = (comp, i.name)
        if key in kernels:
            kernels[key].count += mult
        else:
            moved = sum(b for _, b in traffic)
            kernels[key] = Kernel(i.name, i.opcode, kind, mult, 0 if kind == "gemm" else moved,
                                  flops, dtype, i.op_name, i.shape, impl, moved, tuple(traffic))

    def walk(comp: str, mult: int):
        shapes = shapes_of[comp]
        for i in comps[comp]:
            op = i.opcode
            if op == "while":
                m = re.search(r'"known_trip_count":\{"n":"(\d+)"', i.attrs)
                trips = int(m.group(1)) if m else _counted_trips(comps[i.attr("condition")])
                walk(i.attr("body"), mult * trips)
                walk(i.attr("condition"), mult * (trips + 1))
            elif op == "conditional":
                listed = re.search(r"branch_computations=\{([^}]*)\}", i.attrs)
                branches = re.findall(r"%?([^\s,]+)", listed.group(1)) if listed else []
                branches += [b for b in (i.attr("true_computation"),
                                         i.attr("false_computation")) if b]
                if branches:
                    walk(max(branches, key=count_only), mult)
            elif op in ("call", "async-start"):
                callee = i.attr("to_apply") or i.attr("calls")
                if callee in comps:
                    walk(callee, mult)
            elif op in _NOT_KERNELS:
                continue
            elif op == "fusion":
                fused = comps.get(i.attr("calls"), [])
                dots = fused_dots(i.attr("calls"))
                if dots:
                    flops = sum(dot_flops(d, shapes_of[c]) for c, d in dots)
                    c0, d0 = dots[0]
                    kind = _fusion_kind(i)
                    impl = ("Triton GEMM fusion" if "triton" in kind and "gemm" in kind
                            else f"GEMM fusion {kind or i.attr('kind')}")
                    add(comp, i, mult, "gemm", flops=flops, dtype=gemm_dtype(d0, shapes_of[c0]),
                        impl=impl, traffic=_fusion_traffic(i, fused, shapes, comps))
                else:
                    add(comp, i, mult, _fusion_kind(i) or "other",
                        traffic=_fusion_traffic(i, fused, shapes, comps))
            elif op in ("dot", "convolution"):
                add(comp, i, mult, "gemm", flops=dot_flops(i, shapes), dtype=gemm_dtype(i, shapes),
                    impl=f"{op} (unfused)", traffic=_plain_traffic(i, shapes))
            elif op == "custom-call":
                kind = _custom_kind(i)
                if kind.endswith("GEMM"):
                    add(comp, i, mult, "gemm", flops=dot_flops(i, shapes),
                        dtype=gemm_dtype(i, shapes), impl=kind, traffic=_plain_traffic(i, shapes))
                else:
                    add(comp, i, mult, kind, traffic=_plain_traffic(i, shapes))
            else:
                add(comp, i, mult, "other", traffic=_plain_traffic(i, shapes))

    def count_only(comp: str) -> int:
        saved = dict(kernels)
        kernels.clear()
        walk(comp, 1)
        n = sum(k.count for k in kernels.values())
        kernels.clear()
        kernels.update(saved)
        return n

    walk(entry, 1)
    return list(kernels.values())


def while_loops(text: str) -> list[tuple[str, int]]:
    """(op_name, trips) of every while loop in an HLO module, trips as audit counts them."""
    comps, _ = parse_module(text)
    out = []
    for instrs in comps.values():
        for i in instrs:
            if i.opcode == "while":
                m = re.search(r'"known_trip_count":\{"n":"(\d+)"', i.attrs)
                trips = int(m.group(1)) if m else _counted_trips(comps[i.attr("condition")])
                out.append((i.op_name, trips))
    return out


def _counted_trips(cond: list[Instr]) -> int:
    """Trips of a while loop whose condition is `counter < N` with N a constant (a scan);
    1 when it is anything else."""
    root = next((i for i in cond if i.root), None)
    consts = {i.name: i.args.strip() for i in cond if i.opcode == "constant"}
    if root is None or root.opcode != "compare" or "direction=LT" not in root.attrs:
        return 1
    for o in root.operands[1:]:
        if consts.get(o, "").isdigit():
            return int(consts[o])
    return 1


def _plain_traffic(i: Instr, shapes: dict[str, str]) -> list:
    """[(array shape, bytes)] an unfused instruction reads (each operand once) and writes;
    in-place updates and slices move only the slice."""
    if i.opcode == "dynamic-update-slice":
        update = shapes[i.operands[1]]
        return [(update, shape_bytes(update))] * 2
    if i.opcode in ("slice", "dynamic-slice"):
        return [(i.shape, shape_bytes(i.shape))] * 2
    ins = [(shapes[o], shape_bytes(shapes[o])) for o in dict.fromkeys(i.operands) if o in shapes]
    return ins + [(i.shape, shape_bytes(i.shape))]


def is_fp8(kernel: Kernel) -> bool:
    """A GEMM whose two operands are 8-bit floats (float8_e4m3fn, float8_e5m2, ...)."""
    return kernel.kind == "gemm" and all(
        t.strip().startswith("f8") for t in kernel.dtype.split("->")[0].split(" x "))


def summarize(kernels: list[Kernel], *, gemm_tflops: float, hbm_tbps: float,
              launch_us: float, fp8_gemm_tflops: float | None = None) -> dict:
    """Totals per step: launches, gemm_flops (fp8_gemm_flops of them with FP8 operands),
    other_bytes, the three times in seconds and the estimate (their sum). FP8 GEMMs run at
    `fp8_gemm_tflops` (None: twice gemm_tflops, the ratio of Hopper's dense peaks)."""
    launches = sum(k.count for k in kernels)
    flops = sum(k.count * k.flops for k in kernels if k.kind == "gemm")
    fp8_flops = sum(k.count * k.flops for k in kernels if is_fp8(k))
    fp8_rate = fp8_gemm_tflops or 2 * gemm_tflops
    nbytes = sum(k.count * k.bytes for k in kernels if k.kind != "gemm")
    out = dict(launches=launches, gemm_flops=flops, fp8_gemm_flops=fp8_flops,
               other_bytes=nbytes,
               gemm_s=(flops - fp8_flops) / (gemm_tflops * 1e12) + fp8_flops / (fp8_rate * 1e12),
               bytes_s=nbytes / (hbm_tbps * 1e12), launch_s=launches * launch_us * 1e-6)
    out["estimate_s"] = out["gemm_s"] + out["bytes_s"] + out["launch_s"]
    return out


def cost_analysis(compiled) -> tuple[dict, str] | None:
    """(XLA's own cost analysis {flops, bytes}, where from), or None. The GPU compile target
    gives none, so there the host's HloCostAnalysis reads the optimized GPU module (through
    jax's private xla_client; custom calls such as the Pallas kernels count nothing in it)."""
    try:
        cost = compiled.cost_analysis()
        source = "compiled.cost_analysis()"
        if isinstance(cost, (list, tuple)):
            cost = cost[0] if cost else None
        if not cost:
            import jax
            from jax._src.lib import xla_client

            module = compiled.runtime_executable().hlo_modules()[0]
            cost = xla_client._xla.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
            source = ("the host's HloCostAnalysis on the optimized module; loop bodies "
                      "counted once")
    except Exception:  # noqa: BLE001 - private or missing on some backends and versions
        return None
    if not cost or "flops" not in cost:
        return None
    return {"flops": cost.get("flops", 0.0), "bytes": cost.get("bytes accessed", 0.0)}, source


def report(kernels: list[Kernel], totals: dict, *, launch_us: float, top: int = 15) -> list[str]:
    """The printed sections, the estimate last."""
    lines = [f"launches: {totals['launches']:,} per step"]
    by_op = collections.Counter()
    for k in kernels:
        by_op[k.kind if k.kind in ("gemm", "other") else "custom"] += k.count
    lines.append(f"  {by_op['gemm']:,} GEMM, {by_op['custom']:,} other custom calls and custom "
                 f"fusions, {by_op['other']:,} other")
    lines.append("launches by phase:")
    phases = collections.defaultdict(lambda: [0, 0])
    for k in kernels:
        phases[k.phase][0] += k.count
        if k.kind != "gemm":
            phases[k.phase][1] += k.count * k.bytes
    for ph in _PHASES:
        lines.append(f"  {ph}: {phases.get(ph, (0, 0))[0]:,}")

    lines.append("custom calls and custom fusions by kind:")
    kinds = collections.defaultdict(lambda: [0, 0])
    for k in kernels:
        if k.opcode == "custom-call" or (k.kind not in ("gemm", "other")):
            kinds[k.kind][0] += k.count
            kinds[k.kind][1] += k.count * k.bytes
    gemm_kinds = collections.Counter()
    for k in kernels:
        if k.kind == "gemm":
            gemm_kinds[k.impl] += k.count
    for kind, n in gemm_kinds.most_common():
        lines.append(f"  {kind}: {n:,}")
    for kind, (n, b) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {kind}: {n:,}, {b / GIB:.2f} GiB")
    if not kinds and not gemm_kinds:
        lines.append("  none")

    lines.append("GEMMs by dtype (launches, TFLOP):")
    dts = collections.defaultdict(lambda: [0, 0])
    for k in kernels:
        if k.kind == "gemm":
            dts[k.dtype][0] += k.count
            dts[k.dtype][1] += k.count * k.flops
    for dt, (n, f) in sorted(dts.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {dt}: {n:,}, {f / 1e12:.3f} TFLOP")
    fp8 = (f" ({totals['fp8_gemm_flops'] / 1e12:.3f} of them FP8)"
           if totals.get("fp8_gemm_flops") else "")
    lines.append(f"  total: {totals['gemm_flops'] / 1e12:.3f} TFLOP{fp8} -> "
                 f"{totals['gemm_s'] * 1e3:.1f} ms")

    lines.append("other kernels' bytes by phase (operands + outputs):")
    for ph in _PHASES:
        b = phases.get(ph, (0, 0))[1]
        lines.append(f"  {ph}: {b / GIB:.2f} GiB")
    lines.append(f"  total: {totals['other_bytes'] / GIB:.2f} GiB -> "
                 f"{totals['bytes_s'] * 1e3:.1f} ms")

    lines.append(f"largest other kernels (top {top} by bytes per step):")
    others = sorted((k for k in kernels if k.kind != "gemm"), key=lambda k: -k.count * k.bytes)
    for k in others[:top]:
        where = re.sub(r"^jit\([^)]*\)/", "", k.op_name)
        lines.append(f"  {k.count * k.bytes / GIB:7.2f} GiB  x{k.count:<3} {k.phase:9} "
                     f"{k.name} {_short(k.shape)}  {where}")
    lines.append(f"largest other kernel groups (top {top}; layers merged, layer_N -> layer_*):")
    groups = collections.defaultdict(lambda: [0, 0])
    for k in kernels:
        if k.kind != "gemm":
            where = re.sub(r"layer_\d+", "layer_*", re.sub(r"^jit\([^)]*\)/", "", k.op_name))
            key = (k.phase, re.sub(r"\.\d+$", "", k.name), where)
            groups[key][0] += k.count
            groups[key][1] += k.count * k.bytes
    for (ph, name, where), (n, b) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"  {b / GIB:7.2f} GiB  x{n:<3} {ph:9} {name}  {where}")
    lines.append(f"launches: {totals['launches']:,} x {launch_us:g} "
                 f"us -> {totals['launch_s'] * 1e3:.1f} ms")
    lines.append(f"estimate: {totals['estimate_s'] * 1e3:.1f} ms "
                 f"(GEMM {totals['gemm_s'] * 1e3:.1f} + bytes {totals['bytes_s'] * 1e3:.1f} "
                 f"+ launches {totals['launch_s'] * 1e3:.1f}, no overlap)")
    return lines


def _short(shape: str) -> str:
    return shape if len(shape) <= 60 else shape[:57] + "..."


def tpu_lines(config, compiled, text: str, mcfg, devices, preds: int, kernels: list) -> list:
    """benchmarks/tpu_roofline.py's lines for the step compiled for a TPU slice on the
    config's mesh (per device)."""
    from bert_jax import sharding as sharding_lib
    from benchmarks import tpu_roofline

    mesh = dict(zip(sharding_lib.MESH_AXES, sharding_lib.mesh_shape(config.mesh, len(devices))))
    local = FLAGS.batch // (mesh["data"] * mesh["fsdp"])

    def recompile(unroll: int):
        again = config.copy_and_resolve_references()
        with again.unlocked():
            del again.model["scan_unroll"]  # the configs' "auto" is a str: a new int field
            again.model.scan_unroll = unroll
        return compiled_step.compile_step(again, FLAGS.batch, FLAGS.seq, preds, devices,
                                          dropout=FLAGS.dropout, config_mesh=True)[0]

    return ([f"mesh: {mesh} over {len(devices)} devices; {local} sequences per device"]
            + tpu_roofline.report(compiled, mcfg, devices, local, FLAGS.seq, kernels,
                                  recompile, while_loops(text)))


def main(argv):
    del argv
    config, devices, preds = compiled_step.from_flags(FLAGS)
    compiled, mcfg, compile_s = compiled_step.compile_step(
        config, FLAGS.batch, FLAGS.seq, preds, devices, dropout=FLAGS.dropout,
        config_mesh=compiled_step.parse_target(FLAGS.target)[0] == "tpu")
    print(compiled_step.describe(mcfg, compiled_step.attention_path(mcfg, devices,
                                                                     dropout=FLAGS.dropout),
                                 devices))
    print(f"step: batch {FLAGS.batch} x {FLAGS.seq}, {preds} MLM slots, dropout "
          f"{'on' if FLAGS.dropout else 'off'}; compiled for {devices[0].device_kind}")
    print(f"compile: {compile_s:.1f} s")
    text = compiled.as_text()
    if FLAGS.dump_hlo:
        with open(FLAGS.dump_hlo, "w", encoding="utf-8") as f:
            f.write(text)
    kernels = audit(text)
    if compiled_step.parse_target(FLAGS.target)[0] == "tpu":
        for line in tpu_lines(config, compiled, text, mcfg, devices, preds, kernels):
            print(line)
        return
    cost = cost_analysis(compiled)
    if cost:
        (cost, source) = cost
        print(f"XLA cost analysis: {cost['flops'] / 1e12:.3f} TFLOP, "
              f"{cost['bytes'] / 2**30:.1f} GiB accessed ({source})")
    else:
        print("XLA cost analysis: not available for this target")
    totals = summarize(kernels, gemm_tflops=FLAGS.gemm_tflops, hbm_tbps=FLAGS.hbm_tbps,
                       launch_us=FLAGS.launch_us, fp8_gemm_tflops=FLAGS.fp8_gemm_tflops)
    if FLAGS.json:
        with open(FLAGS.json, "w", encoding="utf-8") as f:
            json.dump(totals, f, indent=1)
    for line in report(kernels, totals, launch_us=FLAGS.launch_us, top=FLAGS.top):
        print(line)


if __name__ == "__main__":
    compiled_step.define_step_flags()
    flags.DEFINE_float("gemm_tflops", 600.0, "GEMM throughput of the estimate, TFLOP/s.")
    flags.DEFINE_float("fp8_gemm_tflops", None, "Throughput of GEMMs with FP8 operands "
                       "(model.fp8), TFLOP/s; default twice --gemm_tflops.")
    flags.DEFINE_float("hbm_tbps", 3.0, "Memory bandwidth of the estimate, TB/s.")
    flags.DEFINE_float("launch_us", 4.0, "Cost of one kernel launch in the estimate, us.")
    flags.DEFINE_integer("top", 15, "How many of the largest other kernels to list.")
    flags.DEFINE_string("dump_hlo", None, "Write the optimized HLO text to this file.")
    flags.DEFINE_string("json", None, "Write the totals to this JSON file.")
    app.run(main)
