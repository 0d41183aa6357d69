"""LAMB against a hand-written numpy LAMB (You et al. 2019, Algorithm 2, as NVIDIA's BERT
runs it): three steps on a tiny tree of a kernel, a bias and a LayerNorm scale. The kernel
gets weight decay and the trust ratio ||w|| / ||u||; the bias and the LayerNorm scale get
plain bias-corrected Adam steps times the learning rate. Plus the zero-norm edge cases."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax import optim

B1, B2, EPS, WD, LR, DECAY_STEPS = 0.9, 0.999, 1e-6, 0.01, 0.02, 10
KEYS = (("dense", "kernel"), ("dense", "bias"), ("LayerNorm", "scale"))


def _lamb_tx(weight_decay=WD, clip=0.0):
    """`make_optimizer` with name=lamb and lr 0.02 decaying linearly to 0 over 10 steps."""
    opt = ml_collections.ConfigDict(dict(name="lamb", b1=B1, b2=B2, eps=EPS,
                                         weight_decay=weight_decay, clip_norm=clip))
    sched = ml_collections.ConfigDict(dict(lr=LR, warmup_steps=0, decay="linear", end_lr=0.0))
    return optim.make_optimizer(opt, sched, DECAY_STEPS)


def _lr(t: int) -> float:
    """The schedule above at 0-based step t."""
    return LR * (1.0 - t / DECAY_STEPS)


def _tree(kernel, bias, scale):
    return {"dense": {"kernel": jnp.asarray(kernel, jnp.float32),
                      "bias": jnp.asarray(bias, jnp.float32)},
            "LayerNorm": {"scale": jnp.asarray(scale, jnp.float32)}}


def bias_correction(b: float, t: int) -> float:
    """1 - b^t evaluated in float32, as optax does (and apex's LAMB kernel, in float):
    b2 = 0.999 rounds to 0.99900001287 in float32, so at t = 1 the correction is
    0.00099998713 instead of 0.001, a 6e-6 relative change of the step that fades with t.
    The reference mirrors it so the comparison can be exact."""
    return float(np.float32(1) - np.float32(b) ** np.float32(t))


def _get(tree, key):
    return np.asarray(tree[key[0]][key[1]], np.float64)


class NumpyLamb:
    """Reference LAMB in float64 (but for the float32 bias corrections above), written from
    the paper's Algorithm 2 (bias-corrected moments, eps outside the square root, decay and trust ratio only on `adapted`
    tensors, ratio 1 when either norm is 0). Keeps the pieces of the last step for the
    assertions: `adam` (r_t) and `ratio` per key."""

    def __init__(self, params: dict, adapted: set):
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.adapted, self.t = adapted, 0
        self.adam, self.ratio = {}, {}

    def updates(self, grads: dict, params: dict, lr: float, wd: float = WD) -> dict:
        self.t += 1
        out = {}
        for k, g in grads.items():
            self.m[k] = B1 * self.m[k] + (1 - B1) * g
            self.v[k] = B2 * self.v[k] + (1 - B2) * g * g
            m_hat = self.m[k] / bias_correction(B1, self.t)
            v_hat = self.v[k] / bias_correction(B2, self.t)
            r = m_hat / (np.sqrt(v_hat) + EPS)
            self.adam[k] = r
            if k in self.adapted:
                u = r + wd * params[k]
                w_norm, u_norm = np.linalg.norm(params[k]), np.linalg.norm(u)
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            else:
                u, ratio = r, 1.0
            self.ratio[k] = ratio
            out[k] = -lr * ratio * u
        return out


def test_lamb_matches_numpy_reference_over_three_steps():
    rs = np.random.RandomState(0)
    params = _tree(rs.normal(size=(3, 4)), rs.normal(scale=0.1, size=4),
                   1.0 + rs.normal(scale=0.1, size=4))
    grads_seq = [_tree(rs.normal(size=(3, 4)), rs.normal(size=4), rs.normal(size=4))
                 for _ in range(3)]
    tx = _lamb_tx()
    opt_state = tx.init(params)
    ref_params = {k: _get(params, k) for k in KEYS}
    ref = NumpyLamb(ref_params, adapted={("dense", "kernel")})
    update = jax.jit(tx.update)
    for t, grads in enumerate(grads_seq):
        updates, opt_state = update(grads, opt_state, params)
        expected = ref.updates({k: _get(grads, k) for k in KEYS}, ref_params, _lr(t))
        for k in KEYS:
            np.testing.assert_allclose(_get(updates, k), expected[k], rtol=1e-6, atol=1e-9,
                                       err_msg=f"step {t + 1} {k}")
        # Bias and LayerNorm: Adam's step times lr, no decay, no trust ratio.
        for k in (("dense", "bias"), ("LayerNorm", "scale")):
            np.testing.assert_allclose(_get(updates, k), -_lr(t) * ref.adam[k], rtol=1e-6,
                                       atol=1e-9)
        # Kernel: (Adam + decay) scaled to ||w|| / ||u||, i.e. the step's norm is lr * ||w||.
        w = ref_params[("dense", "kernel")]
        u = ref.adam[("dense", "kernel")] + WD * w
        assert ref.ratio[("dense", "kernel")] == pytest.approx(
            np.linalg.norm(w) / np.linalg.norm(u))
        np.testing.assert_allclose(
            _get(updates, ("dense", "kernel")),
            -_lr(t) * np.linalg.norm(w) / np.linalg.norm(u) * u, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(np.linalg.norm(_get(updates, ("dense", "kernel"))),
                                   _lr(t) * np.linalg.norm(w), rtol=1e-6)
        params = optax.apply_updates(params, updates)
        ref_params = {k: ref_params[k] + expected[k] for k in KEYS}
    # Params are float32: each w + u rounds to ulp(|w|) ~ 1e-8 here (atol), which is the
    # whole error where a bias entry nearly cancels to 0.
    for k in KEYS:
        np.testing.assert_allclose(_get(params, k), ref_params[k], rtol=1e-6, atol=1e-8,
                                   err_msg=str(k))
    # The adaptation is far from 1 here, so the test tells the two recipes apart: optax.lamb
    # (trust ratio on every tensor) moves the bias and the LayerNorm scale differently.
    assert ref.ratio[("dense", "kernel")] > 1.5
    plain = optax.lamb(_lr(0), b1=B1, b2=B2, eps=EPS, weight_decay=WD,
                       mask=optim.decay_mask)
    p0 = _tree(np.ones((3, 4)), np.full(4, 0.05), np.full(4, 3.0))  # ratios ~0.05 and ~3
    ours, _ = _lamb_tx().update(grads_seq[0], _lamb_tx().init(p0), p0)
    theirs, _ = plain.update(grads_seq[0], plain.init(p0), p0)
    assert not np.allclose(_get(ours, ("dense", "bias")), _get(theirs, ("dense", "bias")),
                           rtol=0.1)
    assert not np.allclose(_get(ours, ("LayerNorm", "scale")),
                           _get(theirs, ("LayerNorm", "scale")), rtol=0.1)
    np.testing.assert_allclose(_get(ours, ("dense", "kernel")),
                               _get(theirs, ("dense", "kernel")), rtol=1e-6)


def _adam_step1(g):
    """Adam's first step: m_hat = g, v_hat = g^2 (up to the float32 bias corrections)."""
    m_hat = (1 - B1) * g / bias_correction(B1, 1)
    v_hat = (1 - B2) * g * g / bias_correction(B2, 1)
    return m_hat / (np.sqrt(v_hat) + EPS)


def test_trust_ratio_is_one_when_either_norm_is_zero():
    # A zero kernel (||w|| = 0): the update is the plain Adam step (+ decay of 0) times lr.
    grads = _tree([[0.5, -1.0], [2.0, 0.25]], [0.1, -0.2], [0.3, 0.0])
    params = _tree(np.zeros((2, 2)), [0.0, 0.0], [1.0, 1.0])
    tx = _lamb_tx()
    updates, _ = tx.update(grads, tx.init(params), params)
    adam = _adam_step1(_get(grads, ("dense", "kernel")))
    np.testing.assert_allclose(_get(updates, ("dense", "kernel")), -LR * adam, rtol=1e-6)
    # A zero update (zero gradient, no decay) on a non-zero kernel: ratio 1, update 0,
    # never 0 / 0 = NaN.
    params = _tree([[1.0, 2.0], [3.0, 4.0]], [0.5, 0.5], [1.0, 1.0])
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    tx = _lamb_tx(weight_decay=0.0)
    updates, _ = tx.update(zeros, tx.init(params), params)
    for k in KEYS:
        value = _get(updates, k)
        assert np.all(np.isfinite(value)) and not np.any(value), k


def test_lamb_on_the_sharded_pretraining_state():
    """The masked trust ratio on the real (flax-boxed at init) parameter tree: built
    through state_shardings / init_state, one update with all-ones gradients. Step 1 has
    Adam's step = g / (|g| + eps) ~ 1 everywhere, so every bias / LayerNorm / output-bias
    update is -lr times that and every kernel's / embedding's update has norm lr * ||w||."""
    from tests.train.common import tiny_config, tiny_state

    t = tiny_state(tiny_config(optimizer=dict(name="lamb", clip_norm=0.0)))
    config, tx, state = t["config"], t["tx"], t["state"]
    grads = jax.tree_util.tree_map(jnp.ones_like, state.params)
    updates, _ = jax.jit(tx.update)(grads, state.opt_state, state.params)
    lr = float(config.schedule.lr)
    adapted = 0
    for (path, u), w in zip(jax.tree_util.tree_flatten_with_path(updates)[0],
                            jax.tree_util.tree_leaves(state.params)):
        names = optim.path_names(path)
        u, w = np.asarray(u, np.float64), np.asarray(w, np.float64)
        if optim.decays(names):
            adapted += 1
            np.testing.assert_allclose(np.linalg.norm(u), lr * np.linalg.norm(w), rtol=1e-5,
                                       err_msg=str(names))
        else:
            np.testing.assert_allclose(u, -lr * _adam_step1(1.0), rtol=1e-6,
                                       err_msg=str(names))
    assert adapted == 2 * 6 + 3 + 3  # the kernels and embeddings of test_optim's count
