"""The bert_jax child: the case's jitted, sharded pre-training step as
benchmarks/pretrain_step.build makes it (as benchmarks/train_step.py does) with
model.dtype = the spec's dtype and float32 params / AdamW state, on synthetic full-length
rows or, for a packed case (spec["packed"] = K), on the held-out sample's packed rows
(packed.py). Timing: `warmup` untimed steps, then the median of `steps` steps, each
followed by jax.block_until_ready. The first step's end is also timed from the child's
start (first_step_s: imports, device start, state init, compile and one step: what a user
waits for). Throughput counts the batches' real work (metrics.input_stats): sequences and
non-padding tokens a second, MFU of the real sequences' model FLOPs; on full-length rows
these are rows/s, rows x length and the usual MFU. With a profile_dir, `profile_steps`
more steps are traced afterwards (a failed trace keeps the figures). The compiled step's
GEMM kernels are counted from its optimized HLO (gemms.py): how many carry autotuned
algorithms or tiles, and how many take FP8 operands."""

from __future__ import annotations

import statistics
import time
import traceback

from . import packed
from .common import GIB, case_config, exc_line
from .gemms import gemm_census


def run(spec: dict, out: dict) -> dict:
    import jax
    import numpy as np

    from bert_jax.models.kernels.backend import platform_name
    from bert_jax.models.config import from_config_dict
    from pretrain_step import build, step_config

    dev = jax.devices()[0]
    out.update(device_kind=dev.device_kind, platform=dev.platform, devices=jax.device_count())
    config = step_config(case_config(spec), spec["dtype"])
    out.update(attention=config.model.get("attention", "auto"),  # before a bad setting raises
               remat=config.model.get("remat", "none"),
               scan_layers=bool(config.model.get("scan_layers", False)),
               dropout_rng=config.model.get("dropout_rng", "?"))
    mcfg = from_config_dict(config.model)
    describe(config, mcfg, dev.platform, out)
    out["scan_unroll"] = mcfg.unroll_for(platform_name(dev.platform))  # what "auto" ran as
    host = None
    if spec.get("packed"):
        rows = packed.heldout_rows(spec["seq"], spec["preds"], spec["packed"])
        host = packed.batches(rows, spec["batch"])
        out["heldout_rows"] = len(rows["input_ids"])
    built = build(config, spec["batch"], spec["seq"], spec["preds"], dropout=True,
                  host_batches=host)
    out["compile_s"], out["init_s"] = built["compile_s"], built["init_s"]
    try:
        mem = built["compiled"].memory_analysis()
        out["temp_gib"] = mem.temp_size_in_bytes / GIB
        out["argument_gib"] = mem.argument_size_in_bytes / GIB
    except Exception:  # noqa: BLE001 - not every backend reports it
        pass
    try:  # whether the real compile autotuned its GEMMs (gemms.py)
        out["gemms"] = gemm_census(built["compiled"].as_text())
    except Exception as e:  # noqa: BLE001 - a census that fails keeps the timing
        out["gemms"] = {"error": exc_line(e)}
    state = time_steps(built, spec, mcfg, out)
    if spec.get("profile_dir"):  # after the timing: a failed trace keeps the figures
        state = trace_steps(built, state, spec, out)
    try:
        stats = dev.memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            out["peak_gib"] = stats["peak_bytes_in_use"] / GIB
    except Exception:  # noqa: BLE001
        pass
    out["n_params"] = int(sum(int(np.prod(x.shape))
                              for x in jax.tree_util.tree_leaves(state.params)))
    return out


def describe(config, mcfg, plat: str, out: dict) -> None:
    """The attention path the row's step takes, its compute dtype and sizes."""
    out["attention_resolved"], why = attention_route(config, mcfg, plat)
    if why:
        out["attention_error"] = why
    out.update(dtype=mcfg.dtype,
               model={k: getattr(mcfg, k) for k in (
                   "num_hidden_layers", "hidden_size", "num_attention_heads",
                   "intermediate_size", "vocab_size")})


def attention_route(config, mcfg, plat: str) -> tuple:
    """The path the dispatch resolves config.model.attention to for a training step with
    dropout, and None; or "error" and why."""
    from bert_jax.models.kernels import attention as attention_ops

    impl = config.model.get("attention", "auto")
    try:
        return attention_ops.resolve(impl, plat, mcfg, training=True), None
    except Exception as e:  # noqa: BLE001 - an explicit path this step cannot run
        return "error", exc_line(e)


def time_steps(built: dict, spec: dict, mcfg, out: dict):
    """Warmup (its first step also timed from the child's start: first_step_s), then the
    timed steps; fills loss, ms_per_step, seq_per_s (real sequences), tokens_per_s (real
    tokens), rows_per_s, mfu (of the real sequences' model FLOPs), step_ms, the batches'
    padding and sequences per row, and the FLOPs figures. Returns the state after them."""
    import jax

    from bert_jax.train import metrics as metrics_lib

    state, batches, rng, compiled = (built["state"], built["batches"], built["rng"],
                                     built["compiled"])
    m = None
    for i in range(spec["warmup"]):
        state, m = compiled(state, batches[i % 2], rng)
        if i == 0:
            jax.block_until_ready((state, m))
            if "t0" in spec:
                out["first_step_s"] = time.perf_counter() - spec["t0"]
    jax.block_until_ready(state)
    times = []
    for i in range(spec["steps"]):
        t = time.perf_counter()
        state, m = compiled(state, batches[i % 2], rng)
        jax.block_until_ready((state, m))
        times.append(time.perf_counter() - t)
    if m is not None:
        out["loss"] = float(m["train/loss"])
    if times:
        b, s, p = spec["batch"], spec["seq"], spec["preds"]
        step_s = statistics.median(times)
        flops = metrics_lib.model_flops_per_example(mcfg, s, p, nsp=built["model"].nsp)
        peak, source = metrics_lib.peak_flops_per_device()
        # The timed steps alternate the two batches: their mean is the work of a step.
        work = [packed.stats(jax.device_get(x)) for x in batches]
        mean = {k: sum(w[k] for w in work) / len(work) for k in work[0]}
        real = metrics_lib.real_token_metrics(
            mean, rows=b, seq_len=s, config=mcfg, nsp=built["model"].nsp, step_time=step_s,
            peak_per_device=peak, num_devices=jax.device_count())
        out.update(ms_per_step=1e3 * step_s, seq_per_s=mean["input/sequences"] / step_s,
                   rows_per_s=b / step_s, tokens_per_s=real["perf/real_tokens_per_s"],
                   mfu=real["perf/real_mfu"], padding=real["data/padding_fraction"],
                   sequences_per_row=real["data/sequences_per_row"],
                   step_ms=[1e3 * t for t in times], flops_per_example=flops,
                   peak_flops=peak, peak_source=source)
    return state


def trace_steps(built: dict, state, spec: dict, out: dict):
    """`profile_steps` steps under jax.profiler.trace(create_perfetto_trace=True) into
    spec["profile_dir"]; a failure is reported as out["profile_error"]."""
    import jax

    batches, rng, compiled = built["batches"], built["rng"], built["compiled"]
    n = spec.get("profile_steps", 3)
    out.update(profile_dir=spec["profile_dir"], profile_steps=n)
    try:
        with jax.profiler.trace(spec["profile_dir"], create_perfetto_trace=True):
            for i in range(n):
                with jax.profiler.StepTraceAnnotation("train", step_num=i):
                    state, m = compiled(state, batches[i % 2], rng)
                    jax.block_until_ready((state, m))
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        out["profile_error"] = exc_line(e)
    return state
