"""Process set-up (bert_jax/train/runtime.py): on a host without a TPU, jax never tries its
TPU backend, so libtpu (installed by the test extra) prints nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

_PROBE = """
import json, sys
from bert_jax.train import runtime
skipped = runtime.initialize("off") if sys.argv[1] == "initialize" else False
import jax
jax.devices()
from jax._src import xla_bridge
print(json.dumps({"tried": sorted(xla_bridge._backend_errors) + sorted(xla_bridge._backends),
                  "platform": jax.devices()[0].platform}))
"""


def _probe(how: str, **env) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    r = subprocess.run([sys.executable, "-c", _PROBE, how], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=dict(env, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1]), r.stderr


def test_a_host_without_a_tpu_never_tries_the_tpu_backend():
    from bert_jax.supervise import on_tpu_vm
    from bert_jax.train import runtime

    if on_tpu_vm() or runtime.tpu_chips():
        pytest.skip("a TPU host: the TPU backend is wanted here")  # CPU hosts run this
    plain, _ = _probe("plain")
    assert "tpu" in plain["tried"]  # jax alone loads libtpu (or fails to find it)
    quiet, stderr = _probe("initialize")
    assert quiet == {"tried": ["cpu"], "platform": "cpu"}
    assert "TPU" not in stderr and "libtpu" not in stderr, stderr
