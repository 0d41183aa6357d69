"""The suite's report: printed as it goes and kept under --out, few files and small ones:

  gpu_suite.txt           the report as printed.
  gpu_suite.json          header + raw rows (+ checks, profile), rewritten after each line so
                          a killed run keeps what it had.
  gpu_suite_children.log  each child's command and the tail of its stderr.
  <case>_trace.json.gz    the profiled case's perfetto trace (ui.perfetto.dev), and
  <case>.xplane.pb        its xplane (xprof / TensorBoard), each copied only when under 16 MiB.

Columns of the results table (one row per bert_jax row; a failed cell says OOM[n] / ERR[n] /
TIMEOUT[n] / SKIP[n], its one-line error is note [n] under the table):

  case, variant      the case and the model overrides of the row ("default": the config's).
  attention          config.model.attention -> the path the dispatch resolves it to for a
                     training step with dropout (bert_jax.models.kernels.attention.resolve).
  remat              config.model.remat (what each layer keeps for the backward pass),
                     "+scan" when the layers are scanned.
  jax ms, jax seq/s  bert_jax's jitted, sharded train step (benchmarks/pretrain_step.build,
                     as benchmarks/train_step.py builds it) with model.dtype=--dtype and
                     float32 params / AdamW state: median step time and sequences / step
                     time (rows / step time but for packed rows, which hold several).
  tok/s              real (non-padding) tokens a second: rows x length / step time but for
                     packed rows (metrics.input_stats of the row's batches).
  MFU                model FLOPs of the real sequences (bert_jax.train.metrics.model_flops:
                     the encoder over each sequence's own length, pooler, NSP and the MLM
                     head on the predicted positions only) per second over the device's
                     bf16 peak (metrics.peak_flops_per_device; on CPU a measured float32
                     matmul ceiling).
  1st step s         seconds from the row's child process starting (before it imports jax)
                     to the end of its first step: imports, device start, state init,
                     compile and one step, what a user waits for before the first log
                     line. Torch rows' figures (and bert_jax's init / compile split) are
                     on the "first step" lines under the table.
  torch ms, seq/s    HF transformers BertForPreTraining (same sizes, attn_implementation=
                     "sdpa", dropout on, float32 master weights under torch.autocast bf16,
                     torch.optim.AdamW(fused=True) with the config's betas / eps / weight
                     decay off biases and LayerNorms, clip_grad_norm_ 1.0 as ours), eager.
                     float32 matmuls allowed TF32 (set_float32_matmul_precision("high")).
                     HF's MLM head scores every position (labels -100 where not predicted):
                     its step does ~22% more FLOPs than ours at base128, ~9% at large128.
  compile seq/s      the same with torch.compile(model) (forward + backward compiled; the
                     fused AdamW step stays eager), only for --compile_cases.
  jax/eager, jax/compile   throughput ratios, bert_jax seq/s over torch's: > 1 = bert_jax
                     is faster. Packed cases have no torch rows (n/a).

Under the table, per case a "first step" line (every row's 1st step s; bert_jax's init and
compile seconds; torch.compile's first step alone), per packed case its rows (sequences
per row, padding, held-out rows), and a "GEMMs autotuned: <case> <variant>: n of m" line
per bert_jax row: of the m GEMM kernels in the row's optimized HLO, how many carry an
autotuned cuBLAS algorithm, Triton tiles other than XLA's untuned fallback, or a cuDNN
plan, how many take FP8 operands, and the commonest configs (gemms.py). 0 of m on a GPU
means the compile did not autotune.

Variant rows show bert_jax's cells only; their ratios use the case's torch cells. Figures
compare only within one run on one card: quote the two frameworks' numbers, and the
variants', from the same report."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys

from . import gemms
from .children import VERSIONED

TABLE_HEAD = ["case", "variant", "attention", "remat", "jax ms", "jax seq/s", "tok/s", "MFU",
              "1st step s", "torch ms", "torch seq/s", "compile seq/s", "jax/eager",
              "jax/compile"]


class Report:
    """Prints lines and keeps them, with the data, under `out_dir`."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.lines: list[str] = []
        self.data: dict = {"header": {}, "rows": [], "profile": None}
        self.log = open(os.path.join(out_dir, "gpu_suite_children.log"), "w")

    def print(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)
        self.save()

    def save(self) -> None:
        with open(os.path.join(self.out_dir, "gpu_suite.txt"), "w") as f:
            f.write("\n".join(self.lines) + "\n")
        with open(os.path.join(self.out_dir, "gpu_suite.json"), "w") as f:
            json.dump(self.data, f, indent=1, default=str)


def header(report: Report, info: dict, args, argv: list) -> None:
    """The command, date, device, versions, MFU peak and settings of the run."""
    report.data["header"] = dict(info, argv=argv, steps=args.steps, warmup=args.warmup,
                                 dtype=args.dtype, smoke=args.smoke,
                                 date=datetime.datetime.now().isoformat(timespec="seconds"))
    report.print("== bert_jax GPU suite" + (" (--smoke: CPU, tiny sizes)" if args.smoke else "")
                 + (f", part {args.part} of 2" if getattr(args, "part", None) else "") + " ==")
    report.print("command: " + shlex.join(["python", sys.argv[0]] + argv))
    report.print(f"date: {report.data['header']['date']}; host {info.get('host')}; "
                 f"python {info.get('python')}")
    if "jax_error" in info:
        report.print(f"jax device probe failed: {info['jax_error']}")
    report.print(f"device: {info.get('device_count', '?')} x {info.get('device_kind', '?')} "
                 f"({info.get('platform', '?')}); torch sees: {info.get('torch_device', 'cpu')}")
    for line in info.get("nvidia_smi", []):
        report.print(f"nvidia-smi: {line}")
    report.print("versions: " + ", ".join(f"{k} {info.get(k)}" for k in VERSIONED))
    cuda = [f"{k[4:]} {v}" for k, v in info.items() if k.startswith("jax_cu")]
    report.print("CUDA: jax " + (", ".join(cuda) if cuda else "n/a") +
                 f"; torch cuda {info.get('torch_cuda')}, cudnn {info.get('torch_cudnn')}")
    if "peak_flops" in info:
        report.print(f"MFU peak: {info['peak_flops'] / 1e12:.0f} TFLOP/s ({info['peak_source']})")
    report.print(f"settings: {args.steps} timed steps (median) after {args.warmup} warmup, "
                 f"jax dtype {args.dtype} (float32 params / AdamW), MLM+NSP, dropout on; "
                 f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")


def kernel_checks(report: Report, check: dict) -> None:
    report.data["checks"] = check
    report.print(f"== Kernel check: fused attention against the XLA path on this device, "
                 f"[batch, length, heads, head_dim] = {check.get('shape')}, padding; "
                 "max |diff| / max |reference| of the output and of the q/k/v gradients "
                 "(float32 dots may run as TF32 on a GPU); then residual_norm and gelu, "
                 "the residual + LayerNorm and GELU-backward kernels, against their XLA "
                 "expressions (every input's gradient); then cuDNN with its own dropout "
                 "(benchmarks/attention_masks.py: its masks read back; on CPU a stand-in) ==")
    if "error" in check:
        report.print(f"check failed: {check['error']}")
    for c in check.get("checks", []):
        figures = (f"error {c['error']}" if "error" in c else
                   f"output {c['out_err']:.2e}, gradients {c['grad_err']:.2e}")
        report.print(f"  {c['path']:<13} {c['dtype']:<9} dropout {c['dropout']:<4} {figures}")


def measurement(report: Report, r: dict, elapsed: float) -> None:
    """One line as a measurement ends."""
    label = {"bert_jax": f"bert_jax ({r['variant']})", "torch_eager": "HF torch eager",
             "torch_compile": "HF torch.compile"}[r["kind"]]
    desc = describe_jax(r) if r["kind"] == "bert_jax" else describe_torch(r)
    report.print(f"[{elapsed:6.1f} s] {r['case']:<8} {label}: {desc} "
                 f"(child {r['wall_s']:.0f} s)")


def results(report: Report, rows: list, cases: list, info: dict, steps: int) -> None:
    """The table, its notes, the shapes, and the TensorFlow modules the children loaded."""
    report.print(f"== Results: {info.get('device_kind', '?')}, median of {steps} steps; "
                 "seq/s = batch / step time; ratios = bert_jax seq/s / torch seq/s "
                 "(> 1: bert_jax faster) ==")
    table, notes = render_table(rows, cases)
    for line in table + notes:
        report.print(line)
    for line in first_step_lines(rows, cases) + packed_lines(rows, cases):
        report.print(line)
    for r in rows:
        if r["kind"] == "bert_jax":
            report.print(f"GEMMs autotuned: {r['case']} {r['variant']}: "
                         f"{gemms.summary(r.get('gemms'))}")
    shapes = sorted({(r["case"], r["batch"], r["seq"], r["preds"], r["config"]) for r in rows})
    report.print("shapes: " + "; ".join(f"{c} = {cfg} batch {b} x {s}, {pr} MLM predictions"
                                       for c, b, s, pr, cfg in shapes))
    tf_loaded = sorted({m for r in rows + [info] for m in r.get("tensorflow_modules", [])})
    report.print(f"tensorflow modules loaded by the children: {tf_loaded or 'none'}")


def fmt(x, spec: str, dash: str = "-") -> str:
    return dash if x is None else format(x, spec)


class Notes:
    def __init__(self):
        self.items: list[str] = []

    def cell(self, result: dict | None, where: str) -> str | None:
        """A tag for a failed result (its one-line error becomes note [n]), else None."""
        if not result or "error" not in result:
            return None
        err = result["error"]
        self.items.append(f"{where}: {err}")
        n = len(self.items)
        low = err.lower()
        if "resource_exhausted" in low or "out of memory" in low or "outofmemory" in low:
            return f"OOM[{n}]"
        if "timeout" in low:
            return f"TIMEOUT[{n}]"
        if low.startswith("skipped"):
            return f"SKIP[{n}]"
        return f"ERR[{n}]"


def layers_tag(r: dict) -> str:
    """How a row ran its layers, after its remat: '' (a Python loop), '+scan' (a rolled
    nn.scan), '+scan(unroll=0)' (stacked params, every layer unrolled) or '(unroll=k)'."""
    if not r.get("scan_layers"):
        return ""
    unroll = r.get("scan_unroll", 1)
    return "+scan" + (f"(unroll={unroll})" if unroll != 1 else "")


def describe_jax(r: dict) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    return (f"{fmt(r.get('ms_per_step'), '.1f')} ms/step, {fmt(r.get('seq_per_s'), '.1f')} "
            f"seq/s, {fmt(r.get('tokens_per_s'), ',.0f')} tok/s, MFU "
            f"{fmt(100 * r['mfu'] if 'mfu' in r else None, '.1f')}%, attention "
            f"{r.get('attention')}->{r.get('attention_resolved')}, remat {r.get('remat')}"
            f"{layers_tag(r)}; first step {fmt(r.get('first_step_s'), '.1f')} s (init "
            f"{fmt(r.get('init_s'), '.1f')} s, compile {fmt(r.get('compile_s'), '.1f')} s), "
            f"temp {fmt(r.get('temp_gib'), '.2f')} GiB, peak {fmt(r.get('peak_gib'), '.2f')}"
            f" GiB, loss {fmt(r.get('loss'), '.3f')}")


def describe_torch(r: dict) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    return (f"{fmt(r.get('ms_per_step'), '.1f')} ms/step, {fmt(r.get('seq_per_s'), '.1f')} "
            f"seq/s ({r.get('attn_implementation')}, autocast {r.get('autocast')}, fused "
            f"AdamW {r.get('fused_adamw')}); first step {fmt(r.get('first_step_s'), '.1f')} s "
            f"(the step alone {fmt(r.get('compile_step_s'), '.1f')} s), peak "
            f"{fmt(r.get('peak_gib'), '.2f')} GiB, loss {fmt(r.get('loss'), '.3f')}")


def first_step_lines(rows: list, cases: list) -> list:
    """Per case: every row's seconds from its child's start to its first step's end."""
    names = {"bert_jax": "bert_jax", "torch_eager": "HF torch eager",
             "torch_compile": "HF torch.compile"}
    out = []
    for case in cases:
        parts = []
        for r in (r for r in rows if r["case"] == case):
            name = names[r["kind"]] + (f" {r['variant']}" if r["kind"] == "bert_jax" else "")
            if r.get("first_step_s") is None:
                parts.append(f"{name} -")
            elif r["kind"] == "bert_jax":
                parts.append(f"{name} {r['first_step_s']:.1f} s (init {fmt(r.get('init_s'), '.1f')}"
                             f", compile {fmt(r.get('compile_s'), '.1f')})")
            else:
                parts.append(f"{name} {r['first_step_s']:.1f} s (the step alone "
                             f"{fmt(r.get('compile_step_s'), '.1f')})")
        if parts:
            out.append(f"first step, {case}: " + "; ".join(parts))
    return out


def packed_lines(rows: list, cases: list) -> list:
    """Per packed case: what its rows hold (from its default row)."""
    out = []
    for case in cases:
        r = next((r for r in rows if r["case"] == case and r["kind"] == "bert_jax"
                  and r.get("packed") and "sequences_per_row" in r), None)
        if r:
            out.append(f"{case}: {r['batch']} rows of {r['seq']} tokens a step, packed with up "
                       f"to {r['packed']} sequences of the held-out sample "
                       f"({r.get('heldout_rows', '?')} rows): {r['sequences_per_row']:.2f} "
                       f"sequences per row, {100 * r['padding']:.1f}% padding in the timed "
                       f"batches")
    return out


def ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or not a.get("seq_per_s") or not b.get("seq_per_s"):
        return "-"
    return f"{a['seq_per_s'] / b['seq_per_s']:.2f}x"


def render_table(rows: list, cases: list) -> tuple[list, list]:
    """The table's lines (head, rule, one per bert_jax row in case order) and its notes."""
    notes = Notes()
    body = []
    for case in cases:
        eager = next((r for r in rows if r["case"] == case and r["kind"] == "torch_eager"), None)
        comp = next((r for r in rows if r["case"] == case and r["kind"] == "torch_compile"), None)
        jax_rows = [r for r in rows if r["case"] == case and r["kind"] == "bert_jax"]
        packed = any(r.get("packed") for r in jax_rows)
        for i, r in enumerate(jax_rows):
            cells = jax_cells(r, notes)
            if packed:  # no torch rows
                cells += ["n/a", "n/a", "n/a"] if i == 0 else ["", "", ""]
            else:
                cells += torch_cells(case, eager, comp, notes) if i == 0 else ["", "", ""]
            body.append(cells + [ratio(r, eager), ratio(r, comp)])
    widths = [max(len(str(row[i])) for row in [TABLE_HEAD] + body)
              for i in range(len(TABLE_HEAD))]
    right = set(range(4, len(TABLE_HEAD)))

    def line(row):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()
    out = [line(TABLE_HEAD), line(["-" * w for w in widths])] + [line(r) for r in body]
    return out, [f"[{i + 1}] {t}" for i, t in enumerate(notes.items)]


def jax_cells(r: dict, notes: Notes) -> list:
    """case, variant, attention, remat, jax ms, jax seq/s, tok/s, MFU, 1st step s of a
    bert_jax row."""
    tag = notes.cell(r, f"{r['case']} bert_jax {r['variant']}")
    cells = [r["case"], r["variant"],
             f"{r.get('attention', '?')}->{r.get('attention_resolved', '?')}",
             f"{r.get('remat', '?')}{layers_tag(r)}"]
    if tag:
        return cells + [tag, "-", "-", "-", fmt(r.get("first_step_s"), ".1f")]
    return cells + [fmt(r.get("ms_per_step"), ".1f"), fmt(r.get("seq_per_s"), ".1f"),
                    fmt(r.get("tokens_per_s"), ".0f"),
                    fmt(100 * r["mfu"] if "mfu" in r else None, ".1f") + "%",
                    fmt(r.get("first_step_s"), ".1f")]


def torch_cells(case: str, eager: dict | None, comp: dict | None, notes: Notes) -> list:
    """torch ms, torch seq/s, compile seq/s of a case's first row."""
    etag = notes.cell(eager, f"{case} torch eager")
    cells = ([etag, "-"] if etag else
             [fmt((eager or {}).get("ms_per_step"), ".1f"),
              fmt((eager or {}).get("seq_per_s"), ".1f")])
    ctag = notes.cell(comp, f"{case} torch.compile")
    cells.append(ctag or (fmt(comp.get("seq_per_s"), ".1f") if comp else "n/a"))
    return cells
