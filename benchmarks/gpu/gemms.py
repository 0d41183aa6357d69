"""Did the compile autotune its GEMMs? A census of the GEMM kernels in a compiled step's
optimized HLO (`compiled.as_text()`), read from their backend_config:

  cuBLAS / cuBLASLt   custom-call __cublas$gemm, __cublas$lt$matmul...: autotuned when
                      gemm_backend_config has a selected_algorithm (the autotuner's pick;
                      without autotuning cuBLAS's heuristics choose at run time).
  Triton              fusions of kind __triton_gemm (triton_gemm_config: block_m/n/k,
                      split_k, warps, stages) or __triton_nested_gemm_fusion
                      (block_level_fusion_config: output tile, warps, stages; block_k on
                      the dot inside). Every one has tiles, so autotuned means not XLA's
                      fallback when it cannot autotune: a compile for the H100 target on a
                      CPU host gives every GEMM 16x8 or 8x16 output tiles, 2 warps, 1 stage.
  cuDNN               fusions of kind __cudnn$fusion: autotuned when a plan_id was chosen.

A GEMM is FP8 when it takes FP8 operands: a cuBLASLt call whose target or shapes name an
f8 type (XLA's `__cublas$lt$matmul$f8`), or a fusion whose computation holds one (an FP8
model that XLA left in bf16 shows 0 of them).

gemm_census(text) -> {"gemms", "autotuned", "fp8", "by_backend": {backend: n}, "configs":
{"backend config": n}}; summary() is the report's one line for it."""

from __future__ import annotations

import json
import re
from collections import Counter

_CALLS = re.compile(r"calls=(%[\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_COMPUTATION = re.compile(r"^(?:ENTRY )?(%[\w.\-]+) \(")
_FP8 = re.compile(r"\bf8e\d|\$f8\b")  # f8e4m3fn[..], f8e5m2[..], __cublas$lt$matmul$f8


def _backend_config(line: str) -> dict | None:
    """The JSON object after `backend_config=` on an instruction's line, or None."""
    start = line.find("backend_config={")
    if start < 0:
        return None
    i = start + len("backend_config=")
    depth, in_str, esc = 0, False, False
    for j in range(i, len(line)):
        c = line[j]
        if in_str:
            esc = (c == "\\") and not esc
            if c == '"' and not esc:
                in_str = False
            continue
        if c == '"':
            in_str = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                try:
                    return json.loads(line[i:j + 1])
                except ValueError:
                    return None
    return None


def _computations(text: str) -> dict:
    """{computation name: its instruction lines}."""
    comps, name = {}, None
    for line in text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            name = m.group(1)
            comps[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None:
            comps[name].append(line)
    return comps


def _block_k(lines: list) -> str | None:
    """block_k of a nested Triton GEMM: the `sizes` of the dot in its computation."""
    for line in lines:
        if " dot(" in line:
            sizes = (_backend_config(line) or {}).get("sizes")
            if sizes:
                return str(sizes[0])
    return None


def _int(x, default=0) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def classify(line: str, comps: dict) -> tuple | None:
    """(backend, autotuned, config label) of a GEMM instruction's line, else None."""
    target = _TARGET.search(line)
    if target and target.group(1).startswith("__cublas"):
        cfg = (_backend_config(line) or {}).get("gemm_backend_config", {})
        backend = "cublasLt" if "$lt$" in target.group(1) else "cublas"
        algo = cfg.get("selected_algorithm")
        return backend, algo is not None, f"{backend} algorithm {algo if algo is not None else '-'}"
    if " fusion(" not in line or "kind=kCustom" not in line:
        return None
    fcfg = (_backend_config(line) or {}).get("fusion_backend_config", {})
    kind = fcfg.get("kind", "")
    if kind == "__triton_gemm":
        t = fcfg.get("triton_gemm_config", {})
        m, n, k = (_int(t.get(x)) for x in ("block_m", "block_n", "block_k"))
        warps, stages, split = (_int(t.get(x), 1) for x in ("num_warps", "num_stages",
                                                              "split_k"))
        label = f"triton {m}x{n}x{k} w{warps} s{stages}" + (f" split{split}" if split > 1 else "")
        return "triton", not _fallback(m, n, warps, stages), label
    if kind == "__triton_nested_gemm_fusion":
        b = fcfg.get("block_level_fusion_config", {})
        tiles = (b.get("output_tiles") or [{}])[0].get("sizes", [])
        mn = [_int(x) for x in tiles[-2:]] or [0, 0]
        calls = _CALLS.search(line)
        k = _block_k(comps.get(calls.group(1), [])) if calls else None
        warps, stages = _int(b.get("num_warps"), 1), _int(b.get("num_stages"), 1)
        label = f"triton {'x'.join(map(str, mn))}x{k or '?'} w{warps} s{stages}"
        return "triton", not _fallback(*(mn + [0, 0])[:2], warps, stages), label
    if kind == "__cudnn$fusion":
        plan = fcfg.get("cudnn_fusion_config", {}).get("plan_id")
        return "cudnn", plan is not None, f"cudnn plan {plan if plan is not None else '-'}"
    return None


def _fallback(m: int, n: int, warps: int, stages: int) -> bool:
    """XLA's Triton GEMM config when it could not autotune (see the module doc)."""
    return max(m, n) <= 16 and warps <= 2 and stages <= 1


def is_fp8(line: str, comps: dict) -> bool:
    """Whether a GEMM instruction's line (before its backend config) or, for a fusion, its
    computation names an FP8 type."""
    if _FP8.search(line.split("backend_config=", 1)[0]):
        return True
    calls = _CALLS.search(line)
    return bool(calls) and any(_FP8.search(x) for x in comps.get(calls.group(1), []))


def gemm_census(text: str) -> dict:
    comps = _computations(text)
    by_backend, configs, tuned, total, fp8 = Counter(), Counter(), 0, 0, 0
    for lines in comps.values():
        for line in lines:
            got = classify(line, comps)
            if got is None:
                continue
            backend, autotuned, label = got
            total += 1
            tuned += bool(autotuned)
            fp8 += is_fp8(line, comps)
            by_backend[backend] += 1
            configs[label] += 1
    return {"gemms": total, "autotuned": tuned, "fp8": fp8, "by_backend": dict(by_backend),
            "configs": dict(configs.most_common())}


def summary(census: dict | None, top: int = 4) -> str:
    """'n of m (cublas a, triton b)[; FP8 f of m]; triton 128x128x64 w8 s4 x12, ...' or
    why there is none."""
    if not census:
        return "-"
    if "error" in census:
        return f"no census ({census['error']})"
    if not census["gemms"]:
        return "0 of 0 (no GPU GEMM kernels in this compile)"
    backends = ", ".join(f"{b} {n}" for b, n in sorted(census["by_backend"].items()))
    configs = list(census["configs"].items())
    shown = ", ".join(f"{c} x{n}" for c, n in configs[:top])
    more = f", +{len(configs) - top} more" if len(configs) > top else ""
    fp8 = f"; FP8 {census['fp8']} of {census['gemms']}" if census.get("fp8") else ""
    return f"{census['autotuned']} of {census['gemms']} ({backends}){fp8}; {shown}{more}"
