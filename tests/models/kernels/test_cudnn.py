"""The cuDNN attention path (models/kernels/attention/cudnn.py): the private jax API it wraps,
pinned to the jax versions it was read against; its packed layout by hand; the dispatch with
dropout and packed rows; the compile for a GPU description (only where jax's CUDA plugin is
importable); the mask checks of benchmarks/attention_masks.py on CPU against a stand-in
kernel (our hash dropout through the XLA path) and broken ones; and, marked `gpu`, cuDNN
itself."""

import importlib.util
import inspect
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models.kernels.attention import cudnn, resolve
from tests.conftest import REPO, load_script
from tests.models.helpers import tiny_config

GPU_TARGET = REPO.parent / "shared" / "gpu" / "h100_sxm.txtpb"
ON_GPU = jax.default_backend() == "gpu"


def _masks_module():
    return load_script("benchmarks/attention_masks.py")


def test_private_api_is_the_one_wrapped():
    # Read against jax 0.10.2's jax/_src/cudnn/fused_attention_stablehlo.py (0.11's has the
    # same signature). Another minor version: read its source again, then extend this list.
    assert jax.__version__.split(".")[:2] in (["0", "10"], ["0", "11"]), jax.__version__
    from jax._src.cudnn import fused_attention_stablehlo as fas

    assert tuple(inspect.signature(fas._dot_product_attention).parameters) == \
        cudnn.API_PARAMETERS
    assert tuple(fas._dot_product_attention.nondiff_argnums) == cudnn.API_STATIC
    assert fas.get_custom_call_name(False, True, False) == "__cudnn$fmhaSoftmaxDropout"
    cudnn.check_api()


def test_a_changed_private_api_is_one_error_naming_jax(monkeypatch):
    from jax._src.cudnn import fused_attention_stablehlo as fas

    def renamed(query, key, value, bias, q_seqlen, kv_seqlen, scale, seed, rate):
        raise AssertionError("never called")

    monkeypatch.setattr(fas, "_dot_product_attention", renamed)
    cudnn.private_api.cache_clear()
    try:
        with pytest.raises(cudnn.CudnnApiError, match=f"jax {jax.__version__}'s private cuDNN"):
            cudnn.attention(*(jnp.zeros((1, 8, 1, 8), jnp.bfloat16),) * 3,
                            jnp.ones((1, 8), bool))
    finally:
        cudnn.private_api.cache_clear()


def test_segments_layout_by_hand():
    ids = jnp.array([[1, 1, 1, 2, 2, 0, 0, 0],
                     [1, 1, 1, 1, 1, 1, 1, 1],
                     [1, 2, 3, 4, 0, 0, 0, 0]])
    lengths, offsets, overflow = cudnn.segments(ids, max_segments=3)
    np.testing.assert_array_equal(lengths, [[3, 2, 3, -1], [8, -1, -1, -1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(offsets, [[0, 3, 5, -1, -1], [0, -1, -1, -1, -1],
                                            [0, 1, 2, 3, -1]])
    # 5 runs (four sequences and the padding) in a layout of 3 + 1
    np.testing.assert_array_equal(overflow, [False, False, True])


@pytest.mark.parametrize("extra, training, packed", [
    ({}, True, False),                                     # cuDNN's own dropout
    ({}, True, True),                                      # packed rows: the ids as a bias
    (dict(scan_layers=True, scan_unroll=0), True, False),  # unrolled scan
    (dict(scan_layers=True, scan_unroll=1), True, False),  # a loop: a seed per layer too
])
def test_explicit_cudnn_takes_dropout_and_packed_rows(extra, training, packed):
    config = tiny_config(dtype="bfloat16", attention_probs_dropout_prob=0.1, **extra)
    assert resolve("cudnn", "gpu", config, training, packed=packed) == "cudnn"


def test_auto_picks_what_it_picked():
    config = tiny_config(dtype="bfloat16", attention_probs_dropout_prob=0.1)
    assert resolve("auto", "gpu", config, training=True) == "pallas"
    assert resolve("auto", "gpu", config, training=True, packed=True) == "pallas"
    assert resolve("auto", "gpu", config, training=False) == "cudnn"
    assert resolve("auto", "gpu", config, training=False, packed=True) == "pallas"


def test_each_layer_has_its_own_seed():
    from bert_jax.models.attention import cudnn_seeds

    seeds = cudnn_seeds(("encoder", "layers", "attention"), 24)
    assert len(set(seeds)) == 24 and all(0 <= s < 2**31 for s in seeds)
    assert seeds[:12] == cudnn_seeds(("encoder", "layers", "attention"), 12)
    assert not set(seeds) & set(cudnn_seeds(("encoder", "layer_0", "attention"), 24))


@pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is None,
                    reason="compiles for a GPU description: needs jax's CUDA plugin "
                           "(jax-cuda12-plugin and jax-cuda12-pjrt of jax's version) importable")
def test_compiles_for_the_h100_description():
    if not GPU_TARGET.exists():
        pytest.skip(f"no GPU description at {GPU_TARGET}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + sys.path))
    worker = REPO / "tests/models/kernels/cudnn_compile_worker.py"
    done = subprocess.run([sys.executable, str(worker), str(GPU_TARGET)], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = json.loads(done.stdout.strip().splitlines()[-1])
    fwd, bwd = "__cudnn$fmhaSoftmaxDropout", "__cudnn$fmhaSoftmaxDropoutBackward"
    assert calls["padded"] == [[fwd, "PADDING", 0.1, 7], [bwd, "PADDING", 0.1, 7]]
    assert calls["packed"] == [["__cudnn$fmhaScaleBiasSoftmaxDropout", "NO_MASK", 0.1, 7],
                               ["__cudnn$fmhaScaleBiasSoftmaxDropoutBackward", "NO_MASK", 0.1, 7]]
    assert calls["no_dropout"] == [["__cudnn$fmhaSoftmax", "PADDING", 0.0, 7],
                                   ["__cudnn$fmhaSoftmaxBackward", "PADDING", 0.0, 7]]
    # Two unscanned layers: a seed each, the backward call of each with its forward's seed.
    model = calls["model"]
    assert sorted(c[0] for c in model) == [fwd, fwd, bwd, bwd]
    seeds = lambda name: sorted(c[3] for c in model if c[0] == name)  # noqa: E731
    assert seeds(fwd) == seeds(bwd) and len(set(seeds(fwd))) == 2
    # A scanned stack: a switch over the layers' seeds. Unrolled, XLA folds it (the layer
    # indices are a constant) to the one branch each layer takes; in a loop the branches
    # stay, each taken by one layer. One call and one seed per layer either way.
    for name in ("scanned", "rolled"):
        assert sorted(c[0] for c in calls[name]) == [fwd, fwd, bwd, bwd], name
        seeds = lambda target: sorted(c[3] for c in calls[name] if c[0] == target)  # noqa
        assert seeds(fwd) == seeds(bwd) and len(set(seeds(fwd))) == 2, name


# -------------------------------------------------------------- the mask checks on CPU


def _hash_standin(rate, broken=()):
    """attention_masks.standin_factory: the XLA path with our hash dropout drawn from (key,
    seed); broken: "heads" (one mask for every head) and / or "steps" (the key ignored)."""
    return _masks_module().standin_factory(rate, broken)


@pytest.mark.parametrize("layout", ["packed", pytest.param("padded", marks=pytest.mark.slow)])
def test_mask_checks_pass_a_sound_kernel_and_read_its_masks(layout):
    masks = _masks_module()
    rows = masks.run_checks(_hash_standin(0.1), b=2, n=16, h=4, only=(layout,))
    assert [r["layout"] for r in rows] == [layout]
    for r in rows:
        assert r["failures"] == [], r
        assert r["out_err"] < 1e-2 and r["grad_err"] < 2e-2, r
        # the rate read back is the hash's: within 0.03 of 0.1 on these ~1,500 pairs
        assert r["stats"]["rate"] < 0.03


def test_mask_checks_catch_a_broken_kernel():
    # Drops at 0.2 for a check at 0.1, one mask for every head, the same mask every step:
    # each is its own failure line.
    masks = _masks_module()
    rows = masks.run_checks(_hash_standin(0.2, broken=("heads", "steps")), b=2, n=16, h=4,
                            rate=0.1, only=("packed",))
    failures = " | ".join(rows[0]["failures"])
    for expected in ("rate", "corr_heads", "next step"):
        assert expected in failures, failures


# ---------------------------------------------------------------------- on a GPU only


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="cuDNN's attention runs on a GPU")
@pytest.mark.parametrize("packed_layout", ["bias", "segments"])
def test_cudnn_masks_on_the_gpu(packed_layout):
    masks = _masks_module()
    rows = masks.run_checks(masks.cudnn_factory(0.1, packed_layout), b=8, n=128, h=8)
    for r in rows:
        assert r["failures"] == [], r


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="cuDNN's attention runs on a GPU")
@pytest.mark.parametrize("packed_layout", ["bias", "segments"])
def test_cudnn_without_dropout_is_the_xla_path_on_the_gpu(packed_layout):
    masks = _masks_module()
    for layout, mask in masks.layouts(4, 128).items():
        q, k, v, cot = masks.inputs(4, 128, 4, seed=3)
        v = jax.random.normal(jax.random.PRNGKey(4), v.shape, jnp.float32).astype(v.dtype)
        fn = masks.with_grads(lambda q, k, v, m, key: cudnn.attention(
            q, k, v, m, packed_layout=packed_layout))
        o, grads = fn(q, k, v, cot, mask, None)
        want_o, want_grads = masks.reference((q, k, v), cot, mask, None, 0.0)
        assert masks.rel_err([o], [want_o]) < 2e-2, layout
        assert masks.rel_err(grads, want_grads) < 2e-2, layout
