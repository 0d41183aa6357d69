"""Global against sliding-window attention in the Pallas flash kernel: forward + backward time
and the kernel's matmul FLOPs, from the blocks each loop visits.

    python benchmarks/attention_window.py --length=8192 --window=64 --batch=2 --heads=12
    python benchmarks/attention_window.py --length=128 --window=16 --batch=1 --heads=1 --steps=1

One row per path: pallas with window 0 (global) and with --window, and with --xla the XLA
reference with the same window (it computes every score, window or not). The FLOPs column
counts the kernel's dot products over the blocks it visits (forward: QK^T and PV; dK/dV
kernel: QK^T, dO V^T, P^T dO, dS^T Q; dQ kernel: QK^T, dO V^T, dS K), so global/window is
the saving the block skipping buys. On CPU the kernel runs in Pallas' interpret mode: the
times mean little there (use small sizes); the FLOPs and visited fractions do not depend on
the device.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from bert_jax.models.kernels import attention as attention_kernels
from bert_jax.models.kernels.attention import pallas_flash, xla

_LENGTH = flags.DEFINE_integer("length", 8192, "Sequence length.")
_WINDOW = flags.DEFINE_integer("window", 64, "Sliding-window half width (|i - j| <= window).")
_BATCH = flags.DEFINE_integer("batch", 2, "Sequences.")
_HEADS = flags.DEFINE_integer("heads", 12, "Attention heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 64, "Head dimension.")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16", "float16"],
                           "Compute dtype of q, k, v.")
_RATE = flags.DEFINE_float("dropout", 0.0, "Attention-probability dropout (hash masks).")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps (after a compile + warm-up step).")
_XLA = flags.DEFINE_boolean("xla", False, "Also time the XLA reference (materialises "
                            "[batch, heads, length, length] scores).")
_BLOCKS = {name: flags.DEFINE_integer(name, None, f"Pallas {name} (default: the kernel's).")
           for name in ("block_q", "block_k", "bwd_block_q", "bwd_block_k")}


def kernel_flops(length: int, head_dim: int, window: int, blocks: dict) -> dict:
    """Per (example, head): matmul FLOPs of the forward and backward kernels over the blocks
    they visit (pallas_flash.visited_blocks), and the fraction of the forward's block grid
    it visits."""
    visited = pallas_flash.visited_blocks(length, window, **blocks)
    dots = {"fwd": 2, "dq": 3, "dkdv": 4}  # block products per visited block pair
    flops = sum(dots[k] * 2 * bq * bk * head_dim * pairs
                for k, (bq, bk, pairs, _) in visited.items())
    _, _, pairs, grid = visited["fwd"]
    return dict(flops=flops, fwd_fraction=pairs / grid)


def time_fn(fn, args, steps: int) -> float:
    """Median seconds of fn(*args) over `steps` calls after a compile + warm-up call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv):
    del argv
    b, n, h, d = _BATCH.value, _LENGTH.value, _HEADS.value, _HEAD_DIM.value
    dtype = jnp.dtype(_DTYPE.value)
    q, k, v, cot = (jax.random.normal(key, (b, n, h, d), jnp.float32).astype(dtype)
                    for key in jax.random.split(jax.random.PRNGKey(0), 4))
    mask = jnp.ones((b, n), bool)
    rate = _RATE.value
    drop_key = jax.random.PRNGKey(1) if rate else None
    blocks = {name: f.value for name, f in _BLOCKS.items() if f.value}

    def grads(attend):
        def step(q, k, v, cot):
            out, vjp = jax.vjp(attend, q, k, v)
            return (out, *vjp(cot))
        return jax.jit(step)

    def pallas(window):
        return grads(lambda q, k, v: attention_kernels.fused(
            "pallas", q, k, v, mask, dropout_rate=rate, dropout_key=drop_key,
            pallas_options=blocks, window=window))

    def reference(window):
        return grads(lambda q, k, v: xla.attention(q, k, v, mask[:, None, :], window=window))

    print(f"device {jax.devices()[0].device_kind}; batch {b}, length {n}, heads {h}, "
          f"head_dim {d}, {dtype.name}, dropout {rate}, blocks {blocks or 'default'}")
    print(f"{'path':<8} {'window':>6} {'ms fwd+bwd':>11} {'kernel GFLOP':>13} "
          f"{'fwd blocks':>11} {'TFLOP/s':>8}")
    rows = [("pallas", 0), ("pallas", _WINDOW.value)]
    if _XLA.value:
        rows.append(("xla", _WINDOW.value))
    for path, window in rows:
        fn = pallas(window) if path == "pallas" else reference(window)
        seconds = time_fn(fn, (q, k, v, cot), _STEPS.value)
        if path == "pallas":
            est = kernel_flops(n, d, window, blocks)
            gflop = est["flops"] * b * h / 1e9
            frac = f"{est['fwd_fraction']:.3f}"
        else:  # every score, window or not: 2 forward + 5 backward [n, n] x d products
            gflop, frac = 7 * 2 * n * n * d * b * h / 1e9, "1.000"
        print(f"{path:<8} {window:>6} {seconds * 1e3:>11.2f} {gflop:>13.4g} {frac:>11} "
              f"{gflop / seconds / 1e3:>8.3g}")


if __name__ == "__main__":
    app.run(main)
