"""The jitted train step on one device: its loss is the pre-training loss of the model,
gradient accumulation equals the large batch, and a non-finite step changes nothing."""

from __future__ import annotations

import flax
import jax
import numpy as np
import optax
import pytest

from bert_jax.data import device as data_device
from bert_jax.tasks.pretraining.loss import pretraining_loss
from bert_jax.models.config import from_config_dict
from bert_jax.tasks.pretraining import PretrainingTask
from bert_jax.train import state as state_lib
from bert_jax.train import metrics as metrics_lib
from bert_jax.train import step as step_lib
from data_prep import packing
from tests.train.common import PREDICTIONS, random_batch, tiny_config, tiny_state


@pytest.fixture(scope="module")
def setup():
    t = tiny_state()
    bsh = data_device.batch_sharding(t["mesh"], t["rules"])

    def step_fn(accum, keep_state_on_nonfinite=True):
        return step_lib.jit_train_step(t["task"], t["tx"], t["schedule"], t["shardings"], bsh,
                                       t["rules"], accum_steps=accum, deterministic=True,
                                       keep_state_on_nonfinite=keep_state_on_nonfinite)
    return dict(model=t["model"], fresh=t["fresh"], step_fn=step_fn, one=step_fn(1))


def _host(tree):
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def test_loss_is_the_pretraining_loss_of_the_model(setup):
    state = setup["fresh"]()
    params = _host(state.params)    # the step donates `state`
    batch = random_batch(3, 8)
    _, metrics = setup["one"](state, batch, jax.random.key(1))

    @jax.jit
    def reference(params, batch):
        mlm_logits, nsp_logits = setup["model"].apply(
            {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
            batch["masked_lm_positions"])
        return pretraining_loss(mlm_logits, nsp_logits, batch)

    loss, m = reference(params, batch)
    np.testing.assert_allclose(float(metrics["train/loss"]), float(loss), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["train/mlm_acc"]), float(m["mlm_acc"]), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["train/nsp_loss"]), float(m["nsp_loss"]), rtol=1e-6)
    assert float(metrics["train/nonfinite"]) == 0.0
    assert float(metrics["train/grad_norm"]) > 0.0


def test_four_micro_batches_equal_one_batch(setup):
    batches = [random_batch(10 + i, 16) for i in range(3)]
    # Micro-batches of this batch hold different numbers of masked tokens: a mean of
    # micro-batch means would not equal the batch mean.
    counts = batches[0]["masked_lm_weights"].reshape(4, 4, -1).transpose(1, 0, 2).sum((1, 2))
    assert len(set(counts.tolist())) > 1
    results = {}
    for accum in (1, 4):
        fn = setup["one"] if accum == 1 else setup["step_fn"](4)
        state = setup["fresh"]()
        losses = []
        for b in batches:
            state, m = fn(state, b, jax.random.key(1))
            losses.append(float(m["train/loss"]))
        results[accum] = (losses, _host(state.params), float(m["train/grad_norm"]))
    np.testing.assert_allclose(results[4][0], results[1][0], rtol=1e-5)
    np.testing.assert_allclose(results[4][2], results[1][2], rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(results[4][1]),
                    jax.tree_util.tree_leaves(results[1][1])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def _schedule_counts(opt_state) -> list[int]:
    return [int(s.count) for s in jax.tree_util.tree_leaves(
        opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
        if isinstance(s, optax.ScaleByScheduleState)]


def _without_schedule(opt_state):
    return jax.tree_util.tree_leaves(jax.tree_util.tree_map(
        lambda s: None if isinstance(s, optax.ScaleByScheduleState) else s, opt_state,
        is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState)))


def test_non_finite_step_leaves_params_and_moments_unchanged(setup):
    state = setup["fresh"]()
    before = _host(state)
    batch = random_batch(4, 8)
    batch["masked_lm_weights"][0, 0] = np.nan
    state, metrics = setup["one"](state, batch, jax.random.key(1))
    assert float(metrics["train/nonfinite"]) == 1.0
    after = _host(state)
    # The step and the schedule move on (the lr follows the step); nothing else does.
    assert int(after.step) == 1 and _schedule_counts(after.opt_state) == [1]
    for a, b in zip(jax.tree_util.tree_leaves(after.params) + _without_schedule(after.opt_state),
                    jax.tree_util.tree_leaves(before.params)
                    + _without_schedule(before.opt_state)):
        np.testing.assert_array_equal(a, b)


def test_a_skipped_step_keeps_the_logged_and_the_applied_lr_equal():
    """train.skip_nonfinite under a warmup: steps 1 and 3 train, step 2 is skipped. Step 3
    logs schedule(2) and applies it: its update is the one a run whose schedule stands at 2
    computes from step 1's state (before, the schedule's count stayed at 1 after the skip,
    so step 3 logged schedule(2) but applied schedule(1), and the schedule never reached
    its end)."""
    t = tiny_state(tiny_config(schedule=dict(lr=1e-3, warmup_steps=4, decay="linear")))
    bsh = data_device.batch_sharding(t["mesh"], t["rules"])
    fn = step_lib.jit_train_step(t["task"], t["tx"], t["schedule"], t["shardings"], bsh,
                                 t["rules"], deterministic=True, keep_state_on_nonfinite=True)
    rng = jax.random.key(1)
    bad = random_batch(2, 8)
    bad["masked_lm_weights"][0, 0] = np.nan
    state, _ = fn(t["fresh"](), random_batch(1, 8), rng)
    after_1 = _host(state)
    state, m2 = fn(state, bad, rng)
    state, m3 = fn(state, random_batch(3, 8), rng)
    assert float(m2["train/nonfinite"]) == 1.0 and float(m3["train/nonfinite"]) == 0.0
    got = _host(state)
    assert int(got.step) == 3 and _schedule_counts(got.opt_state) == [3]
    assert float(m3["train/lr"]) == pytest.approx(float(t["schedule"](2)), rel=1e-7)
    assert float(t["schedule"](2)) != float(t["schedule"](1))

    def at_schedule_2(s):
        return s._replace(count=np.asarray(2, s.count.dtype)) if isinstance(
            s, optax.ScaleByScheduleState) else s

    reference = after_1.replace(step=np.asarray(2, after_1.step.dtype), opt_state=jax.tree_util.tree_map(
        at_schedule_2, after_1.opt_state,
        is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState)))
    reference = jax.device_put(reference, t["shardings"])
    want, _ = fn(reference, random_batch(3, 8), rng)
    for a, b in zip(jax.tree_util.tree_leaves(got.params),
                    jax.tree_util.tree_leaves(_host(want).params)):
        np.testing.assert_array_equal(a, b)



def test_a_failed_input_flag_keeps_the_state_and_the_step_counter(setup):
    """input_ok (several processes, bert_jax.train.loop._InputGate): all ones is the plain
    step bit for bit; one row of -(1 + process) keeps params, optimizer state and step, and
    the metric carries the minimum to every process."""
    plain = setup["fresh"]()
    plain, want = setup["one"](plain, random_batch(5, 8), jax.random.key(1))
    state = setup["fresh"]()
    batch = random_batch(5, 8)
    state, got = setup["one"](state, dict(batch, input_ok=np.ones(8, np.float32)),
                              jax.random.key(1))
    assert float(got.pop("train/input_ok")) == 1.0 and got.keys() == want.keys()
    for a, b in zip(jax.tree_util.tree_leaves(_host(state)),
                    jax.tree_util.tree_leaves(_host(plain))):
        np.testing.assert_array_equal(a, b)
    before = _host(state)
    flag = np.ones(8, np.float32)
    flag[4:] = -3.0  # process 2's rows
    state, m = setup["one"](state, dict(random_batch(6, 8), input_ok=flag), jax.random.key(1))
    assert float(m["train/input_ok"]) == -3.0
    after = _host(state)
    assert int(after.step) == int(before.step) == 1
    for a, b in zip(jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(before)):
        np.testing.assert_array_equal(a, b)

def test_update_without_the_nonfinite_select_is_the_same(setup):
    # The loop's default (stop on a non-finite step) compiles the step without the select
    # of old against new state; on finite steps that changes nothing, bit for bit.
    out = {}
    for name, fn in (("select", setup["one"]),
                     ("no_select", setup["step_fn"](1, keep_state_on_nonfinite=False))):
        state = setup["fresh"]()
        for i in range(3):
            state, m = fn(state, random_batch(30 + i, 8), jax.random.key(1))
        out[name] = (_host(state), float(m["train/loss"]))
    assert out["select"][1] == out["no_select"][1]
    for a, b in zip(jax.tree_util.tree_leaves(out["select"][0]),
                    jax.tree_util.tree_leaves(out["no_select"][0])):
        np.testing.assert_array_equal(a, b)


def test_dropout_key_depends_on_the_step():
    # fold_in(rng, step): two steps on the same batch and params use different masks.
    config = tiny_config()
    with config.unlocked():
        config.model.hidden_dropout_prob = 0.5
    model = PretrainingTask(config, "").model
    batch = random_batch(5, 8)
    params = model.init(jax.random.key(0), **state_lib.dummy_inputs(16, 4))["params"]
    params = flax.linen.meta.unbox(params)
    rng = jax.random.key(7)

    @jax.jit
    def logits(step):
        return model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                           batch["segment_ids"], batch["masked_lm_positions"],
                           deterministic=False, rngs={"dropout": jax.random.fold_in(rng, step)})[0]

    outs = [np.asarray(logits(s)) for s in (0, 1, 0)]
    assert not np.allclose(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


PACKED_LENGTH, K = 48, 3


def _packed(batch, sizes):
    inst = dict(batch, next_sentence_labels=batch["next_sentence_labels"][:, 0])
    slots = K * PREDICTIONS  # random_batch draws up to 4 predictions whatever the length
    inst = {k: (np.pad(v, ((0, 0), (0, PACKED_LENGTH - v.shape[1])))
                if k in ("input_ids", "input_mask", "segment_ids") else v)
            for k, v in inst.items()}
    return packing.pack_rows(inst, sizes, K, slots)


def test_a_packed_batch_gives_the_unpacked_losses_through_the_train_step(setup):
    """The same sequences packed three, two and one to a row: the losses,
    accuracies and gradient norm of the step on them unpacked; the same real work counted
    (input_stats), which the loop turns into real-token throughput, MFU and padding."""
    unpacked = random_batch(5, 8)             # 8 sequences of 8-16 tokens in rows of 16
    packed = _packed(unpacked, [3, 3, 2])     # the same in 3 rows of 48
    assert packed["input_mask"].sum() == unpacked["input_mask"].sum()
    rng = jax.random.key(1)
    _, want = setup["one"](setup["fresh"](), unpacked, rng)
    _, got = setup["one"](setup["fresh"](), packed, rng)
    want, got = step_lib.host_metrics(want), step_lib.host_metrics(got)
    for key in ("train/loss", "train/mlm_loss", "train/mlm_acc", "train/nsp_loss",
                "train/nsp_acc", "train/grad_norm"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)
    lengths = unpacked["input_mask"].sum(1)
    real = {"input/tokens": lengths.sum(), "input/sequences": 8,
            "input/square_lengths": (lengths ** 2).sum(),
            "input/predictions": unpacked["masked_lm_weights"].sum()}
    for key, value in real.items():  # the same real work, whatever the rows
        assert got[key] == want[key] == value, key

    config = from_config_dict(tiny_config().model)
    perf = {name: metrics_lib.real_token_metrics(
        stats, rows=rows, seq_len=length, config=config, step_time=0.5,
        peak_per_device=1e12) for name, stats, rows, length in (
            ("unpacked", want, 8, 16), ("packed", got, 3, PACKED_LENGTH))}
    assert perf["packed"]["data/padding_fraction"] == pytest.approx(
        1 - lengths.sum() / (3 * PACKED_LENGTH))
    assert perf["unpacked"]["data/padding_fraction"] == pytest.approx(1 - lengths.sum() / 128)
    assert perf["packed"]["data/sequences_per_row"] == pytest.approx(8 / 3)
    # Equal work in equal time: equal real-token rates and MFU (the FLOPs of the sequences).
    for key in ("perf/real_tokens_per_s", "perf/real_mfu"):
        assert perf["packed"][key] == pytest.approx(perf["unpacked"][key])
    assert perf["packed"]["perf/real_tokens_per_s"] == pytest.approx(lengths.sum() / 0.5)
    flops = metrics_lib.model_flops(config, lengths.sum(), (lengths ** 2).sum(), 8,
                                    real["input/predictions"])
    assert perf["packed"]["perf/real_mfu"] == pytest.approx(flops / 0.5 / 1e12)


def test_real_model_flops_by_hand():
    """H 32, I 64, 2 layers, vocab 128: one sequence of 10 tokens with 2 predictions."""
    config = from_config_dict(tiny_config().model)
    h, i, v = 32, 64, 128
    layer = 10 * (2 * h * 3 * h + 2 * h * h + 4 * h * i) + 4 * 100 * h
    forward = 2 * layer + 2 * h * h + 2 * (2 * h * h + 2 * h * v) + 4 * h
    assert metrics_lib.model_flops(config, 10, 100, 1, 2) == 3 * forward
    assert metrics_lib.model_flops_per_example(config, 10, 2) == 3 * forward
    # Two sequences of 5 cost less attention than one of 10 (25 + 25 against 100).
    assert metrics_lib.model_flops(config, 10, 50, 2, 2) == 3 * (
        forward - 2 * 4 * 50 * h + 2 * h * h + 4 * h)
