"""The profile: --profile_steps steps of the --profile_case default row, traced with
jax.profiler.trace(create_perfetto_trace=True) after its timing, and the top 15 device
kernels of that trace by total time (per step, calls per step, share of the summed kernel
time), with the same time summed by kernel kind. On CPU (--smoke) the "kernels" are the
XLA:CPU ops the host threads ran."""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil

from .common import exc_line

MAX_COPY_BYTES = 16 * 1024 * 1024 - 4096  # larger trace files stay where they are

_DERIVED_LINES = {"XLA Modules", "XLA Ops", "Steps", "TensorFlow Ops", "TensorFlow Name Scope",
                  "Framework Ops", "Framework Name Scope", "Source code", "Launch Stats",
                  "XLA TraceMe", "Async XLA Ops", "SparseCore", "Host Offload Ops"}

_KINDS = (  # (kind, substrings of a lower-cased kernel name), first match wins
    ("attention", ("flash_attention", "fmha", "sdpa", "splash")),
    ("matmul", ("gemm", "xmma", "cutlass", "cublas", "nvjet", "matmul", "dot_general")),
    ("scatter / gather", ("scatter", "gather")),
    ("reduction fusion", ("input_", "reduce", "reduction")),
    ("elementwise fusion", ("loop_", "fusion", "convert", "transpose", "copy")),
    ("memcpy / memset", ("memcpy", "memset")),
)


def kernel_kind(name: str) -> str:
    """A kernel's kind for the profile's summary, from its name (XLA names fusions after
    their kind; cuBLAS / cuDNN / Pallas kernels after the library or the kernel)."""
    low = name.lower()
    return next((kind for kind, keys in _KINDS if any(k in low for k in keys)), "other")


def top_kernels(path: str, steps: int, n: int = 15) -> dict:
    """Top `n` device kernels of a perfetto / Chrome trace JSON (gzip'ed or not) by total
    time. Device kernels: complete events on the stream lines of the "/device:..."
    processes (else their XLA Ops line, else all their lines); with no device process (the
    CPU smoke run), the events of host threads that carry an XLA `hlo_op`."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        data = json.load(f)
    events = data.get("traceEvents", []) if isinstance(data, dict) else data
    chosen, source, used = kernel_events(events)
    return dict(source=source, lines=used[:12], events=len(chosen),
                **summarise(chosen, steps, n))


def kernel_events(events: list) -> tuple[list, str, list]:
    """The kernel events of a trace, where they were found, and the names of their lines."""
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e.get("pid")] = str(e.get("args", {}).get("name", ""))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
    complete = [e for e in events if e.get("ph") == "X" and e.get("dur") is not None]
    device_pids = {pid for pid, name in procs.items() if name.startswith("/device:")}
    if not device_pids:
        chosen = [e for e in complete if isinstance(e.get("args"), dict)
                  and "hlo_op" in e["args"]]
        used = sorted({threads.get((e.get("pid"), e.get("tid")), "?") for e in chosen})
        return chosen, "host threads' XLA ops (no device in the trace: CPU run)", used
    dev_threads = {k: v for k, v in threads.items() if k[0] in device_pids}
    streams = {k for k, v in dev_threads.items() if v.startswith("Stream")}
    ops = {k for k, v in dev_threads.items() if v == "XLA Ops"}
    if streams:
        keys, source = streams, "device stream lines"
    elif ops:
        keys, source = ops, "device 'XLA Ops' line (no stream lines found)"
    else:
        keys = {k for k, v in dev_threads.items() if v not in _DERIVED_LINES}
        source = "all device lines (no stream lines found)"
    chosen = [e for e in complete if (e.get("pid"), e.get("tid")) in keys
              or (not dev_threads and e.get("pid") in device_pids)]
    return chosen, source, sorted({threads.get(k, str(k)) for k in keys})


def summarise(chosen: list, steps: int, n: int) -> dict:
    """Per-step time of the kernels (device_ms_per_step), by kind, and the top `n` by name."""
    totals: dict = {}
    for e in chosen:
        t = totals.setdefault(str(e.get("name", "?")), [0.0, 0])
        t[0] += float(e["dur"])
        t[1] += 1
    kinds: dict = {}
    for name, (us, calls) in totals.items():
        k = kinds.setdefault(kernel_kind(name), [0.0, 0])
        k[0] += us
        k[1] += calls
    busy_us = sum(t[0] for t in totals.values())
    per = max(steps, 1)

    def entry(key: str, name: str, us: float, calls: int) -> dict:
        return {key: name, "ms_per_step": us / 1e3 / per, "calls_per_step": calls / per,
                "pct": 100 * us / busy_us if busy_us else 0.0}
    by_time = lambda kv: -kv[1][0]  # noqa: E731
    return {"device_ms_per_step": busy_us / 1e3 / per,
            "kinds": [entry("kind", k, *v) for k, v in sorted(kinds.items(), key=by_time)],
            "kernels": [entry("name", k, *v)
                        for k, v in sorted(totals.items(), key=by_time)[:n]]}


def profile_section(report, case: str, r: dict | None) -> bool:
    """Prints the profile; returns whether the trace folder must be kept (a file too large
    to copy under --out, or no trace found)."""
    report.print()
    report.print(f"== Profile: {case} bert_jax default, "
                 f"{(r or {}).get('profile_steps', '?')} traced steps ==")
    if not r or "error" in r or not r.get("profile_dir"):
        report.print(f"no trace: {(r or {}).get('error', 'the profiled run did not finish')}")
        return True
    pdir, steps = r["profile_dir"], r.get("profile_steps", 3)
    if r.get("profile_error"):
        report.print(f"jax.profiler.trace failed: {r['profile_error']}")
    found = sorted(glob.glob(os.path.join(pdir, "**", "perfetto_trace.json.gz"), recursive=True))
    if not found:
        report.print(f"no perfetto_trace.json.gz under {pdir}; files there: "
                     f"{sorted(glob.glob(os.path.join(pdir, '**', '*'), recursive=True))[:8]}")
        return True
    trace = found[-1]
    keep = copy_trace_files(report, case, trace)
    try:
        k = top_kernels(trace, steps)
    except Exception as e:  # noqa: BLE001 - the report goes on
        report.print(f"could not parse {trace}: {exc_line(e)}")
        return True
    report.data["profile"] = dict(k, case=case, trace=trace)
    if not k["kernels"]:
        report.print(f"no device kernels found in {trace} (looked at: {k['source']}); "
                     "open it in ui.perfetto.dev")
        return True
    print_kernels(report, k, r.get("ms_per_step"))
    return keep


def copy_trace_files(report, case: str, trace: str) -> bool:
    """Copies the trace and its xplane under --out as <case>_trace.json.gz and
    <case>.xplane.pb; returns whether one was too large to copy (left where it is)."""
    keep = False
    for src, dst in [(trace, f"{case}_trace.json.gz")] + [
            (x, f"{case}.xplane.pb") for x in sorted(glob.glob(
                os.path.join(os.path.dirname(trace), "*.xplane.pb")))[-1:]]:
        size = os.path.getsize(src)
        if size <= MAX_COPY_BYTES:
            shutil.copyfile(src, os.path.join(report.out_dir, dst))
            report.print(f"{dst}: {size / 2**20:.1f} MiB")
        else:
            keep = True
            report.print(f"{src}: {size / 2**20:.1f} MiB, too large to copy under --out "
                         "(left there)")
    return keep


def print_kernels(report, k: dict, step_ms: float | None) -> None:
    report.print(f"kernels from: {k['source']}; lines: {', '.join(k['lines'])}")
    report.print(f"summed kernel time {k['device_ms_per_step']:.2f} ms per step"
                 + (f" (timed step: {step_ms:.2f} ms)" if step_ms else ""))
    report.print("by kind: " + "; ".join(
        f"{x['kind']} {x['ms_per_step']:.2f} ms ({x['calls_per_step']:.0f} calls, "
        f"{x['pct']:.0f}%)" for x in k["kinds"]))
    report.print(f"{'#':>2}  {'kernel':<80}  {'ms/step':>8}  {'calls/step':>10}  {'%':>5}")
    for i, x in enumerate(k["kernels"]):
        name = x["name"] if len(x["name"]) <= 80 else x["name"][:77] + "..."
        report.print(f"{i + 1:>2}  {name:<80}  {x['ms_per_step']:>8.3f}  "
                     f"{x['calls_per_step']:>10.1f}  {x['pct']:>5.1f}")
