"""The torch child: benchmarks/torch_reference.py's step (HF BertForPreTraining of the case's
sizes, SDPA attention, dropout on, the config's AdamW settings and clipping) on the case's
synthetic batches. On a GPU: float32 master weights under torch.autocast of the spec's
dtype, fused AdamW, float32 matmuls allowed TF32; with spec["compile"], torch.compile of the
model (forward + backward; the AdamW step stays eager). In --smoke (CPU) no autocast and no
fused AdamW. Timing: `warmup` untimed steps, then the median of `steps` steps, each followed
by torch.cuda.synchronize on a GPU. The first step's end is also timed from the child's
start (first_step_s: imports, model build, torch.compile's compile, one step) and alone
(compile_step_s: the first step, torch.compile's tracing and compiling included)."""

from __future__ import annotations

import statistics
import time

from .common import GIB, case_config


def run(spec: dict, out: dict) -> dict:
    import torch

    from torch_reference import Reference, synthetic_batches

    config = case_config(spec)
    cuda = torch.cuda.is_available() and not spec.get("smoke")
    device = "cuda" if cuda else "cpu"
    amp_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(spec["dtype"])
    autocast = amp_dtype if cuda else None
    torch.set_float32_matmul_precision("high")
    ref = Reference(config.model, config.get("optimizer", {}), device=device,
                    autocast=autocast, fused=cuda, compile=bool(spec.get("compile")))
    out.update({"device": torch.cuda.get_device_name(0) if cuda else "cpu",
                "attn_implementation": ref.model.config._attn_implementation,
                "autocast": str(autocast).replace("torch.", "") if autocast else "off",
                "compile": bool(spec.get("compile")), "n_params": ref.n_params(),
                "fused_adamw": cuda})
    batches = synthetic_batches(spec["batch"], spec["seq"], spec["preds"],
                                config.model.vocab_size, device=device)
    out["labels_per_row"] = int((batches[0]["labels"] != -100).sum(dim=1).float().mean())
    time_steps(ref, batches, spec, out, sync=torch.cuda.synchronize if cuda else None)
    if cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated() / GIB
    return out


def time_steps(ref, batches: list, spec: dict, out: dict, sync=None) -> None:
    """Warmup (the first step, torch.compile included, timed alone as compile_step_s and
    from the child's start as first_step_s), then the timed steps: fills loss,
    ms_per_step, seq_per_s, tokens_per_s (full-length rows: all real) and step_ms."""
    def step(i):
        loss = ref.step(batches[i % 2])
        if sync:
            sync()
        return loss

    loss = None
    t = time.perf_counter()
    for i in range(spec["warmup"]):
        loss = step(i)
        if i == 0:
            out["compile_step_s"] = time.perf_counter() - t
            if "t0" in spec:
                out["first_step_s"] = time.perf_counter() - spec["t0"]
    times = []
    for i in range(spec["steps"]):
        t = time.perf_counter()
        loss = step(i)
        times.append(time.perf_counter() - t)
    if loss is not None:
        out["loss"] = float(loss)
    if times:
        step_s = statistics.median(times)
        out.update(ms_per_step=1e3 * step_s, seq_per_s=spec["batch"] / step_s,
                   tokens_per_s=spec["batch"] * spec["seq"] / step_s,
                   step_ms=[1e3 * t for t in times])
