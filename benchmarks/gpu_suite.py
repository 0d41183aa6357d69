r"""One command for a GPU session: bert_jax's pre-training step against Hugging Face
PyTorch's on the same card, plus a profile of our step, in one report.

    # on the stock GPU image (jax CUDA, flax, optax, orbax, torch CUDA, transformers, no
    # TensorFlow); ml_collections comes as a wheel carried in .whl/:
    pip install --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
    python benchmarks/gpu_suite.py                 # writes under $OUT, else /tmp/gpu_suite
    python benchmarks/gpu_suite.py --smoke --out=/tmp/smoke   # CPU, tiny sizes, < 2 min

Flags: --out=DIR, --steps=20 (timed), --warmup=5, --cases=base128,large128,large512,
--variants='base128:attention=xla;base128:fused_qkv=true;large128:remat=none' (the XLA
attention path, one fused Q/K/V product, and BERT-Large keeping everything: 59 GiB peak
with the Pallas attention on an H100 target, so it fits in 80 GB; semicolon-separated extra
bert_jax rows; each entry is
`[case[+case...]:]key=value[,key=value]` with keys of the config's `model` section, no
case prefix = every case; --variants='' for none; the key `xla_flags` sets that row's
XLA_FLAGS instead, space-separated, e.g. 'base128:xla_flags=--xla_gpu_enable_triton_gemm=false'),
--compile_cases=large128 (torch.compile cells; '' for none), --profile_case=base128 (''
for none), --profile_steps=3, --dtype=bfloat16, --child_timeout=480 (seconds per
measurement), --deadline_s (the whole run's wall-clock budget: measurements that would
start with under a minute left are skipped, cell SKIP, so the table is always printed).

Under the device tool's 10-minute command limit, run it as back-to-back calls (the machine
stays warm for 30 s after each), each with --deadline_s=540 and one or two cases, e.g.
  --cases=base128 --compile_cases=                       (profile, variants, eager torch)
  --cases=large128 --profile_case=                       (remat=none row, torch.compile)
  --cases=large512 --profile_case= --compile_cases=
(variants apply to the cases they name, so each call keeps its own.)

Cases (all MLM + NSP, AdamW, dropout on, synthetic full-length batches, ceil(0.15 * seq)
MLM predictions per row: 20 at 128, 77 at 512, the same count for torch's labels):
  base128   configs/bert_base.py,  batch 256 x 128
  large128  configs/bert_large.py, batch 256 x 128
  large512  configs/bert_large.py, batch 32 x 512

Every measurement (and the header's version probe) runs in its own child process (this
script with a hidden --child=JSON flag, answering one JSON line), so JAX's and torch's
device memory never coexist and an out-of-memory or a crash fills one cell with its
one-line error (tagged OOM[n] / ERR[n] / TIMEOUT[n], the full line under the table) while
the suite goes on. JAX children run with XLA_PYTHON_CLIENT_MEM_FRACTION=0.95; torch
children see JAX_PLATFORMS=cpu (they read the config files only). Timing: --warmup
untimed steps, then the median of --steps steps, each followed by a device sync
(jax.block_until_ready / torch.cuda.synchronize).

Columns of the table:
  case, variant      the case and the model overrides of the row ("default": the config's).
  attention          config.model.attention -> the path the dispatch resolves it to for a
                     training step with dropout (bert_jax.models.attention_ops.resolve).
  remat              config.model.remat (what each layer keeps for the backward pass),
                     "+scan" when the layers are scanned.
  jax ms, jax seq/s  bert_jax's jitted, sharded train step (benchmarks/pretrain_step.build,
                     as benchmarks/train_step.py builds it) with model.dtype=--dtype and
                     float32 params / AdamW state: median step time and batch / step time.
  MFU                model FLOPs (bert_jax.train.metrics.model_flops_per_example: the
                     encoder, pooler, NSP and the MLM head on the predicted rows
                     only) per second over the device's bf16 peak (metrics.
                     peak_flops_per_device; on CPU a measured float32 matmul ceiling).
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
                     is faster.
Variant rows show bert_jax's cells only; their ratios use the case's torch cells.

Then the profile: --profile_steps (3) steps of the --profile_case default row, traced with
jax.profiler.trace(create_perfetto_trace=True) after its timing, and the top 15 device
kernels of that trace by total time (per step, calls per step, share of the summed kernel
time). The files under --out stay few and small: gpu_suite.txt (this report), gpu_suite.json
(header + raw rows, rewritten after each measurement so a killed run keeps what it had),
gpu_suite_children.log (each child's command and the tail of its stderr), <case>_trace.json.gz
(the perfetto trace: ui.perfetto.dev) and <case>.xplane.pb (for xprof / TensorBoard), each
copied only when under 16 MiB.

Figures compare only within one run on one card: quote the two frameworks' numbers, and
the variants', from the same report. A whole run takes several minutes on an H100 (the
torch.compile of BERT-Large is the longest cell); split it with --cases if a command's time
is limited.

--smoke runs the same code paths on CPU with tiny sizes (configs/bert_tiny.py with the
case config's scan_layers / remat, batch 4 x 32, 2 x 64 for large512; a tiny HF BertConfig
of the same sizes; torch without autocast and without fused AdamW; torch.compile only when
--compile_cases names a case; 1 warmup + 2 timed steps; about a minute on a 2-core VM);
on CPU the "kernels" of the profile are the XLA:CPU ops the host threads ran.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import gzip
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
if REPO not in sys.path:
    sys.path.insert(0, REPO)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

RESULT_PREFIX = "GPU_SUITE_RESULT "
CASES = {  # name: (config file, batch, seq)
    "base128": ("configs/bert_base.py", 256, 128),
    "large128": ("configs/bert_large.py", 256, 128),
    "large512": ("configs/bert_large.py", 32, 512),
}
SMOKE_SHAPES = {"base128": (4, 32), "large128": (4, 32), "large512": (2, 64)}
SMOKE_CONFIG = "configs/bert_tiny.py"
MAX_COPY_BYTES = 16 * 1024 * 1024 - 4096
GIB = 1024 ** 3


def preds_for(seq: int) -> int:
    """MLM predictions per row: ceil(0.15 * seq), 20 at 128 (BERT's max_predictions_per_seq
    there), 77 at 512. (train_step.py's default, round(), gives 19 at 128.)"""
    return max(1, math.ceil(0.15 * seq - 1e-9))


def one_line(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def exc_line(e: BaseException) -> str:
    return one_line(f"{type(e).__name__}: {e}")


def tf_modules() -> list:
    return sorted(m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow."))[:5]


# --------------------------------------------------------------------------------------
# Children: each prints one RESULT_PREFIX + JSON line.
# --------------------------------------------------------------------------------------

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


def case_config(spec: dict):
    """The case's config (locked as load_config leaves it), smoke-shrunk, with the
    variant's model overrides applied."""
    from bert_jax.train.config import load_config

    config = load_config(spec["config"])
    if spec.get("smoke"):
        real = config
        config = load_config(SMOKE_CONFIG)
        with config.unlocked():
            for key in ("scan_layers", "remat"):
                if key in real.model:
                    config.model[key] = real.model[key]
    with config.unlocked():
        for key, value in spec.get("overrides", {}).items():
            config.model[key] = value
    return config


def child_info(spec: dict, info: dict) -> dict:
    import importlib

    info.update(python=platform.python_version(), host=platform.node())
    for name in ("jax", "jaxlib", "flax", "optax", "orbax.checkpoint", "torch", "transformers",
                 "ml_collections", "numpy"):
        try:
            info[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as e:  # noqa: BLE001 - reported in the header
            info[name] = f"unavailable ({exc_line(e)})"
    try:
        import jax

        dev = jax.devices()[0]
        info.update(platform=dev.platform, device_kind=dev.device_kind,
                    device_count=jax.device_count())
        if dev.platform == "gpu":
            for key in ("cuda_runtime_get_version", "cuda_driver_get_version",
                        "cudnn_get_version", "cublas_get_version"):
                try:
                    from jax._src.lib import cuda_versions as cv
                    info["jax_" + key.replace("_get_version", "")] = getattr(cv, key)()
                except Exception as e:  # noqa: BLE001
                    info["jax_" + key.replace("_get_version", "")] = exc_line(e)
        from bert_jax.train import metrics

        if dev.platform != "cpu":
            info["peak_flops"], info["peak_source"] = metrics.peak_flops_per_device()
    except Exception as e:  # noqa: BLE001
        info["jax_error"] = exc_line(e)
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["torch_cudnn"] = torch.backends.cudnn.version() if torch.cuda.is_available() else None
        if torch.cuda.is_available() and not spec.get("smoke"):
            info["torch_device"] = torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001
        info["torch_error"] = exc_line(e)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                              "clocks.max.sm,power.limit", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if smi.returncode == 0:
            info["nvidia_smi"] = smi.stdout.strip().splitlines()
    except Exception:  # noqa: BLE001 - no nvidia-smi (CPU machine)
        pass
    return info


def attention_route(config, mcfg, plat: str) -> tuple:
    from bert_jax.models import attention_ops

    impl = config.model.get("attention", "auto")
    try:
        return attention_ops.resolve(impl, plat, mcfg, training=True), None
    except Exception as e:  # noqa: BLE001 - an explicit path this step cannot run
        return "error", exc_line(e)


def child_jax(spec: dict, out: dict) -> dict:
    import jax
    import numpy as np

    from bert_jax.models.config import from_config_dict
    from bert_jax.train import metrics as metrics_lib
    from pretrain_step import build, step_config

    dev = jax.devices()[0]
    out.update(device_kind=dev.device_kind, platform=dev.platform, devices=jax.device_count())
    config = step_config(case_config(spec), spec["dtype"])
    out.update(attention=config.model.get("attention", "auto"),
               remat=config.model.get("remat", "none"),
               scan_layers=bool(config.model.get("scan_layers", False)),
               dropout_rng=config.model.get("dropout_rng", "?"))
    mcfg = from_config_dict(config.model)
    out["attention_resolved"], why = attention_route(config, mcfg, dev.platform)
    if why:
        out["attention_error"] = why
    out.update(dtype=mcfg.dtype,
               model={k: getattr(mcfg, k) for k in (
                   "num_hidden_layers", "hidden_size", "num_attention_heads",
                   "intermediate_size", "vocab_size")})
    b, s, p = spec["batch"], spec["seq"], spec["preds"]
    built = build(config, b, s, p, dropout=True)
    model, state = built["model"], built["state"]
    batches, rng, compiled = built["batches"], built["rng"], built["compiled"]
    out["compile_s"] = built["compile_s"]
    try:
        mem = compiled.memory_analysis()
        out["temp_gib"] = mem.temp_size_in_bytes / GIB
        out["argument_gib"] = mem.argument_size_in_bytes / GIB
    except Exception:  # noqa: BLE001 - not every backend reports it
        pass
    m = None
    for i in range(spec["warmup"]):
        state, m = compiled(state, batches[i % 2], rng)
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
        step_s = statistics.median(times)
        flops = metrics_lib.model_flops_per_example(mcfg, s, p, nsp=model.nsp)
        peak, source = metrics_lib.peak_flops_per_device()
        perf = metrics_lib.throughput(step_s, b, s, flops, peak, jax.device_count())
        out.update(ms_per_step=1e3 * step_s, seq_per_s=perf["perf/seq_per_s"],
                   mfu=perf["perf/mfu"], step_ms=[1e3 * t for t in times],
                   flops_per_example=flops, peak_flops=peak, peak_source=source)
    if spec.get("profile_dir"):  # after the timing: a failed trace keeps the figures
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
    try:
        stats = dev.memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            out["peak_gib"] = stats["peak_bytes_in_use"] / GIB
    except Exception:  # noqa: BLE001
        pass
    out["n_params"] = int(sum(int(np.prod(x.shape))
                              for x in jax.tree_util.tree_leaves(state.params)))
    return out


def child_torch(spec: dict, out: dict) -> dict:
    import torch
    from transformers import BertConfig as HFBertConfig
    from transformers import BertForPreTraining

    config = case_config(spec)
    mc = config.model
    cuda = torch.cuda.is_available() and not spec.get("smoke")
    device = "cuda" if cuda else "cpu"
    amp_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(spec["dtype"])
    amp = cuda and amp_dtype is not None
    torch.set_float32_matmul_precision("high")
    torch.manual_seed(0)
    hf = HFBertConfig(
        vocab_size=mc.vocab_size, hidden_size=mc.hidden_size,
        num_hidden_layers=mc.num_hidden_layers, num_attention_heads=mc.num_attention_heads,
        intermediate_size=mc.intermediate_size, hidden_act=mc.get("hidden_act", "gelu"),
        hidden_dropout_prob=mc.get("hidden_dropout_prob", 0.1),
        attention_probs_dropout_prob=mc.get("attention_probs_dropout_prob", 0.1),
        max_position_embeddings=mc.max_position_embeddings,
        type_vocab_size=mc.get("type_vocab_size", 2),
        layer_norm_eps=mc.get("layer_norm_eps", 1e-12),
        initializer_range=mc.get("initializer_range", 0.02), attn_implementation="sdpa")
    model = BertForPreTraining(hf).to(device).train()
    out.update({"device": torch.cuda.get_device_name(0) if cuda else "cpu",
                "attn_implementation": model.config._attn_implementation,
                "autocast": str(amp_dtype).replace("torch.", "") if amp else "off",
                "compile": bool(spec.get("compile")),
                "n_params": sum(p.numel() for p in model.parameters())})
    opt_cfg = config.get("optimizer", {})
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(opt_cfg.get("weight_decay", 0.01))},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-4, betas=(float(opt_cfg.get("b1", 0.9)), float(opt_cfg.get("b2", 0.999))),
        eps=float(opt_cfg.get("eps", 1e-6)), fused=cuda)
    out["fused_adamw"] = cuda
    clip = float(opt_cfg.get("clip_norm", 1.0))
    params = [p for p in model.parameters() if p.requires_grad]

    b, s, p = spec["batch"], spec["seq"], spec["preds"]
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(2):  # as bert_jax.data.synthetic: [CLS] A [SEP] B [SEP], p masked slots
        ids = torch.randint(104, mc.vocab_size, (b, s), generator=g)
        mid = max(1, s // 2)
        ids[:, 0], ids[:, mid], ids[:, -1] = 101, 102, 102
        keys = torch.rand((b, s), generator=g)
        keys[:, [0, mid, s - 1]] = 2.0
        pos = keys.argsort(dim=1)[:, :p]
        labels = torch.full((b, s), -100, dtype=torch.long)
        labels.scatter_(1, pos, ids.gather(1, pos))
        ids.scatter_(1, pos, 103)
        segment = torch.zeros((b, s), dtype=torch.long)
        segment[:, mid + 1:] = 1
        batch = dict(input_ids=ids, attention_mask=torch.ones((b, s), dtype=torch.long),
                     token_type_ids=segment, labels=labels,
                     next_sentence_label=torch.randint(0, 2, (b,), generator=g))
        batches.append({k: v.to(device) for k, v in batch.items()})
    out["labels_per_row"] = int((batches[0]["labels"] != -100).sum(dim=1).float().mean())
    fwd = torch.compile(model) if spec.get("compile") else model

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step(batch):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=amp_dtype or torch.float32, enabled=amp):
            loss = fwd(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        return loss

    loss = None
    t = time.perf_counter()
    for i in range(spec["warmup"]):
        loss = step(batches[i % 2])
        sync()
        if i == 0:
            out["first_step_s"] = time.perf_counter() - t  # includes torch.compile
    times = []
    for i in range(spec["steps"]):
        t = time.perf_counter()
        loss = step(batches[i % 2])
        sync()
        times.append(time.perf_counter() - t)
    if loss is not None:
        out["loss"] = float(loss)
    if times:
        step_s = statistics.median(times)
        out.update(ms_per_step=1e3 * step_s, seq_per_s=b / step_s,
                   step_ms=[1e3 * t for t in times])
    if cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated() / GIB
    return out


def child_check(spec: dict, out: dict) -> dict:
    """The fused attention paths against the XLA reference on this device, before any
    timing: the Pallas kernel with dropout (its hash masks must be the reference's) and,
    on a GPU, cuDNN without dropout; outputs and q / k / v gradients, with padding.
    Fills out["checks"]: [{path, dtype, dropout, out_err, grad_err}] (max |diff| / max |ref|)."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models import attention_ops
    from bert_jax.models.attention_ops import backend, pallas_flash
    from bert_jax.models.attention_ops import xla as xla_attention
    from bert_jax.models.dropout import Dropout

    plat = backend.platform_name(jax.devices()[0].platform)
    b, n, h, d = (2, 32, 2, 16) if spec.get("smoke") else (4, 128, 16, 64)
    rng = jax.random.PRNGKey(0)
    lengths = jnp.array([n, n - 37 % n, 5, 0][:b])
    mask = jnp.arange(n)[None, :] < lengths[:, None]
    drop_key = jax.random.PRNGKey(11)

    def key_of(rate):  # the key Dropout derives inside flax's apply, as the model uses
        return Dropout(rate, impl="hash").apply({}, rngs={"dropout": drop_key},
                                                method="make_key")

    checks = []
    paths = [("pallas", 0.1), ("pallas", 0.0)] + ([("cudnn", 0.0)] if plat == "gpu" else [])
    for dtype in ("float32", "bfloat16"):
        q, k, v = (jax.random.normal(r, (b, n, h, d), jnp.float32).astype(dtype)
                   for r in jax.random.split(rng, 3))
        cot = jax.random.normal(jax.random.PRNGKey(3), (b, n, h, d), jnp.float32).astype(dtype)
        for path, rate in paths:
            if path == "cudnn" and dtype == "float32":
                continue

            def reference(q, k, v):
                dropout = None
                if rate:
                    dropout = lambda p: Dropout(rate, impl="hash").apply(  # noqa: E731
                        {}, p, deterministic=False, rngs={"dropout": drop_key})
                return xla_attention.attention(q, k, v, mask[:, None, :], dropout=dropout)

            def fused(q, k, v):
                if path == "cudnn":
                    return attention_ops.fused("cudnn", q, k, v, mask)
                kv_seg = mask.astype(jnp.int32)
                seeds = jax.random.bits(key_of(rate), (2,), jnp.uint32) if rate else None
                return pallas_flash.flash_attention(q, k, v, jnp.ones_like(kv_seg), kv_seg,
                                                    dropout_rate=rate, seeds=seeds)

            def with_grads(fn):
                o, vjp = jax.vjp(fn, q, k, v)
                return (o,) + vjp(cot)

            rows = mask[:, :, None, None] & (lengths[:, None, None, None] > 0)
            try:
                want = jax.jit(lambda: with_grads(reference))()
                got = jax.jit(lambda: with_grads(fused))()
                errs = []
                for g, w in zip(got, want):
                    g = jnp.where(rows, g.astype(jnp.float32), 0)  # real query rows
                    w = jnp.where(rows, w.astype(jnp.float32), 0)
                    errs.append(float(jnp.max(jnp.abs(g - w)) / jnp.maximum(jnp.max(jnp.abs(w)), 1e-30)))
                checks.append(dict(path=path, dtype=dtype, dropout=rate, out_err=errs[0],
                                   grad_err=max(errs[1:])))
            except Exception as e:  # noqa: BLE001 - reported, the suite goes on
                checks.append(dict(path=path, dtype=dtype, dropout=rate, error=exc_line(e)))
    out["checks"] = checks
    out["shape"] = [b, n, h, d]
    return out


def run_child(spec: dict) -> None:
    fn = {"info": child_info, "jax": child_jax, "torch": child_torch,
          "check": child_check}[spec["kind"]]
    result: dict = {}
    try:
        fn(spec, result)
    except BaseException as e:  # noqa: BLE001 - one line back to the parent
        traceback.print_exc()
        result["error"] = exc_line(e)
    result["tensorflow_modules"] = tf_modules()
    sys.stdout.flush()
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------
# The parent: runs the children, prints the report.
# --------------------------------------------------------------------------------------

class Report:
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


def child_env(kind: str, smoke: bool, xla_flags: str = "") -> dict:
    env = dict(os.environ)
    if xla_flags:  # a variant's XLA flags, after the suite's own (the later flag wins)
        env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS", ""), xla_flags]))
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if smoke:
        env.setdefault("JAX_PLATFORMS", "cpu")
    if kind == "jax":
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.95")
    elif kind == "torch":
        env["JAX_PLATFORMS"] = "cpu"  # torch children read the config files only
    else:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


def spawn(spec: dict, timeout: float, report: Report) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    t = time.perf_counter()
    # In this process group: whatever ends the suite's group ends the child too, so no
    # orphan keeps the device's memory.
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(spec["kind"], spec.get("smoke"),
                                                          spec.get("xla_flags", "")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        rc = None
    wall = time.perf_counter() - t
    result = None
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
    if result is None:
        if rc is None:
            result = {"error": f"timeout after {timeout:.0f} s (--child_timeout)"}
        else:
            tail = [ln for ln in stderr.splitlines() if ln.strip()]
            why = next((ln for ln in reversed(tail) if "Error" in ln or "error" in ln),
                       tail[-1] if tail else "no output")
            result = {"error": one_line(f"child exited {rc}: {why}")}
    result["wall_s"] = wall
    tail = stderr.splitlines()[-80:]
    report.log.write(f"=== {shlex.join(cmd[:3])} '{cmd[3]}'\n    rc={rc} wall={wall:.1f}s\n"
                     + "\n".join(ln[:400] for ln in tail) + "\n")
    report.log.flush()
    return result


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


def describe_jax(r: dict) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    return (f"{fmt(r.get('ms_per_step'), '.1f')} ms/step, {fmt(r.get('seq_per_s'), '.1f')} "
            f"seq/s, MFU {fmt(100 * r['mfu'] if 'mfu' in r else None, '.1f')}%, attention "
            f"{r.get('attention')}->{r.get('attention_resolved')}, remat {r.get('remat')}"
            f"{'+scan' if r.get('scan_layers') else ''}; compile {fmt(r.get('compile_s'), '.1f')}"
            f" s, temp {fmt(r.get('temp_gib'), '.2f')} GiB, peak {fmt(r.get('peak_gib'), '.2f')}"
            f" GiB, loss {fmt(r.get('loss'), '.3f')}")


def describe_torch(r: dict) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    return (f"{fmt(r.get('ms_per_step'), '.1f')} ms/step, {fmt(r.get('seq_per_s'), '.1f')} "
            f"seq/s ({r.get('attn_implementation')}, autocast {r.get('autocast')}, fused "
            f"AdamW {r.get('fused_adamw')}); first step {fmt(r.get('first_step_s'), '.1f')} s, "
            f"peak {fmt(r.get('peak_gib'), '.2f')} GiB, loss {fmt(r.get('loss'), '.3f')}")


def ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or not a.get("seq_per_s") or not b.get("seq_per_s"):
        return "-"
    return f"{a['seq_per_s'] / b['seq_per_s']:.2f}x"


def render_table(rows: list, cases: list) -> tuple[list, list]:
    notes = Notes()
    head = ["case", "variant", "attention", "remat", "jax ms", "jax seq/s", "MFU",
            "torch ms", "torch seq/s", "compile seq/s", "jax/eager", "jax/compile"]
    body = []
    for case in cases:
        eager = next((r for r in rows if r["case"] == case and r["kind"] == "torch_eager"), None)
        comp = next((r for r in rows if r["case"] == case and r["kind"] == "torch_compile"), None)
        first = True
        for r in (r for r in rows if r["case"] == case and r["kind"] == "bert_jax"):
            tag = notes.cell(r, f"{case} bert_jax {r['variant']}")
            cells = [case, r["variant"],
                     f"{r.get('attention', '?')}->{r.get('attention_resolved', '?')}",
                     f"{r.get('remat', '?')}{'+scan' if r.get('scan_layers') else ''}"]
            if tag:
                cells += [tag, "-", "-"]
            else:
                cells += [fmt(r.get("ms_per_step"), ".1f"), fmt(r.get("seq_per_s"), ".1f"),
                          fmt(100 * r["mfu"] if "mfu" in r else None, ".1f") + "%"]
            if first:
                etag = notes.cell(eager, f"{case} torch eager")
                cells += ([etag, "-"] if etag else
                          [fmt((eager or {}).get("ms_per_step"), ".1f"),
                           fmt((eager or {}).get("seq_per_s"), ".1f")])
                ctag = notes.cell(comp, f"{case} torch.compile")
                cells.append(ctag or (fmt(comp.get("seq_per_s"), ".1f") if comp else "n/a"))
            else:
                cells += ["", "", ""]
            cells += [ratio(r, eager), ratio(r, comp)]
            body.append(cells)
            first = False
    widths = [max(len(str(row[i])) for row in [head] + body) for i in range(len(head))]
    right = set(range(4, len(head)))

    def line(row):
        return "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()
    out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in body]
    return out, [f"[{i + 1}] {t}" for i, t in enumerate(notes.items)]


# -- profile ---------------------------------------------------------------------------

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
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e.get("pid")] = str(e.get("args", {}).get("name", ""))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name", ""))
    complete = [e for e in events if e.get("ph") == "X" and e.get("dur") is not None]
    device_pids = {pid for pid, name in procs.items() if name.startswith("/device:")}
    chosen, source = [], ""
    if device_pids:
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
        used = sorted({threads.get(k, str(k)) for k in keys})
    else:
        chosen = [e for e in complete if isinstance(e.get("args"), dict)
                  and "hlo_op" in e["args"]]
        source = "host threads' XLA ops (no device in the trace: CPU run)"
        used = sorted({threads.get((e.get("pid"), e.get("tid")), "?") for e in chosen})
    totals: dict = {}
    for e in chosen:
        name = str(e.get("name", "?"))
        t = totals.setdefault(name, [0.0, 0])
        t[0] += float(e["dur"])
        t[1] += 1
    busy_us = sum(t[0] for t in totals.values())
    top = sorted(totals.items(), key=lambda kv: -kv[1][0])[:n]
    kinds: dict = {}
    for name, (us, calls) in totals.items():
        k = kinds.setdefault(kernel_kind(name), [0.0, 0])
        k[0] += us
        k[1] += calls
    return {"source": source, "lines": used[:12], "events": len(chosen),
            "device_ms_per_step": busy_us / 1e3 / max(steps, 1),
            "kinds": [{"kind": kind, "ms_per_step": us / 1e3 / max(steps, 1),
                       "calls_per_step": calls / max(steps, 1),
                       "pct": 100 * us / busy_us if busy_us else 0.0}
                      for kind, (us, calls) in sorted(kinds.items(), key=lambda kv: -kv[1][0])],
            "kernels": [{"name": k, "ms_per_step": v[0] / 1e3 / max(steps, 1),
                         "calls_per_step": v[1] / max(steps, 1),
                         "pct": 100 * v[0] / busy_us if busy_us else 0.0} for k, v in top]}


def profile_section(report: Report, case: str, r: dict | None) -> bool:
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
    trace, keep = found[-1], False
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
    step = r.get("ms_per_step")
    report.print(f"kernels from: {k['source']}; lines: {', '.join(k['lines'])}")
    report.print(f"summed kernel time {k['device_ms_per_step']:.2f} ms per step"
                 + (f" (timed step: {step:.2f} ms)" if step else ""))
    report.print("by kind: " + "; ".join(
        f"{x['kind']} {x['ms_per_step']:.2f} ms ({x['calls_per_step']:.0f} calls, "
        f"{x['pct']:.0f}%)" for x in k["kinds"]))
    report.print(f"{'#':>2}  {'kernel':<80}  {'ms/step':>8}  {'calls/step':>10}  {'%':>5}")
    for i, x in enumerate(k["kernels"]):
        name = x["name"] if len(x["name"]) <= 80 else x["name"][:77] + "..."
        report.print(f"{i + 1:>2}  {name:<80}  {x['ms_per_step']:>8.3f}  "
                     f"{x['calls_per_step']:>10.1f}  {x['pct']:>5.1f}")
    return keep


def header(report: Report, info: dict, args, argv: list) -> None:
    report.data["header"] = dict(info, argv=argv, steps=args.steps, warmup=args.warmup,
                                 dtype=args.dtype, smoke=args.smoke,
                                 date=datetime.datetime.now().isoformat(timespec="seconds"))
    report.print("== bert_jax GPU suite" + (" (--smoke: CPU, tiny sizes)" if args.smoke else "")
                 + " ==")
    report.print("command: " + shlex.join(["python", sys.argv[0]] + argv))
    report.print(f"date: {report.data['header']['date']}; host {info.get('host')}; "
                 f"python {info.get('python')}")
    if "jax_error" in info:
        report.print(f"jax device probe failed: {info['jax_error']}")
    report.print(f"device: {info.get('device_count', '?')} x {info.get('device_kind', '?')} "
                 f"({info.get('platform', '?')}); torch sees: {info.get('torch_device', 'cpu')}")
    for line in info.get("nvidia_smi", []):
        report.print(f"nvidia-smi: {line}")
    report.print("versions: " + ", ".join(
        f"{k} {info.get(k)}" for k in ("jax", "jaxlib", "flax", "optax", "orbax.checkpoint",
                                        "torch", "transformers", "ml_collections", "numpy")))
    cuda = [f"{k[4:]} {v}" for k, v in info.items() if k.startswith("jax_cu")]
    report.print("CUDA: jax " + (", ".join(cuda) if cuda else "n/a") +
                 f"; torch cuda {info.get('torch_cuda')}, cudnn {info.get('torch_cudnn')}")
    if "peak_flops" in info:
        report.print(f"MFU peak: {info['peak_flops'] / 1e12:.0f} TFLOP/s ({info['peak_source']})")
    report.print(f"settings: {args.steps} timed steps (median) after {args.warmup} warmup, "
                 f"jax dtype {args.dtype} (float32 params / AdamW), MLM+NSP, dropout on; "
                 f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="report folder ($OUT, else /tmp/gpu_suite)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (20; smoke 2)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (5; smoke 1)")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--variants",
                   default="base128:attention=xla;base128:fused_qkv=true;large128:remat=none",
                   help="';'-separated [case[+case]:]key=value[,key=value] model overrides")
    p.add_argument("--compile_cases", default=None, help="torch.compile cases (large128; "
                   "smoke: none)")
    p.add_argument("--profile_case", default="base128")
    p.add_argument("--profile_steps", type=int, default=3)
    p.add_argument("--dtype", default="bfloat16", help="bert_jax compute dtype / torch autocast")
    p.add_argument("--child_timeout", type=float, default=480.0)
    p.add_argument("--deadline_s", type=float, default=None,
                   help="wall-clock budget of the whole run: later measurements are "
                        "skipped so that the table is printed in time (e.g. 540 under a "
                        "10-minute command limit)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes")
    args = p.parse_args(argv)
    if args.child:
        run_child(json.loads(args.child))
        return 0

    t0 = time.perf_counter()
    args.steps = args.steps if args.steps is not None else (2 if args.smoke else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 5)
    if args.compile_cases is None:
        args.compile_cases = "" if args.smoke else "large128"
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    if args.profile_case and args.profile_case not in CASES:
        p.error(f"unknown --profile_case {args.profile_case!r}; known: {list(CASES)}")
    compile_cases = {c.strip() for c in args.compile_cases.split(",") if c.strip()}
    variants = parse_variants(args.variants, cases)
    out_dir = args.out or os.environ.get("OUT") or "/tmp/gpu_suite"
    os.makedirs(out_dir, exist_ok=True)
    report = Report(out_dir)

    def spawn_within(spec: dict) -> dict:
        """spawn() under --deadline_s: the child's timeout is cut to the time left, and a
        measurement that would start with less than a minute left is skipped (its cell says
        so), so that a run under a command's time limit still prints its table."""
        timeout = args.child_timeout
        if args.deadline_s:
            left = args.deadline_s - (time.perf_counter() - t0) - 15
            if left < 60:
                return {"error": f"skipped: --deadline_s={args.deadline_s:g} reached",
                        "wall_s": 0.0}
            timeout = min(timeout, left)
        return spawn(spec, timeout, report)

    info = spawn_within({"kind": "info", "smoke": args.smoke})
    header(report, info, args, argv)
    report.print()
    check = spawn_within({"kind": "check", "smoke": args.smoke})
    report.data["checks"] = check
    report.print(f"== Kernel check: fused attention against the XLA path on this device, "
                 f"[batch, length, heads, head_dim] = {check.get('shape')}, padding; "
                 "max |diff| / max |reference| of the output and of the q/k/v gradients "
                 "(float32 dots may run as TF32 on a GPU) ==")
    if "error" in check:
        report.print(f"check failed: {check['error']}")
    for c in check.get("checks", []):
        figures = (f"error {c['error']}" if "error" in c else
                   f"output {c['out_err']:.2e}, gradients {c['grad_err']:.2e}")
        report.print(f"  {c['path']:<7} {c['dtype']:<9} dropout {c['dropout']:<4} {figures}")
    report.print()
    report.print("== Measurements (each in its own process) ==")
    rows = report.data["rows"]
    trace_root = tempfile.mkdtemp(prefix="gpu_suite_trace_")
    profiled = None

    def measure(kind: str, case: str, variant: str, **extra) -> dict:
        cfg, batch, seq = CASES[case]
        if args.smoke:
            batch, seq = SMOKE_SHAPES[case]
        spec = {"kind": "torch" if kind.startswith("torch") else "jax", "config": cfg,
                "batch": batch, "seq": seq, "preds": preds_for(seq), "steps": args.steps,
                "warmup": args.warmup, "dtype": args.dtype, "smoke": args.smoke,
                "overrides": {}, **extra}
        spec["overrides"] = dict(spec["overrides"])
        spec["xla_flags"] = spec["overrides"].pop("xla_flags", "")
        r = spawn_within(spec)
        r.update(case=case, kind=kind, variant=variant, batch=batch, seq=seq,
                 preds=spec["preds"], config=SMOKE_CONFIG if args.smoke else cfg,
                 overrides=spec["overrides"], xla_flags=spec["xla_flags"])
        rows.append(r)
        label = {"bert_jax": f"bert_jax ({variant})", "torch_eager": "HF torch eager",
                 "torch_compile": "HF torch.compile"}[kind]
        desc = describe_jax(r) if kind == "bert_jax" else describe_torch(r)
        report.print(f"[{time.perf_counter() - t0:6.1f} s] {case:<8} {label}: {desc} "
                     f"(child {r['wall_s']:.0f} s)")
        return r

    for case in cases:
        prof = {}
        if case == args.profile_case:
            prof = {"profile_dir": os.path.join(trace_root, case),
                    "profile_steps": args.profile_steps}
        r = measure("bert_jax", case, "default", **prof)
        if prof:
            profiled = r
        measure("torch_eager", case, "eager")
        for label, overrides, only in variants:
            if case in only:
                measure("bert_jax", case, label, overrides=overrides)
        if case in compile_cases:
            measure("torch_compile", case, "compile", compile=True)
    if args.profile_case and args.profile_case not in cases and args.profile_case in CASES:
        cfg, batch, seq = CASES[args.profile_case]
        if args.smoke:
            batch, seq = SMOKE_SHAPES[args.profile_case]
        profiled = spawn_within({"kind": "jax", "config": cfg, "batch": batch, "seq": seq,
                                 "preds": preds_for(seq), "steps": 0, "warmup": 2,
                                 "dtype": args.dtype, "smoke": args.smoke, "overrides": {},
                                 "profile_dir": os.path.join(trace_root, args.profile_case),
                                 "profile_steps": args.profile_steps})

    report.print()
    report.print(f"== Results: {info.get('device_kind', '?')}, median of {args.steps} steps; "
                 "seq/s = batch / step time; ratios = bert_jax seq/s / torch seq/s "
                 "(> 1: bert_jax faster) ==")
    table, notes = render_table(rows, cases)
    for line in table + notes:
        report.print(line)
    shapes = sorted({(r["case"], r["batch"], r["seq"], r["preds"], r["config"]) for r in rows})
    report.print("shapes: " + "; ".join(f"{c} = {cfg} batch {b} x {s}, {pr} MLM predictions"
                                       for c, b, s, pr, cfg in shapes))
    tf_loaded = sorted({m for r in rows + [info] for m in r.get("tensorflow_modules", [])})
    report.print(f"tensorflow modules loaded by the children: {tf_loaded or 'none'}")
    keep = bool(args.profile_case) and profile_section(report, args.profile_case, profiled)
    if not keep:
        shutil.rmtree(trace_root, ignore_errors=True)
    report.print()
    report.print(f"total {time.perf_counter() - t0:.0f} s; report, rows and child logs under "
                 f"{out_dir} (gpu_suite.txt, gpu_suite.json, gpu_suite_children.log)")
    report.log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
