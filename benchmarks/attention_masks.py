r"""What a GPU must show about cuDNN's attention dropout
(bert_jax/models/kernels/attention/cudnn.py), whose masks come from cuDNN, not from our hash:
read back, their statistics, and the output and gradients against the XLA path given the mask
cuDNN drew.

    python benchmarks/attention_masks.py   # on a GPU: a line per check; exit 1 if one fails

Reading a mask: with head_dim = length and v = the identity (v[b, j, h] = e_j), the output row
i of a head is its dropped probabilities, o[b, i, h, j] = P_ij * keep_ij / (1 - rate), so keep
is o > 0 where P > 0 (every allowed key: the scores are small). One jitted call returns the
output and the q, k, v gradients, so its forward and backward runs are the pair a training
step has (same mask); the XLA path with that mask as its dropout must then give the same
output and gradients (bfloat16 rounding apart).

Statistics, over the allowed (query, key) pairs, each bounded at 5 standard deviations of
the estimate under independent Bernoulli(rate) drops (N pairs): the drop rate; the
correlation of the drops of neighbouring heads, query rows, keys and examples (each about
N(0, 1/N) when independent); the same seed in a fresh executable gives the same mask; the
next call of one executable another one (the step counter), with a correlation bounded as
above; another seed another one.

`run_checks(attend_factory, ...)` takes the kernel as `factory(seed) -> fn(q, k, v, mask,
key)`, where `key` is the step's key (cuDNN ignores it; the CPU test's stand-in, the XLA path
with the hash dropout, draws from it), so the same code checks any kernel:
tests/models/test_cudnn_attention.py runs it on CPU against that stand-in and against broken
ones, and, marked `gpu`, against cuDNN; benchmarks/gpu/kernel_check.py reports its rows.
"""

from __future__ import annotations

import math
import sys

RATE = 0.1


def layouts(b: int, n: int):
    """{name: mask}: "padded" (<bool>[b, n], real tokens first, row lengths n, n - 37 % n,
    n // 2, ...) and "packed" (<int32>[b, n] sequence ids: three sequences then padding)."""
    import jax.numpy as jnp

    lengths = jnp.array([n, n - 37 % n, n // 2, 3 * n // 4] * b)[:b]
    padded = jnp.arange(n)[None, :] < lengths[:, None]
    cuts = jnp.array([n // 4, n // 2, 7 * n // 8])
    ids = jnp.sum(jnp.arange(n)[:, None] >= cuts[None, :], axis=1) + 1  # 1, 2, 3, 4
    packed = jnp.broadcast_to(jnp.where(ids == 4, 0, ids), (b, n)).astype(jnp.int32)
    return {"padded": padded, "packed": packed}


def allowed_pairs(mask):
    """<bool>[b, 1, n, n]: the (query, key) pairs the mask lets attend (the XLA path's)."""
    import jax.numpy as jnp

    if jnp.issubdtype(mask.dtype, jnp.integer):
        return (mask[:, :, None] == mask[:, None, :])[:, None]
    return jnp.broadcast_to(mask[:, None, None, :], (mask.shape[0], 1) + mask.shape[1:2] * 2)


def inputs(b: int, n: int, h: int, dtype="bfloat16", seed: int = 0):
    """(q, k, v, cot): q, k small normal values (scores well inside the float range, so
    every allowed probability is > 0), v the identity per head, cot normal."""
    import jax
    import jax.numpy as jnp

    r = jax.random.split(jax.random.PRNGKey(seed), 3)
    q, k = (0.5 * jax.random.normal(x, (b, n, h, n), jnp.float32) for x in r[:2])
    v = jnp.broadcast_to(jnp.eye(n)[None, :, None, :], (b, n, h, n))
    cot = jax.random.normal(r[2], (b, n, h, n), jnp.float32)
    return tuple(x.astype(dtype) for x in (q, k, v, cot))


def read(fn, qkv, cot, mask, key):
    """(keep <bool>[b, h, n, n], output, (dq, dk, dv)) of one call of fn's forward and
    backward pass together."""
    import jax

    o, grads = fn(*qkv, cot, mask, key)
    keep = jax.numpy.transpose(o, (0, 2, 1, 3)) > 0  # [b, h, q, k]
    return keep, o, grads


def with_grads(attend):
    """jit(q, k, v, cot, mask, key -> (o, (dq, dk, dv))) of attend(q, k, v, mask, key)."""
    import jax

    def fn(q, k, v, cot, mask, key):
        o, vjp = jax.vjp(lambda q, k, v: attend(q, k, v, mask, key), q, k, v)
        return o, vjp(cot)
    return jax.jit(fn)


def reference(qkv, cot, mask, keep, rate):
    """The XLA path's output and gradients with `keep` as its dropout mask."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models.kernels.attention import xla as xla_attention

    allowed = allowed_pairs(mask)[:, 0]
    scale = 1.0 / (1.0 - rate)

    def drop(p):
        return jnp.where(keep, p * jnp.asarray(scale, p.dtype), jnp.zeros((), p.dtype))

    def attend(q, k, v):
        return xla_attention.attention(q, k, v, allowed, dropout=drop if rate else None)

    def fn(qkv, cot):
        o, vjp = jax.vjp(attend, *qkv)
        return o, vjp(cot)
    return jax.jit(fn)(qkv, cot)


def rel_err(got, want, rows=None) -> float:
    """max over arrays of max |got - want| / max |want| (float32), over `rows` if given."""
    import jax.numpy as jnp

    errs = []
    for g, w in zip(got, want):
        g, w = g.astype(jnp.float32), w.astype(jnp.float32)
        if rows is not None:
            g, w = jnp.where(rows, g, 0), jnp.where(rows, w, 0)
        errs.append(float(jnp.max(jnp.abs(g - w)) / max(float(jnp.max(jnp.abs(w))), 1e-30)))
    return max(errs)


def correlation(a, b, where) -> tuple[float, int]:
    """(Pearson correlation of two drop indicators over `where`, pairs counted)."""
    import numpy as np

    a, b, where = (np.asarray(x) for x in np.broadcast_arrays(a, b, where))
    a, b = a[where].astype(np.float64), b[where].astype(np.float64)
    sa, sb = a.std(), b.std()
    if not len(a) or sa == 0 or sb == 0:
        return float("nan"), len(a)
    return float(((a - a.mean()) * (b - b.mean())).mean() / (sa * sb)), len(a)


def statistics(keep, allowed, rate: float) -> dict:
    """{name: (value, bound)} of one mask: the drop rate's distance from `rate` and the
    correlations of neighbouring heads, rows, keys and examples (5 standard deviations)."""
    import numpy as np

    keep, allowed = np.asarray(keep), np.broadcast_to(np.asarray(allowed), keep.shape)
    drop = ~keep
    n = int(allowed.sum())
    out = {"rate": (abs(float(drop[allowed].mean()) - rate),
                    5 * math.sqrt(rate * (1 - rate) / max(n, 1)))}
    shifted = {"heads": (drop[:, 1:], drop[:, :-1], allowed[:, 1:] & allowed[:, :-1]),
               "rows": (drop[:, :, 1:], drop[:, :, :-1], allowed[:, :, 1:] & allowed[:, :, :-1]),
               "keys": (drop[..., 1:], drop[..., :-1], allowed[..., 1:] & allowed[..., :-1]),
               "examples": (drop[1:], drop[:-1], allowed[1:] & allowed[:-1])}
    for name, (a, b, where) in shifted.items():
        r, pairs = correlation(a, b, where)
        out[f"corr_{name}"] = (abs(r), 5 / math.sqrt(max(pairs, 1)))
    return out


def run_checks(factory, b: int, n: int, h: int, rate: float = RATE, out_tol: float = 2e-2,
               seed: int = 11, only=None) -> list[dict]:
    """One row per mask layout: {layout, out_err, grad_err, stats, failures}: the output and
    gradients against the XLA path given the mask read back, the mask's statistics, and the
    seed / step rules (module doc). failures: one line each, empty when all hold. only: the
    layouts to check (default both)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    qkv_cot = inputs(b, n, h)
    qkv, cot = qkv_cot[:3], qkv_cot[3]
    rows = []
    for layout, mask in layouts(b, n).items():
        if only and layout not in only:
            continue
        failures = []
        allowed = np.asarray(allowed_pairs(mask))
        real = allowed.any(axis=3).transpose(0, 2, 1)[..., None]  # [b, q, 1, 1] real rows
        key = lambda i: jax.random.fold_in(jax.random.PRNGKey(seed), i)  # noqa: E731
        first = with_grads(factory(seed))
        keep, o, grads = read(first, qkv, cot, mask, key(0))
        want_o, want_grads = reference(qkv, cot, mask, keep, rate)
        out_err = rel_err([o], [want_o], real)
        grad_err = rel_err(grads, want_grads)
        if not out_err <= out_tol or not grad_err <= out_tol:
            failures.append(f"output {out_err:.2e} / gradients {grad_err:.2e} against the XLA "
                            f"path with the mask read back (tolerance {out_tol})")
        if not all(bool(jnp.all(jnp.isfinite(g))) for g in grads):
            failures.append("non-finite gradients")
        stats = statistics(keep, allowed, rate)
        failures += [f"{k} {v:.2e} > {bound:.2e}" for k, (v, bound) in stats.items()
                     if not v <= bound]
        # The next step (the same executable's next run) and a fresh executable.
        keep_next = read(first, qkv, cot, mask, key(1))[0]
        again = read(with_grads(factory(seed)), qkv, cot, mask, key(0))[0]
        other = read(with_grads(factory(seed + 1)), qkv, cot, mask, key(0))[0]
        if not np.array_equal(np.asarray(again)[np.broadcast_to(allowed, keep.shape)],
                              np.asarray(keep)[np.broadcast_to(allowed, keep.shape)]):
            failures.append("the same seed in a fresh executable drew another mask")
        for name, other_keep in (("next step", keep_next), ("another seed", other)):
            r, pairs = correlation(~np.asarray(keep), ~np.asarray(other_keep), allowed)
            stats[f"corr_{name.replace(' ', '_')}"] = (abs(r), 5 / math.sqrt(max(pairs, 1)))
            if not abs(r) <= 5 / math.sqrt(max(pairs, 1)):
                failures.append(f"{name}: drops correlated with the first mask's (r = {r:.3f})")
        rows.append(dict(layout=layout, out_err=out_err, grad_err=grad_err,
                         stats={k: v for k, (v, _) in stats.items()}, failures=failures))
    return rows


def cudnn_factory(rate: float = RATE, packed_layout: str = "bias"):
    """factory(seed) -> fn(q, k, v, mask, key) of cudnn.attention (the key is ignored)."""
    from bert_jax.models.kernels.attention import cudnn

    def factory(seed):
        return lambda q, k, v, mask, key: cudnn.attention(
            q, k, v, mask, dropout_rate=rate, seed=seed, packed_layout=packed_layout)
    return factory


def standin_factory(rate: float = RATE, broken=()):
    """factory(seed) -> fn(q, k, v, mask, key): a CPU stand-in for a kernel with its own
    dropout, the XLA path with our hash dropout drawn from (key, seed). broken: "heads" (one
    mask for every head) and / or "steps" (the key ignored), for tests that the checks fail
    such kernels."""
    import jax
    import jax.numpy as jnp

    from bert_jax.models.dropout import keep_mask
    from bert_jax.models.kernels.attention import xla as xla_attention

    def factory(seed):
        def fn(q, k, v, mask, key):
            if "steps" in broken:
                key = jax.random.PRNGKey(0)
            key = jax.random.fold_in(key, seed)
            b, n, h, _ = q.shape
            keep = keep_mask(key, (b, 1 if "heads" in broken else h, n, n), rate)

            def drop(p):
                return jnp.where(keep, p / (1 - rate), 0).astype(p.dtype)
            return xla_attention.attention(q, k, v, allowed_pairs(mask)[:, 0], dropout=drop)
        return fn
    return factory


def kernel_check_rows(small: bool = False, standin: bool = False) -> list[dict]:
    """benchmarks/gpu/kernel_check.py's rows for cuDNN's dropout: {path, dtype, dropout,
    out_err, grad_err}, or with "error" naming the first failures. standin: the same checks
    and rows with standin_factory in place of cuDNN (the suite's --smoke run on CPU: the
    rows' code runs before a GPU session does; paths "cudnn stand-in ...")."""
    b, n, h = (2, 64, 2) if small else (8, 128, 8)
    out = []
    name = "cudnn stand-in" if standin else "cudnn"
    for packed_layout in ("bias", "segments"):
        factory = standin_factory(RATE) if standin else cudnn_factory(RATE, packed_layout)
        try:
            # padded rows take the same call whatever the packed layout
            only = ("packed",) if packed_layout == "segments" else None
            rows = run_checks(factory, b, n, h, only=only)
        except Exception as e:  # noqa: BLE001 - reported, the suite goes on
            out.append(dict(path=f"{name} {packed_layout}", dtype="bfloat16", dropout=RATE,
                            error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"))
            continue
        for r in rows:
            path = name if r["layout"] == "padded" else f"{name} {packed_layout}"
            row = dict(path=path, dtype="bfloat16", dropout=RATE, out_err=r["out_err"],
                       grad_err=r["grad_err"])
            if r["failures"]:
                row["error"] = "; ".join(r["failures"])[:300]
            out.append(row)
    return out


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true",
                   help="the kernel check's smoke sizes: [2, 64, 2] instead of [8, 128, 8]")
    args = p.parse_args(argv)

    import jax

    if jax.devices()[0].platform != "gpu":
        print("needs a GPU: cuDNN's dropout is checked on the device that draws it")
        return 2
    failed = False
    for row in kernel_check_rows(small=args.small):
        failed |= "error" in row
        print(row)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
