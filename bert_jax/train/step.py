"""The one train step and eval step of every task, pure, and their jitted, sharded forms.

    train_step(state, batch, rng) -> (state, metrics)     # via functools.partial(..., task=)

A batch is a dict of global arrays whose keys are the task's (bert_jax.train.task). The loss
is a sum of terms, each a *sum* over the batch divided by a denominator of the *whole* batch
(`task.totals`: real masked tokens, examples, labelled words). Gradient accumulation
(`accum_steps` > 1) scans over micro-batches inside the step, each micro-batch's sums over
the whole batch's totals, so the summed gradient is exactly that of the large-batch loss (a
mean of micro-batch means would weight those with fewer real rows too much). One extra
parameter-sized buffer is live (the running gradient sum), as with optax.MultiSteps, but the
optimizer runs once per large batch and keeps no step-counter bookkeeping.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax.models import fp8 as fp8_lib
from bert_jax.train import metrics as metrics_lib
from bert_jax.train.state import TrainState, mesh_context


def micro_batches(batch, accum_steps: int, batch_sharding):
    """[B, ...] -> [accum, B / accum, ...], micro-batch i = rows i, i + accum, ... so that
    each device's contiguous block of rows contributes equally to every micro-batch (no
    data movement between devices)."""
    def split(x):
        b = x.shape[0]
        if b % accum_steps:
            raise ValueError(f"batch size {b} is not divisible by accum_steps={accum_steps}")
        x = x.reshape((b // accum_steps, accum_steps) + x.shape[1:])
        x = jnp.swapaxes(x, 0, 1)
        if batch_sharding is not None:
            spec = PartitionSpec(None, *batch_sharding.spec)
            x = jax.lax.with_sharding_constraint(x, NamedSharding(batch_sharding.mesh, spec))
        return x
    return jax.tree_util.tree_map(split, batch)


def _loss(params, fp8, task, batch, rng, totals, deterministic):
    """(the task's loss of `batch` over the whole batch's `totals`, the sums behind it).
    fp8: the FP8 scaling state ({} without model.fp8), whose gradient is its next value."""
    outputs = task.model.apply(fp8_lib.variables(params, fp8), **task.inputs(batch),
                               deterministic=deterministic,
                               rngs=None if deterministic else {"dropout": rng})
    sums = task.sums(outputs, batch)
    return task.loss(sums, totals), sums


def _keep_where(keep, new, old):
    """`new` where `keep`, else `old`; a schedule's step count always takes `new`, so a
    skipped update still advances the learning rate with the step (the lr logged is the lr
    applied, and the schedule ends where the run does)."""
    def pick(n, o):
        if isinstance(n, optax.ScaleByScheduleState):
            return n
        return jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), n, o)
    return jax.tree_util.tree_map(
        pick, new, old, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))


def train_step(state: TrainState, batch, rng, *, task, tx: optax.GradientTransformation,
               schedule, accum_steps: int = 1, deterministic: bool = False,
               batch_sharding: Optional[NamedSharding] = None,
               keep_state_on_nonfinite: bool = True):
    """One optimizer update on `batch`. rng: the run's base key; the dropout key of this
    step is fold_in(rng, step) (and fold_in(., i) for micro-batch i).

    A non-finite loss or gradient norm sets the metric `train/nonfinite` to 1. With
    `keep_state_on_nonfinite` (train.skip_nonfinite) the new params and optimizer moments
    are then the old ones (the step counter and the schedule's count move on), so the loop
    can carry on. Without it the update is applied whatever it holds, and the caller must
    stop before saving or evaluating that state, as the loop does: the select of old
    against new state is a full extra pass over params and both Adam moments
    (benchmarks/train_step.py measures it).
    With several processes the loop adds `input_ok` to the batch: <float32>[batch], 1 on the
    rows of a process whose input is good, -(1 + process index) on those of a process whose
    input failed (it feeds its previous batch again). Its minimum is the same on every
    process, so all of them agree in the same step: when it is not positive the state is
    kept as it was, step counter included, and the metric `train/input_ok` carries the
    minimum to the loop (bert_jax.train.loop, "input that fails on one process").
    Returns (new state, dict of float32 scalars)."""
    inputs_ok = None
    if "input_ok" in batch:
        batch = dict(batch)
        input_flag = jnp.min(batch.pop("input_ok"))
        inputs_ok = input_flag > 0
    step_rng = jax.random.fold_in(rng, state.step)
    totals = task.totals(batch)
    # The gradient with respect to the FP8 scaling state is its next value (flax's
    # OVERWRITE_WITH_GRADIENT collection: bert_jax.models.fp8), not a gradient.
    grad_fn = jax.value_and_grad(_loss, argnums=(0, 1), has_aux=True)
    if accum_steps == 1:
        (loss, sums), (grads, fp8) = grad_fn(state.params, state.fp8, task, batch, step_rng,
                                             totals, deterministic)
    else:
        micro = micro_batches(batch, accum_steps, batch_sharding)

        def body(carry, xs):
            # The FP8 state goes from one micro-batch to the next (each one's products are
            # scaled by the amaxes of those before it), as over steps; the rest adds up.
            i, mb = xs
            sums_so_far, fp8_before = carry[:3], carry[3]
            (l, s), (g, fp8_after) = grad_fn(state.params, fp8_before, task, mb,
                                             jax.random.fold_in(step_rng, i), totals,
                                             deterministic)
            return (*jax.tree_util.tree_map(jnp.add, sums_so_far, (l, s, g)), fp8_after), None

        zero_sums = jax.eval_shape(
            lambda: _loss(state.params, state.fp8,
                          task, jax.tree_util.tree_map(lambda x: x[0], micro),
                          step_rng, totals, True)[1])
        init = (jnp.zeros((), jnp.float32),
                jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), zero_sums),
                jax.tree_util.tree_map(jnp.zeros_like, state.params), state.fp8)
        (loss, sums, grads, fp8), _ = jax.lax.scan(
            body, init, (jnp.arange(accum_steps), micro))

    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    if keep_state_on_nonfinite:
        params = _keep_where(ok, params, state.params)
        opt_state = _keep_where(ok, opt_state, state.opt_state)
        # a non-finite amax would stay in the history (and its scales) for AMAX_HISTORY steps
        fp8 = _keep_where(ok, fp8, state.fp8)
    step = state.step + 1
    if inputs_ok is not None:  # a void step: nothing moves, not even the counters
        params, opt_state, fp8 = jax.tree_util.tree_map(
            lambda n, o: jnp.where(inputs_ok, n, o), (params, opt_state, fp8),
            (state.params, state.opt_state, state.fp8))
        step = state.step + inputs_ok.astype(state.step.dtype)
    new_state = TrainState(step=step, params=params, opt_state=opt_state, fp8=fp8)
    metrics = {
        "train/loss": loss,
        **task.metrics(sums, totals),
        "train/grad_norm": grad_norm,
        "train/param_norm": optax.tree.norm(new_state.params),
        "train/lr": jnp.asarray(schedule(state.step), jnp.float32),
        "train/nonfinite": (~ok).astype(jnp.float32),
    }
    if inputs_ok is not None:
        metrics["train/input_ok"] = input_flag
    metrics.update(metrics_lib.input_stats(batch))  # real tokens (bert_jax.train.metrics)
    return new_state, {k: jnp.asarray(v).astype(jnp.float32) for k, v in metrics.items()}


def eval_step(params, batch, *, task):
    """task.eval_outputs of one eval batch: sums (pre-training) or per-row arrays that the
    host collects (fine-tuning); filler rows have example_weights 0. A model.fp8 model is
    evaluated without FP8 (models/fp8.py: the scaling state is the train step's)."""
    outputs = fp8_lib.without_fp8(task.model).apply({"params": params}, **task.inputs(batch),
                                                    deterministic=True)
    return task.eval_outputs(outputs, batch)


class InMesh:
    """Calls (and so traces) a jitted function under the mesh and the logical-axis rules,
    which flax's activation constraints and the micro-batch constraint read."""

    def __init__(self, jitted, mesh, rules):
        self.jitted, self.mesh, self.rules = jitted, mesh, rules

    def __call__(self, *args):
        with mesh_context(self.mesh, self.rules):
            return self.jitted(*args)

    def lower(self, *args):
        with mesh_context(self.mesh, self.rules):
            return self.jitted.lower(*args)


def jit_train_step(task, tx, schedule, state_shardings, batch_sharding: NamedSharding,
                   rules, *, accum_steps: int = 1, deterministic: bool = False,
                   keep_state_on_nonfinite: bool = True):
    """train_step jitted once: state sharded by `state_shardings` (and donated), batch by
    `batch_sharding` (examples over ("data", "fsdp")), rng and metrics replicated."""
    fn = functools.partial(train_step, task=task, tx=tx, schedule=schedule,
                           accum_steps=accum_steps, deterministic=deterministic,
                           batch_sharding=batch_sharding,
                           keep_state_on_nonfinite=keep_state_on_nonfinite)
    mesh = batch_sharding.mesh
    rep = NamedSharding(mesh, PartitionSpec())
    return InMesh(jax.jit(fn, in_shardings=(state_shardings, batch_sharding, rep),
                          out_shardings=(state_shardings, rep), donate_argnums=(0,)),
                  mesh, rules)


def jit_eval_step(task, params_shardings, batch_sharding: NamedSharding, rules):
    mesh = batch_sharding.mesh
    fn = functools.partial(eval_step, task=task)
    rep = NamedSharding(mesh, PartitionSpec())
    return InMesh(jax.jit(fn, in_shardings=(params_shardings, batch_sharding),
                          out_shardings=rep),
                  mesh, rules)


def host_metrics(metrics: Mapping[str, Any]) -> dict:
    return {k: float(v) for k, v in jax.device_get(dict(metrics)).items()}
