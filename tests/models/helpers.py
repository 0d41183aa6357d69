import json
import os
import subprocess
import sys

import flax.linen
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models import BertConfig, BertForPreTraining


def tiny_config(**kw) -> BertConfig:
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=64)
    base.update(kw)
    return BertConfig(**base)


def random_batch(config: BertConfig, batch=3, length=16, seed=0):
    rng = jax.random.PRNGKey(seed)
    ids = jax.random.randint(rng, (batch, length), 5, config.vocab_size)
    lengths = jnp.array([length, length - 5, 4])[:batch]
    mask = (jnp.arange(length)[None, :] < lengths[:, None]).astype(jnp.int32)
    types = ((jnp.arange(length)[None, :] >= lengths[:, None] // 2) & (mask > 0)).astype(jnp.int32)
    return ids * mask, mask, types


def assert_close(got, want, rtol=1e-5, names=("out", "dq", "dk", "dv")):
    """Attention outputs and gradients against a reference's, each named; every reference
    must carry a real signal (not zeros against zeros)."""
    for name, g, w in zip(names, got, want):
        w = np.asarray(w)
        assert np.abs(w).max() > 0.1, name
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6 * max(1.0, np.abs(w).max()),
                                   err_msg=name)


def run_mesh_worker(script: str, repo, devices: int = 4) -> dict:
    """Runs `script` (argv[1]: the repository) in a fresh CPU process with `devices` host
    devices and returns the JSON object on its last line of output (asserting it ran, and
    on that many devices)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    out = subprocess.run([sys.executable, "-c", script, str(repo)], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["devices"] == devices, result
    return result


def pretraining_loss_and_grads(config: BertConfig, params, batch, dropout: bool = False):
    """(loss, gradients) of BertForPreTraining on `batch` (ids, mask, types) with three MLM
    positions per row, for a loss that weighs every logit: sum(sin(MLM logits)) + sum(NSP
    logits ** 2). dropout: training mode with the "dropout" rng PRNGKey(7)."""
    ids, mask, types = batch
    positions = jnp.array([[1, 2, 3]] * ids.shape[0])
    model = BertForPreTraining(config)

    def loss(p):
        mlm, nsp = model.apply({"params": p}, ids, mask, types, masked_lm_positions=positions,
                               deterministic=not dropout,
                               rngs={"dropout": jax.random.PRNGKey(7)} if dropout else {})
        return jnp.sum(jnp.sin(mlm.astype(jnp.float32))) + jnp.sum(nsp.astype(jnp.float32) ** 2)

    return jax.jit(jax.value_and_grad(loss))(params)


def pretraining_params(config: BertConfig, ids, seed: int = 1):
    """Unboxed BertForPreTraining parameters initialised on `ids` (three MLM positions a
    row, as pretraining_loss_and_grads predicts)."""
    variables = BertForPreTraining(config).init(
        jax.random.PRNGKey(seed), ids, masked_lm_positions=jnp.array([[1, 2, 3]] * ids.shape[0]))
    return flax.linen.meta.unbox(variables["params"])
