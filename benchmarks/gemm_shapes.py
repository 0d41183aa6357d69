r"""Every matrix product of one BERT-Base encoder layer's training step, XLA against
PyTorch's CPU GEMM (MKL), shape by shape and alternated in one process.

    taskset -c 0 python benchmarks/gemm_shapes.py    # pinned to CPU 0: the steadiest figures
    python benchmarks/gemm_shapes.py --threads=2

Tokens T = batch x seq (8 x 128 by default), H = 768, F = 3072, 12 heads of 64. For each
product of the forward pass, the input gradients (dX) and the weight gradients (dW), and the
six batched attention products, it prints the best of --rounds timings for one
`lax.dot_general` compiled by XLA (whatever dot backend this jaxlib picks; pass XLA flags in
XLA_FLAGS) and for the same product in torch (transposes as strided views, which MKL reads
directly), then both totals for 12 layers: the ratio of the totals is the part of the gap
between a CPU step of ours and PyTorch's that the dot kernels alone explain. Needs torch (the
test extra installs a CPU build); without it only XLA's figures are printed. Figures
measured so far: benchmarks/RESULTS.md ("Matrix products shape by shape").
"""

from __future__ import annotations

import argparse
import math
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="torch threads (XLA: taskset)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=5, help="products per timing")
    args = p.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:  # pragma: no cover - optional
        torch = None

    t, h, f, heads, length = args.batch * args.seq, 768, 3072, 12, args.seq
    bh, d = args.batch * heads, h // heads

    def dims(lc, rc, batched=False):
        return (((lc,), (rc,)), ((0,), (0,)) if batched else ((), ()))

    # name: (products per layer, lhs shape, rhs shape, dimension numbers, torch expression)
    cases = {
        "fwd  [T,H]x[H,H] qkvo": (4, (t, h), (h, h), dims(1, 0), lambda a, b: a @ b),
        "fwd  [T,H]x[H,F]": (1, (t, h), (h, f), dims(1, 0), lambda a, b: a @ b),
        "fwd  [T,F]x[F,H]": (1, (t, f), (f, h), dims(1, 0), lambda a, b: a @ b),
        "dX   [T,H]x[H,H]^T": (4, (t, h), (h, h), dims(1, 1), lambda a, b: a @ b.T),
        "dX   [T,F]x[H,F]^T": (1, (t, f), (h, f), dims(1, 1), lambda a, b: a @ b.T),
        "dX   [T,H]x[F,H]^T": (1, (t, h), (f, h), dims(1, 1), lambda a, b: a @ b.T),
        "dW   [T,H]^Tx[T,H]": (4, (t, h), (t, h), dims(0, 0), lambda a, b: a.T @ b),
        "dW   [T,H]^Tx[T,F]": (1, (t, h), (t, f), dims(0, 0), lambda a, b: a.T @ b),
        "dW   [T,F]^Tx[T,H]": (1, (t, f), (t, h), dims(0, 0), lambda a, b: a.T @ b),
        "attn QK^T": (1, (bh, length, d), (bh, length, d), dims(2, 2, True),
                      lambda a, b: a @ b.transpose(1, 2)),
        "attn PV": (1, (bh, length, length), (bh, length, d), dims(2, 1, True),
                    lambda a, b: a @ b),
        "attn dP = dO V^T": (1, (bh, length, d), (bh, length, d), dims(2, 2, True),
                             lambda a, b: a @ b.transpose(1, 2)),
        "attn dV = P^T dO": (1, (bh, length, length), (bh, length, d), dims(1, 1, True),
                             lambda a, b: a.transpose(1, 2) @ b),
        "attn dQ = dS K": (1, (bh, length, length), (bh, length, d), dims(2, 1, True),
                           lambda a, b: a @ b),
        "attn dK = dS^T Q": (1, (bh, length, length), (bh, length, d), dims(1, 1, True),
                             lambda a, b: a.transpose(1, 2) @ b),
    }
    gen = np.random.default_rng(0)
    totals = {"xla": 0.0, "torch": 0.0}
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}"
          + (f"; torch {torch.__version__}, {args.threads} thread(s)" if torch else ""))
    for name, (count, sa, sb, dn, expr) in cases.items():
        a = gen.random(sa, dtype=np.float32)
        b = gen.random(sb, dtype=np.float32)
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        fn = jax.jit(lambda x, y, dn=dn: lax.dot_general(x, y, dn))
        out = np.asarray(fn(ja, jb))
        (lc, _), _ = dn
        flops = 2 * out.size * sa[lc[0]]
        best_x = best_t = math.inf
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            np.testing.assert_allclose(out, expr(ta, tb).numpy(), rtol=1e-3, atol=1e-2,
                                       err_msg=name)
        for _ in range(args.rounds):
            s = time.perf_counter()
            for _ in range(args.reps):
                r = fn(ja, jb)
            r.block_until_ready()
            best_x = min(best_x, (time.perf_counter() - s) / args.reps)
            if torch is not None:
                s = time.perf_counter()
                for _ in range(args.reps):
                    expr(ta, tb)
                best_t = min(best_t, (time.perf_counter() - s) / args.reps)
        totals["xla"] += 12 * count * best_x
        line = (f"{name:22s} x{count}  {flops / 1e9:5.2f} GFLOP  XLA {best_x * 1e3:6.1f} ms "
                f"{flops / best_x / 1e9:4.0f} GFLOP/s")
        if torch is not None:
            totals["torch"] += 12 * count * best_t
            line += (f"  torch {best_t * 1e3:6.1f} ms {flops / best_t / 1e9:4.0f} GFLOP/s  "
                     f"XLA/torch {best_x / best_t:.2f}")
        print(line, flush=True)
    print(f"12 layers: XLA {totals['xla']:.2f} s"
          + (f", torch {totals['torch']:.2f} s, ratio {totals['xla'] / totals['torch']:.2f}"
             if torch is not None else ""))


if __name__ == "__main__":
    main()
