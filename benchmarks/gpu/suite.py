"""The suite: its flags, the cases and variants, and the order of the measurements.

Cases (all MLM + NSP, AdamW, dropout on, ceil(0.15 * seq) MLM predictions per sequence: 20
at 128, 77 at 512, the same count for torch's labels):
  base128    configs/bert_base.py,  batch 256 x 128, synthetic full-length rows
  large128   configs/bert_large.py, batch 256 x 128, synthetic full-length rows
  large512   configs/bert_large.py, batch 32 x 512,  synthetic full-length rows
  packed512  configs/bert_large.py, batch 32 x 512,  rows packed with up to 3 sequences of
             the held-out sample (packed.py), as data_prep --pack writes them; no torch
             rows (HF's BertForPreTraining has no packed rows)

Per case, each in its own child process (children.py): bert_jax's default row (the
--profile_case one also traced), HF torch eager (unless --eager_cases leaves the case out),
torch.compile right after it when --compile_cases names the case, then the --variants rows
that apply to the case. Before them, a version probe and the kernel check (kernel_check.py).
Under --deadline_s, a measurement that would start with under a minute left is skipped
(its cell says SKIP), so the table is always printed.

--part=1 and --part=2 split the default run into two calls of under 10 minutes each (the
estimate is in benchmarks/gpu_suite.py's docstring): part 1 the kernel check, base128 and
large128 (base128 profiled), part 2 large512 and packed512; each with its cases' torch eager
rows, torch.compile for base128 and large512 (PARTS: large128's would not fit), its
variants (PART_VARIANTS: base128 with cuDNN's own attention dropout, `attention=cudnn`,
beside the default Pallas row; then the FP8 rows) and --deadline_s=PART_DEADLINE_S unless
given. Without --part, every case, every torch.compile row and both parts' variants in one
run.

--variants is ';'-separated, each entry `[case[+case...]:]key=value[,key=value]` with keys
of the config's `model` section (no case prefix = every case; '' for none; 'extra' for
EXTRA_VARIANTS). A key that is neither in the config's model section nor a BertConfig field
fails its row with a one-line error (common.case_config): `fp8=true` runs only where
the checkout has the FP8 option. The key `xla_flags` sets that row's XLA_FLAGS instead,
space-separated, e.g. 'base128:xla_flags=--xla_gpu_enable_triton_gemm=false'. Each row
also says how many of its GEMMs the compile autotuned and how many take FP8 operands
(gemms.py).

--smoke runs the same code paths on CPU with tiny sizes: configs/bert_tiny.py with the case
config's scan_layers / scan_unroll / remat, batch 4 x 32 (2 x 64 for large512, 2 x 512
packed for packed512), a tiny HF BertConfig of the same sizes, torch without autocast and
without fused AdamW, torch.compile only when --compile_cases names a case, 1 warmup + 2
timed steps."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from . import report as report_lib
from .children import run_child, spawn
from .common import CASES, PACKED, SMOKE_CONFIG, SMOKE_SHAPES, preds_for
from .profile import profile_section

# The default run in two calls: (cases, profiled case, kernel check, torch.compile cases)
# per part. base128's cuDNN row (cuDNN's own attention dropout against the default Pallas
# kernel with the hash dropout, in the whole step) decides `auto` with the attention sweep;
# each part's FP8 rows come last, after every case's torch rows: the deadline drops them
# first.
PARTS = {1: ("base128,large128", "base128", True, "base128"),
         2: ("large512,packed512", "", False, "large512")}
PART_VARIANTS = {1: "base128:attention=cudnn;large128:fp8=true",
                 2: "large512:fp8=true;packed512:fp8=true"}
PART_DEADLINE_S = 560.0  # under a 10-minute command limit, with room for the table

# Rows measured once or left for a session with time to spare (--variants=extra), most
# informative first: XLA's residual + LayerNorm and GELU backward passes against the
# kernels that replaced them (models/kernels/residual_norm.py, gelu.py); the GEMM backend
# and the launch mechanism; cuDNN against our kernel on equal terms (no attention dropout:
# cuDNN has none); the rolled layer loop the unrolled default replaced (scan_unroll=1) and
# unscanned layers, then the older rows and one Pallas tiling.
EXTRA_VARIANTS = ";".join([
    "base128:residual_norm=xla",
    "base128:gelu_backward=xla",
    "large128:gelu_backward=xla",
    "base128:xla_flags=--xla_gpu_enable_triton_gemm=false",
    "base128:xla_flags=--xla_gpu_enable_command_buffer=",  # the empty set: no command buffers
    "base128:attention=cudnn,attention_probs_dropout_prob=0",
    "base128:attention=pallas,attention_probs_dropout_prob=0",
    "base128+large128:scan_unroll=1",
    "large128:scan_layers=false",
    "large128:remat=none",
    "base128:attention=xla",
    "base128:pallas_block_q=64,pallas_block_k=128",
    "base128:fused_qkv=true",
])


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="report folder ($OUT, else /tmp/gpu_suite)")
    p.add_argument("--part", type=int, choices=sorted(PARTS), default=None,
                   help="one of the default run's two calls (see above); explicit flags "
                        "override its settings")
    p.add_argument("--steps", type=int, default=None, help="timed steps (20; smoke 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (5; smoke 1)")
    p.add_argument("--cases", default=None,
                   help=f"comma-separated cases (default: the part's, else all: "
                        f"{','.join(CASES)})")
    p.add_argument("--variants", default=None,
                   help="';'-separated [case[+case]:]key=value[,key=value] model overrides "
                        "(key xla_flags: the row's XLA_FLAGS); '' for none, 'extra' for "
                        f"the older rows (default: the part's FP8 rows, without --part "
                        f"both parts': {';'.join(PART_VARIANTS.values())})")
    p.add_argument("--compile_cases", default=None,
                   help="torch.compile cases (default: the part's, else every case with "
                        "torch rows; smoke: none; '' for none)")
    p.add_argument("--eager_cases", default=None,
                   help="cases with a torch eager row (default: every case with torch rows; "
                        "'' for none: a short session that has measured them before)")
    p.add_argument("--profile_case", default=None,
                   help="case whose default row is traced ('' for none; default base128, "
                        "part 2: none)")
    p.add_argument("--profile_steps", type=int, default=3, help="traced steps (%(default)s)")
    p.add_argument("--dtype", default="bfloat16",
                   help="bert_jax compute dtype / torch autocast (%(default)s)")
    p.add_argument("--child_timeout", type=float, default=480.0,
                   help="seconds per measurement (%(default)g)")
    p.add_argument("--deadline_s", type=float, default=None,
                   help="wall-clock budget of the whole run: later measurements are "
                        "skipped so that the table is printed in time (default: "
                        f"{PART_DEADLINE_S:g} with --part, else none)")
    p.add_argument("--skip_check", action="store_true",
                   help="no kernel check (about a minute on a GPU): for a session's second "
                        "and later calls, once the first has checked the kernels (part 2 "
                        "skips it)")
    p.add_argument("--skip_mask_check", action="store_true",
                   help="the kernel check without cuDNN's dropout masks (about 30 s), when "
                        "benchmarks/attention_masks.py has just checked them")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes")
    return p


def parse_value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip()


def parse_variants(text: str, cases: list) -> list:
    """'[case[+case]:]k=v[,k=v];...' -> [(label, {key: value}, set of cases)]. The key
    xla_flags (value: space-separated XLA flags) sets the child's XLA_FLAGS instead of a
    model key."""
    out = []
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        scope, only = entry, set(cases)
        head, sep, rest = entry.partition(":")
        if sep and "=" not in head:
            only = {c.strip() for c in head.split("+") if c.strip()}
            scope = rest
        overrides = {}
        for item in (i.strip() for i in scope.split(",")):
            if not item:
                continue
            key, eq, value = item.partition("=")
            if not eq:
                raise SystemExit(f"--variants: {item!r} is not key=value")
            key = key.strip()
            key = key[len("model."):] if key.startswith("model.") else key
            overrides[key] = value.strip() if key == "xla_flags" else parse_value(value)
        label = ",".join(f"{k}={v}" for k, v in overrides.items())
        out.append((label, overrides, only))
    return out


def resolve_args(p: argparse.ArgumentParser, args) -> list:
    """Fills the part- and smoke-dependent defaults and checks the case names; returns
    the cases."""
    part = PARTS.get(args.part)
    args.steps = args.steps if args.steps is not None else (2 if args.smoke else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 5)
    if args.cases is None:
        args.cases = part[0] if part else ",".join(CASES)
    if args.variants is None:
        args.variants = (PART_VARIANTS[args.part] if part
                         else ";".join(PART_VARIANTS[k] for k in sorted(PART_VARIANTS)))
    elif args.variants.strip() == "extra":
        args.variants = EXTRA_VARIANTS
    if args.profile_case is None:
        args.profile_case = part[1] if part else "base128"
    if part and not part[2]:
        args.skip_check = True
    if args.deadline_s is None and part:
        args.deadline_s = PART_DEADLINE_S
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    if args.compile_cases is None:
        args.compile_cases = ("" if args.smoke else part[3] if part
                              else ",".join(c for c in cases if c not in PACKED))
    if args.profile_case and args.profile_case not in CASES:
        p.error(f"unknown --profile_case {args.profile_case!r}; known: {list(CASES)}")
    return cases


class Suite:
    """Runs the children in order under --deadline_s and records their rows."""

    def __init__(self, args, report: report_lib.Report, t0: float):
        self.args, self.report, self.t0 = args, report, t0
        self.rows = report.data["rows"]
        self.trace_root = tempfile.mkdtemp(prefix="gpu_suite_trace_")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def spawn_within(self, spec: dict) -> dict:
        """spawn() under --deadline_s: the child's timeout is cut to the time left, and a
        measurement that would start with less than a minute left is skipped (its cell says
        so), so that a run under a command's time limit still prints its table."""
        timeout, deadline = self.args.child_timeout, self.args.deadline_s
        if deadline:
            left = deadline - self.elapsed() - 15
            if left < 60:
                return {"error": f"skipped: --deadline_s={deadline:g} reached", "wall_s": 0.0}
            timeout = min(timeout, left)
        return spawn(spec, timeout, self.report)

    def shape(self, case: str) -> tuple:
        cfg, batch, seq = CASES[case]
        return (cfg,) + (SMOKE_SHAPES[case] if self.args.smoke else (batch, seq))

    def spec(self, kind: str, case: str, **extra) -> dict:
        cfg, batch, seq = self.shape(case)
        a = self.args
        return {"kind": kind, "config": cfg, "batch": batch, "seq": seq,
                "preds": preds_for(seq), "packed": PACKED.get(case, 0), "steps": a.steps,
                "warmup": a.warmup, "dtype": a.dtype, "smoke": a.smoke, "overrides": {},
                **extra}

    def measure(self, kind: str, case: str, variant: str, **extra) -> dict:
        """One row: its child's result with the case, kind, variant and shape."""
        spec = self.spec("torch" if kind.startswith("torch") else "jax", case, **extra)
        spec["overrides"] = dict(spec["overrides"])
        spec["xla_flags"] = spec["overrides"].pop("xla_flags", "")
        r = self.spawn_within(spec)
        r.update(case=case, kind=kind, variant=variant, batch=spec["batch"], seq=spec["seq"],
                 preds=spec["preds"], packed=spec["packed"],
                 config=SMOKE_CONFIG if self.args.smoke else spec["config"],
                 overrides=spec["overrides"], xla_flags=spec["xla_flags"])
        self.rows.append(r)
        report_lib.measurement(self.report, r, self.elapsed())
        return r

    def profile_spec(self, case: str) -> dict:
        return {"profile_dir": os.path.join(self.trace_root, case),
                "profile_steps": self.args.profile_steps}

    def run_cases(self, cases: list, variants: list) -> dict | None:
        """Every case's rows: bert_jax's default, torch eager and torch.compile (not for
        packed cases), then the case's variants. Returns the profiled row's result (None
        without one)."""
        a, profiled = self.args, None
        compile_cases = {c.strip() for c in a.compile_cases.split(",") if c.strip()}
        eager_cases = (set(cases) if a.eager_cases is None
                       else {c.strip() for c in a.eager_cases.split(",") if c.strip()})
        for case in cases:
            prof = self.profile_spec(case) if case == a.profile_case else {}
            r = self.measure("bert_jax", case, "default", **prof)
            if prof:
                profiled = r
            if case not in PACKED and case in eager_cases:
                self.measure("torch_eager", case, "eager")
            if case not in PACKED and case in compile_cases:
                self.measure("torch_compile", case, "compile", compile=True)
            for label, overrides, only in variants:
                if case in only:
                    self.measure("bert_jax", case, label, overrides=overrides)
        if a.profile_case and a.profile_case not in cases and a.profile_case in CASES:
            profiled = self.spawn_within(self.spec("jax", a.profile_case, steps=0, warmup=2,
                                                   **self.profile_spec(a.profile_case)))
        return profiled


def main(argv=None, description: str = "") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = parser(description)
    args = p.parse_args(argv)
    if args.child:
        run_child(json.loads(args.child))
        return 0
    t0 = time.perf_counter()
    cases = resolve_args(p, args)
    variants = parse_variants(args.variants, cases)
    out_dir = args.out or os.environ.get("OUT") or "/tmp/gpu_suite"
    os.makedirs(out_dir, exist_ok=True)
    report = report_lib.Report(out_dir)
    suite = Suite(args, report, t0)
    info = suite.spawn_within({"kind": "info", "smoke": args.smoke})
    report_lib.header(report, info, args, argv)
    report.print()
    if args.skip_check:
        report.data["checks"] = {"skipped": True}
        report.print("== Kernel check: skipped (--skip_check) ==")
    else:
        report_lib.kernel_checks(report, suite.spawn_within(
            {"kind": "check", "smoke": args.smoke, "skip_masks": args.skip_mask_check}))
    report.print()
    report.print("== Measurements (each in its own process) ==")
    profiled = suite.run_cases(cases, variants)
    report.print()
    report_lib.results(report, suite.rows, cases, info, args.steps)
    keep = bool(args.profile_case) and profile_section(report, args.profile_case, profiled)
    if not keep:
        shutil.rmtree(suite.trace_root, ignore_errors=True)
    report.print()
    report.print(f"total {suite.elapsed():.0f} s; report, rows and child logs under "
                 f"{out_dir} (gpu_suite.txt, gpu_suite.json, gpu_suite_children.log)")
    report.log.close()
    return 0
