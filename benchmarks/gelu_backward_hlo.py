r"""The FFN's bias + GELU backward pass alone, compiled for a GPU description on any machine:
kernels and bytes of XLA's fusion against the rewrites tried and the Pallas kernel
(bert_jax/models/kernels/gelu.py). No timing: it reads the compiled program, as step_hlo.py.

    PYTHONPATH=<jax-cuda12 plugin wheels> python benchmarks/gelu_backward_hlo.py \
        --gpu_target_config=benchmarks/gpu/h200.txtpb [--rows=32768 --width=3072]

Needs jax's CUDA plugin wheels of the installed jax's version (docs/accelerators.md,
"Compiling for a GPU without one"), not a GPU. Figures: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def variants(rows: int):
    import jax
    import jax.numpy as jnp

    from bert_jax.models.kernels import gelu as gelu_kernel

    def xla(p, b, g):  # what the model differentiates without the kernel
        return jax.vjp(gelu_kernel.reference, p, b)[1](g)

    def barrier(p, b, g):  # the bf16 gradient forced to memory, then summed
        h = (p.astype(jnp.float32) + b).astype(p.dtype)
        dh = jax.lax.optimization_barrier(jax.vjp(gelu_kernel.reference, h, b * 0)[1](g)[0])
        return dh, jnp.sum(dh.astype(jnp.float32), 0)

    def gemv(p, b, g):  # the bias gradient as ones . dh (bf16 in, float32 out)
        dh = xla(p, b, g)[0]
        ones = jnp.ones((rows,), dh.dtype)
        return dh, jax.lax.dot_general(ones, dh, (((0,), (0,)), ((), ())),
                                       preferred_element_type=jnp.float32)

    def reduce_precision(p, b, g):  # rounding to bf16 spelled as reduce_precision
        dh = xla(p, b, g)[0].astype(jnp.float32)
        dh = jax.lax.reduce_precision(dh, exponent_bits=8, mantissa_bits=7)
        return dh.astype(p.dtype), jnp.sum(dh, 0)

    def two_stage(p, b, g):  # the sum written as partial sums of 128 rows, then their total
        dh = xla(p, b, g)[0]
        part = jnp.sum(dh.reshape(-1, 128, dh.shape[1]).astype(jnp.float32), 1)
        return dh, jnp.sum(part, 0)

    def pallas(p, b, g):
        return gelu_kernel.gelu_backward(p, b, g)

    return dict(xla=xla, barrier=barrier, gemv=gemv, reduce_precision=reduce_precision,
                two_stage=two_stage, pallas=pallas)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu_target_config", default=None,
                   help="GPU description text proto (default: compiled_step's H100 one)")
    p.add_argument("--rows", type=int, default=32768, help="tokens (%(default)s)")
    p.add_argument("--width", type=int, default=3072, help="FFN width (%(default)s)")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from benchmarks import compiled_step, step_hlo

    target = args.gpu_target_config or compiled_step.DEFAULT_GPU_TARGET
    dev = compiled_step.gpu_target_devices(target)[0]
    sh = SingleDeviceSharding(dev)
    shapes = [jax.ShapeDtypeStruct((args.rows, args.width), jnp.bfloat16, sharding=sh),
              jax.ShapeDtypeStruct((args.width,), jnp.float32, sharding=sh),
              jax.ShapeDtypeStruct((args.rows, args.width), jnp.bfloat16, sharding=sh)]
    print(f"== bias + GELU backward, [{args.rows}, {args.width}] bf16, compiled for "
          f"{os.path.basename(target)} ({dev.device_kind}); bytes = operands + outputs of "
          "each non-GEMM kernel ==")
    for name, fn in variants(args.rows).items():
        kernels = step_hlo.audit(jax.jit(fn).trace(*shapes).lower().compile().as_text())
        total = sum(k.bytes for k in kernels) / 2 ** 20
        detail = ", ".join(f"{k.name} {k.bytes / 2 ** 20:.0f}" for k in kernels)
        print(f"{name:17s} {len(kernels)} kernels, {total:6.0f} MiB: {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
