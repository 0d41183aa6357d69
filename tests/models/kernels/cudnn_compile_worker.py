"""Subprocess body of tests/models/kernels/test_cudnn.py: compiles kernels.attention's cuDNN path
for a GPU description (argv[1], a GPU target text proto) on this CPU host, through jax's CUDA
plugin (no GPU, no cuDNN library), and prints one JSON line: per case, the cuDNN custom calls
of the optimized HLO, each as [target, mask_type, dropout_rate, seed]."""

import json
import os
import re
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3)))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

from bert_jax.models import BertForPreTraining  # noqa: E402
from bert_jax.models.kernels import attention as attention_kernels  # noqa: E402
from tests.models.helpers import tiny_config  # noqa: E402

CALL = re.compile(r'custom_call_target="(__cudnn\$fmha[A-Za-z0-9]*)".*?"mask_type":\s*"(\w+)"'
                  r'.*?"dropout_rate":\s*([0-9.e-]+).*?"seed":\s*"?(\d+)')


def cudnn_calls(compiled) -> list:
    return [[t, m, float(r), int(s)] for t, m, r, s in CALL.findall(compiled.as_text())]


def main(target_path: str) -> None:
    with open(target_path, encoding="utf-8") as f:
        topo = topologies.get_topology_desc(platform="cuda", topology_name="",
                                            target_config=f.read(), topology="1x1x1")
    mesh = Mesh(list(topo.devices), ("data",))
    spec = lambda shape, dtype: jax.ShapeDtypeStruct(  # noqa: E731
        shape, dtype, sharding=NamedSharding(mesh, P()))
    b, n, h, d = 4, 128, 4, 64
    qkv = spec((b, n, h, d), jnp.bfloat16)
    out = {}

    def attention_case(mask_dtype, rate):
        def step(q, k, v, mask, key):
            def attend(q, k, v):
                return attention_kernels.fused("cudnn", q, k, v, mask, dropout_rate=rate,
                                           dropout_key=key if rate else None, cudnn_seed=7)
            o, vjp = jax.vjp(attend, q, k, v)
            return o, vjp(o)
        return cudnn_calls(jax.jit(step).lower(
            qkv, qkv, qkv, spec((b, n), mask_dtype),
            spec((2,), jnp.uint32)).compile())

    with jax.set_mesh(mesh):
        out["padded"] = attention_case(jnp.bool_, 0.1)
        out["packed"] = attention_case(jnp.int32, 0.1)
        out["no_dropout"] = attention_case(jnp.bool_, 0.0)
        for name, extra in (("model", {}), ("scanned", dict(scan_layers=True, scan_unroll=0)),
                            ("rolled", dict(scan_layers=True, scan_unroll=1))):
            config = tiny_config(dtype="bfloat16", attention="cudnn", **extra)
            model = BertForPreTraining(config)
            params = jax.eval_shape(lambda: nn.meta.unbox(
                model.init(jax.random.PRNGKey(0), jnp.zeros((2, 16), jnp.int32))["params"]))
            params = jax.tree.map(lambda x: spec(x.shape, x.dtype), params)

            def loss(p, ids, key):
                mlm, nsp = model.apply({"params": p}, ids, jnp.ones_like(ids),
                                       deterministic=False, rngs={"dropout": key})
                return jnp.sum(mlm.astype(jnp.float32)) + jnp.sum(nsp.astype(jnp.float32))

            out[name] = cudnn_calls(jax.jit(jax.grad(loss)).lower(
                params, spec((2, 16), jnp.int32), spec((2,), jnp.uint32)).compile())
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
