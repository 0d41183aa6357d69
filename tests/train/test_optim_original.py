"""google-research/bert's recipe as options: optimizer.bias_correction=False (its
AdamWeightDecayOptimizer) and schedule.decay_from="start" (its create_optimizer decays from
step 0 over all steps). Both are driven through make_optimizer, the optimizer a run builds,
and compared with the original's formulas, written out below in numpy."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

from bert_jax import optim
from bert_jax.train.config import optimizer_config, schedule_config

LR, WARMUP, TOTAL = 1e-3, 2, 10
B1, B2, EPS, WD, CLIP = 0.9, 0.999, 1e-6, 0.01, 1.0


def original_lr(t: int) -> float:
    """optimization.py, create_optimizer (t = global_step, 0-based):
        learning_rate = polynomial_decay(init_lr, global_step, num_train_steps,
                                         end_learning_rate=0.0, power=1.0, cycle=False)
        is_warmup = global_step < num_warmup_steps
        learning_rate = (1 - is_warmup) * learning_rate
                        + is_warmup * init_lr * global_step / num_warmup_steps"""
    decayed = (LR - 0.0) * (1 - min(t, TOTAL) / TOTAL) ** 1.0 + 0.0
    return LR * t / WARMUP if t < WARMUP else decayed


def hugging_face_lr(t: int) -> float:
    """transformers' get_linear_schedule_with_warmup: the decay starts at the peak."""
    if t < WARMUP:
        return LR * t / WARMUP
    return LR * max(0.0, (TOTAL - t) / (TOTAL - WARMUP))


def original_updates(params: dict, grads: list, decayed: dict) -> list:
    """AdamWeightDecayOptimizer.apply_gradients after tf.clip_by_global_norm(grads, 1.0),
    in float64, for each step t: the params after the update.
        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2      (no bias correction)
        update = m / (sqrt(v) + eps) [+ weight_decay_rate * param, not for LayerNorm/bias]
        param = param - learning_rate(t) * update"""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    out = []
    for t, g in enumerate(grads):
        norm = np.sqrt(sum(np.sum(np.square(x.astype(np.float64))) for x in g.values()))
        g = {k: x.astype(np.float64) * CLIP / max(norm, CLIP) for k, x in g.items()}
        for k in p:
            m[k] = B1 * m[k] + (1 - B1) * g[k]
            v[k] = B2 * v[k] + (1 - B2) * np.square(g[k])
            update = m[k] / (np.sqrt(v[k]) + EPS)
            if decayed[k]:
                update = update + WD * p[k]
            p[k] = p[k] - original_lr(t) * update
        out.append(dict(p))
    return out


def test_decay_from_start_is_the_original_schedule():
    original = schedule_config(lr=LR, warmup_steps=WARMUP, decay="linear", decay_from="start")
    default = schedule_config(lr=LR, warmup_steps=WARMUP, decay="linear")
    for t in range(TOTAL + 3):
        np.testing.assert_allclose(float(optim.learning_rate(original, TOTAL, t)),
                                   original_lr(t), rtol=1e-6, atol=1e-12, err_msg=str(t))
        np.testing.assert_allclose(float(optim.learning_rate(default, TOTAL, t)),
                                   hugging_face_lr(t), rtol=1e-6, atol=1e-12, err_msg=str(t))
    # Where they part: at the end of warmup the original is already (1 - W/T) of the peak.
    assert original_lr(WARMUP) == pytest.approx(0.8 * LR)
    assert hugging_face_lr(WARMUP) == pytest.approx(LR)
    with pytest.raises(Exception, match="decay_from='zero'"):
        optim.make_schedule(schedule_config(decay_from="zero"), TOTAL)


def _params_and_grads():
    rs = np.random.RandomState(0)
    params = {"layer/kernel": rs.normal(size=(3, 4)), "layer/bias": rs.normal(size=(4,)),
              "LayerNorm/scale": 1 + 0.1 * rs.normal(size=(4,)),
              "LayerNorm/bias": 0.1 * rs.normal(size=(4,)),
              "embeddings/embedding": rs.normal(size=(5, 3))}
    params = {k: v.astype(np.float32) for k, v in params.items()}
    # Step 1's gradient has a global norm above 1: the clip acts there.
    grads = [{k: (s * 0.05 * rs.normal(size=v.shape)).astype(np.float32)
              for k, v in params.items()} for s in (1.0, 40.0, 1.0)]
    return params, grads


def _nested(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        a, b = key.split("/")
        out.setdefault(a, {})[b] = value
    return out


def _run(optimizer, schedule, params, grads) -> list:
    tx = optim.make_optimizer(optimizer, schedule, TOTAL)
    p = _nested(params)
    state = tx.init(p)
    out = []
    for g in grads:
        updates, state = tx.update(_nested(g), state, p)
        p = optax.apply_updates(p, updates)
        out.append({f"{a}/{b}": np.asarray(x) for a, tree in p.items() for b, x in tree.items()})
    return out


def test_original_adam_first_three_updates():
    params, grads = _params_and_grads()
    decayed = {k: optim.decays(tuple(k.split("/"))) for k in params}
    assert decayed == {"layer/kernel": True, "layer/bias": False, "LayerNorm/scale": False,
                       "LayerNorm/bias": False, "embeddings/embedding": True}
    assert np.sqrt(sum(np.sum(np.square(g.astype(np.float64)))
                       for g in grads[1].values())) > CLIP
    want = original_updates(params, grads, decayed)
    schedule = schedule_config(lr=LR, warmup_steps=WARMUP, decay="linear", decay_from="start")
    got = _run(optimizer_config(bias_correction=False, clip_norm=CLIP), schedule, params, grads)
    for t in range(3):
        for k in params:
            np.testing.assert_allclose(got[t][k], want[t][k], rtol=2e-6, atol=1e-7,
                                       err_msg=f"step {t} {k}")
    # Step 0's rate is 0 (warmup); the later steps moved every parameter.
    for k in params:
        np.testing.assert_array_equal(got[0][k], params[k])
        assert np.all(got[2][k] != params[k]), k
    # The default (bias-corrected) Adam under the same schedule is not the original's.
    corrected = _run(optimizer_config(clip_norm=CLIP), schedule, params, grads)
    assert not np.allclose(corrected[1]["layer/kernel"], want[1]["layer/kernel"], rtol=1e-3)


def test_state_is_the_same_tree_either_way():
    """A run may resume with the other setting: the optimizer state has one structure."""
    params, _ = _params_and_grads()
    trees = [jax.tree_util.tree_structure(optim.make_optimizer(
        optimizer_config(bias_correction=b), schedule_config(), TOTAL).init(_nested(params)))
        for b in (True, False)]
    assert trees[0] == trees[1]
