"""One fine-tuning run on the device mesh: sharded state, jitted steps, checkpoints, resume,
preemption, evaluation.

    mesh = MeshSetup.from_config(config, task, bert_config, seq_len)   # cheap checks
    steps = mesh.steps_for(config, lr, total_steps)                    # jitted once per lr
    outcome = train_and_evaluate(mesh, steps, init, features, eval_sets, config, seed, out_dir)

Like pre-training (bert_jax/train): the mesh comes from `config.mesh` (data / fsdp / tensor,
one may be -1), params and optimizer moments are sharded by the logical-axis rules, the
batch over ("data", "fsdp"); the train step is a pure function jitted once with explicit
in / out shardings and the state donated; the dropout key of step s is fold_in(rng, s).

Every process holds the whole (in-memory, numpy) feature set and computes the same global
batch; each places only its addressable rows on its devices (make_array_from_callback), so
no process-to-rows convention is needed. Batch s of a run with seed k is a pure function of
(k, s) (tasks_input.train_batch_indices), so the data position of a checkpoint is its step.

Checkpoints: OUT_DIR/checkpoints (bert_jax.train.checkpoint: params, optimizer state, step,
RNG) every `checkpoint.every` steps, at the end of training, and on SIGTERM (which stops
the run after saving: `outcome.preempted`). The same call on the same OUT_DIR resumes from
the latest one, bit for bit. checkpoint.every=0: at the end (and on SIGTERM) only. Faults are
pre-training's (bert_jax.train.checkpoint, the same Checkpointer): a failed background save
stops the run at the next step in one line, a damaged latest checkpoint is skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding

from bert_jax import optim
from bert_jax import sharding as sharding_lib
from bert_jax.data import device as data_device
from bert_jax.data.state import pack_meta
from bert_jax.data.tasks_input import eval_batches, train_batches
from bert_jax.models.config import ConfigError
from bert_jax.tasks.base import collect, model_inputs
from bert_jax.train import state as state_lib
from bert_jax.train.runtime import Preemption
from bert_jax.train.state import TrainState


# --- the pure steps ----------------------------------------------------------------------

def train_step(state: TrainState, batch, rng, *, model, task, tx, schedule,
               accum_steps: int = 1, batch_sharding: Optional[NamedSharding] = None):
    """One optimizer update. batch: the task's features `<int32>[batch, ...]` plus
    example_weights `<float32>[batch]`; rng: the run's key (dropout of this step:
    fold_in(rng, step), and fold_in(., i) for micro-batch i). A non-finite loss or gradient
    sets `train/nonfinite` = 1 and the loop stops there: it reads the flags before it saves
    or evaluates, so the step needs no select of old against new state (a full extra pass
    over params and both Adam moments; see bert_jax/train/step.py).

    With `accum_steps` > 1 the batch is split into micro-batches (rows i, i + accum, ...;
    bert_jax.train.step.micro_batches) scanned inside this one step: each micro-batch's
    gradient is that of the task's loss *sum*, and the summed gradient is divided by the
    whole batch's count (examples, or labelled words for NER), so the update is the one
    of the large batch's mean loss, not a mean of micro-batch means. Returns (state,
    float32 scalars)."""
    step_rng = jax.random.fold_in(rng, state.step)

    def outputs(params, mb, key):
        return model.apply({"params": params}, *model_inputs(mb), deterministic=False,
                           rngs={"dropout": key})

    if accum_steps == 1:
        def loss_fn(params):
            return task.loss(outputs(params, batch, step_rng), batch)

        (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    else:
        from bert_jax.train.step import micro_batches

        def sum_fn(params, mb, key):
            _, m = task.loss(outputs(params, mb, key), mb)
            return m["loss_sum"], m["count"]

        def body(carry, xs):
            i, mb = xs
            (loss_sum, count), g = jax.value_and_grad(sum_fn, has_aux=True)(
                state.params, mb, jax.random.fold_in(step_rng, i))
            return jax.tree_util.tree_map(jnp.add, carry, (loss_sum, count, g)), None

        zero = jnp.zeros((), jnp.float32)
        init = (zero, zero, jax.tree_util.tree_map(jnp.zeros_like, state.params))
        (loss_sum, count, grads), _ = jax.lax.scan(
            body, init, (jnp.arange(accum_steps),
                         micro_batches(batch, accum_steps, batch_sharding)))
        count = jnp.maximum(count, 1e-5)
        loss = loss_sum / count
        grads = jax.tree_util.tree_map(lambda g: g / count, grads)
    grad_norm = optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
    metrics = {"train/loss": loss, "train/grad_norm": grad_norm,
               "train/lr": schedule(state.step), "train/nonfinite": (~ok)}
    return new_state, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


def eval_step(params, batch, *, model, task):
    """task.keep(outputs, batch): per-row arrays `[batch, ...]` (replicated on the way out)."""
    out = model.apply({"params": params}, *model_inputs(batch), deterministic=True)
    return task.keep(out, batch)


# --- mesh, shardings, compiled steps -----------------------------------------------------

@dataclasses.dataclass
class Steps:
    """What is built once per learning rate and reused by every restart (no recompiling)."""

    tx: Any
    schedule: Any
    abstract: TrainState       # ShapeDtypeStructs carrying their shardings
    shardings: TrainState      # NamedShardings
    train_fn: Callable         # (state, batch, rng) -> (state, metrics); state donated
    eval_fn: Callable          # (params, batch) -> task.keep rows, replicated
    total_steps: int
    lr: float


@dataclasses.dataclass
class MeshSetup:
    task: Any
    bert_config: Any
    model: Any
    mesh: Any
    rules: tuple
    batch_sharding: NamedSharding
    replicated: NamedSharding
    seq_len: int

    @classmethod
    def from_config(cls, config, task, bert_config, seq_len: int) -> "MeshSetup":
        """Mesh from config.mesh; checks the batch sizes against it (before any compile)."""
        mesh = sharding_lib.make_mesh(config.mesh)
        rules = sharding_lib.rules_from_config(config.mesh)
        batch_sharding = data_device.batch_sharding(mesh, rules)
        shards = int(np.prod([mesh.shape[a] for a in data_device.batch_mesh_axes(mesh, rules)]))
        accum = int(config.train.accum_steps)
        if accum < 1:
            raise ConfigError(f"config.train.accum_steps={accum}: expected a positive number "
                             f"of micro-batches per step")
        if int(config.train.batch_size) % accum:
            raise ConfigError(f"config.train.batch_size={int(config.train.batch_size)} is not "
                             f"divisible by config.train.accum_steps={accum}")
        sizes = {"batch_size": int(config.train.batch_size) // accum,
                 "eval_batch_size": int(config.train.eval_batch_size)}
        for key, size in sizes.items():
            if size % shards:
                what = (f"config.train.{key}={size}" if key == "eval_batch_size" or accum == 1
                        else f"the micro-batch size {size} (config.train.batch_size / "
                             f"accum_steps={accum})")
                raise ConfigError(f"{what} is not divisible by the {shards} batch shards of "
                                 f"mesh {dict(mesh.shape)}")
        if seq_len > bert_config.max_position_embeddings:
            raise ConfigError(f"task.max_seq_length={seq_len} exceeds the model's "
                             f"max_position_embeddings={bert_config.max_position_embeddings}")
        return cls(task, bert_config, task.model(bert_config), mesh, rules, batch_sharding,
                   sharding_lib.replicated(mesh), seq_len)

    def steps_for(self, config, lr: float, total_steps: int) -> Steps:
        s = config.schedule
        warmup = int(s.warmup_steps) if s.warmup_steps >= 0 else int(
            round(float(s.warmup_ratio) * total_steps))
        import ml_collections

        section = ml_collections.ConfigDict(dict(lr=float(lr), warmup_steps=warmup,
                                                 decay=s.decay, end_lr=float(s.end_lr)))
        tx = optim.make_optimizer(config.optimizer, section, total_steps)
        schedule = optim.make_schedule(section, total_steps)
        abstract, shardings = state_lib.state_shardings(self.model, tx, self.mesh, self.rules,
                                                        self.seq_len, None)
        rep = self.replicated
        train = jax.jit(functools.partial(train_step, model=self.model, task=self.task, tx=tx,
                                          schedule=schedule,
                                          accum_steps=int(config.train.accum_steps),
                                          batch_sharding=self.batch_sharding),
                        in_shardings=(shardings, self.batch_sharding, rep),
                        out_shardings=(shardings, rep), donate_argnums=(0,))
        evaluate = jax.jit(functools.partial(eval_step, model=self.model, task=self.task),
                           in_shardings=(shardings.params, self.batch_sharding),
                           out_shardings=rep)
        return Steps(tx, schedule, abstract, shardings, self._in_mesh(train),
                     self._in_mesh(evaluate), total_steps, float(lr))

    def _in_mesh(self, jitted):
        """Traced (and run) under the mesh and rules: flax's activation constraints read them."""
        def call(*args):
            with state_lib.mesh_context(self.mesh, self.rules):
                return jitted(*args)
        return call

    def place(self, batch: dict) -> dict:
        """The global numpy batch (every process has it) -> global jax.Arrays; each process
        transfers only its addressable rows."""
        return {k: jax.make_array_from_callback(
                    v.shape, self.batch_sharding, lambda idx, v=np.asarray(v): v[idx])
                for k, v in batch.items()}


# --- one run -----------------------------------------------------------------------------

@dataclasses.dataclass
class Outcome:
    """results: {eval set: metrics} + "train"; None when preempted (state saved)."""

    results: Optional[dict]
    params: Any
    preempted: bool


class _Position:
    """The data position of a checkpoint (bert_jax.train.checkpoint saves one per process):
    the step, since batch s is a pure function of (seed, s)."""

    def __init__(self, seed: int, step: int):
        self.seed, self.step = seed, step

    def get_state(self) -> dict:
        return {"meta": pack_meta({"kind": "finetune", "seed": self.seed}),
                "step": np.asarray(self.step, np.int64)}


def _host(tree):
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def _checkpointer(out_dir: str, config):
    from bert_jax.train import checkpoint as ckpt_lib
    from bert_jax.train.config import checkpoint_every

    c = config.checkpoint
    return ckpt_lib.Checkpointer(out_dir, every=checkpoint_every(config), keep=int(c.keep),
                                 async_save=bool(c.async_save))


def initial_state(setup: MeshSetup, steps: Steps, seed: int, init_source=None):
    """(fresh sharded state: random init from `seed`, encoder from `init_source` if given;
    the run's replicated RNG key)."""
    rng = jax.jit(lambda: jax.random.key(seed), out_shardings=setup.replicated)()
    state = state_lib.init_state(setup.model, steps.tx, setup.mesh, setup.rules,
                                 jax.random.fold_in(rng, 0x5EED), setup.seq_len, None,
                                 steps.shardings)
    if init_source is not None:
        from bert_jax.tasks.init_checkpoint import load_encoder

        cfg = setup.bert_config
        state = load_encoder(init_source, state, steps.tx, steps.shardings, steps.abstract,
                             cfg.scan_layers, cfg.num_hidden_layers)
    return state, rng


def train_and_evaluate(setup: MeshSetup, steps: Steps, init_source, train_features,
                       eval_sets, config, seed: int, out_dir: str, progress: bool = True,
                       after_step: Optional[Callable[[int], None]] = None) -> Outcome:
    """Trains (or resumes, from out_dir/checkpoints) one run, then evaluates every eval set
    (metrics; prediction files and metrics.jsonl / TensorBoard in out_dir, process 0)."""
    from bert_jax.train import metrics as metrics_lib

    is_main = jax.process_index() == 0
    batch_size = int(config.train.batch_size)
    total, log_every = steps.total_steps, max(int(config.train.log_every), 1)
    checkpointer = _checkpointer(out_dir, config)
    ckpt_every = int(config.checkpoint.every)  # 0: at the end only (checked just above)
    writer = metrics_lib.MetricWriter(out_dir, tensorboard=bool(config.train.tensorboard))
    bar = None
    try:
        if checkpointer.latest_step() is not None:
            state, rng, _ = checkpointer.restore(steps.abstract,
                                                 rng_sharding=setup.replicated)
            saved_key = np.asarray(jax.device_get(jax.random.key_data(rng)))
            if not np.array_equal(saved_key, np.asarray(jax.random.key_data(
                    jax.random.key(seed)))):
                raise ConfigError(f"{out_dir}/checkpoints: saved by a run with another seed "
                                 f"than {seed} (another sweep?); use a new workdir")
            if is_main:
                for bad, reason, moved in checkpointer.skipped:
                    print(f"checkpoint at step {bad} skipped: {reason}; kept as {moved}",
                          flush=True)
                print(f"{out_dir}: resumed at step {int(jax.device_get(state.step))}",
                      flush=True)
        else:
            state, rng = initial_state(setup, steps, seed, init_source)
        start = int(jax.device_get(state.step))

        saved_config = json.loads(config.to_json_best_effort())

        def stop_if_nonfinite(records, step):
            bad = [r for r in records if r["train/nonfinite"]]
            if bad:
                raise FloatingPointError(
                    f"{out_dir}: non-finite loss or gradient by step {step} "
                    f"(loss={bad[0]['train/loss']}, grad_norm="
                    f"{bad[0]['train/grad_norm']}); lower the learning rate")

        def save(state):
            step = int(jax.device_get(state.step))
            stop_if_nonfinite([{k: float(v) for k, v in _host(x).items()} for x in pending],
                              step)
            checkpointer.save(state, rng, _Position(seed, step), saved_config, force=True)

        if progress and is_main:
            from tqdm import tqdm

            bar = tqdm(total=total, initial=start, leave=False, dynamic_ncols=True,
                       desc=f"fine-tune seed={seed} lr={steps.lr:g}")
        batches = train_batches(train_features, batch_size, seed, start_step=start)
        pending, t0, final_loss = [], time.time(), float("nan")
        with Preemption() as preemption:
            for step in range(start + 1, total + 1):
                state, m = steps.train_fn(state, setup.place(next(batches)), rng)
                checkpointer.check()  # a save that failed in the background stops here
                pending.append(m)
                if step % log_every == 0 or step == total:
                    records = [{k: float(v) for k, v in _host(x).items()} for x in pending]
                    pending = []
                    stop_if_nonfinite(records, step)
                    scalars = metrics_lib.average(records)
                    scalars.pop("train/nonfinite")
                    writer.write(step, scalars)
                    final_loss = scalars["train/loss"]
                    if bar is not None:
                        bar.set_postfix(loss=f"{scalars['train/loss']:.4f}")
                if bar is not None:
                    bar.update(1)
                if after_step is not None:
                    after_step(step)
                if preemption.requested or checkpointer.manager.reached_preemption(step):
                    save(state)
                    checkpointer.wait()
                    if is_main:
                        print(f"preemption: saved {out_dir} at step {step}; exiting",
                              flush=True)
                    return Outcome(None, state.params, True)
                if ckpt_every > 0 and step % ckpt_every == 0 and step != total:
                    save(state)
        if checkpointer.latest_step() != total:
            save(state)  # a kill during evaluation resumes at the evaluation
        checkpointer.wait()  # the last save's failure is this run's error
        train_seconds = time.time() - t0
        results = evaluate(setup, steps, state.params, eval_sets, config, out_dir, writer,
                           total)
        results["train"] = {"seconds": train_seconds, "steps": total,
                            "final_loss": final_loss}
        return Outcome(results, state.params, False)
    finally:
        if bar is not None:
            bar.close()
        checkpointer.close()  # waits; never raises (a failure here is already reported)
        writer.close()


def evaluate(setup: MeshSetup, steps: Steps, params, eval_sets, config, out_dir,
             writer=None, step: int = 0) -> dict:
    """{eval set name: task metrics}; every example once (zero-weight filler in the last
    batch). Process 0 writes the prediction files and the metrics."""
    results = {}
    for eval_set in eval_sets:
        kept = collect([_host(steps.eval_fn(params, setup.place(b)))
                        for b in eval_batches(eval_set.features,
                                              int(config.train.eval_batch_size))])
        results[eval_set.name] = setup.task.evaluate(eval_set, kept)
        if jax.process_index() == 0:
            setup.task.write_predictions(eval_set, kept, out_dir)
        if writer is not None and results[eval_set.name]:
            writer.write(step, {f"{eval_set.name}/{k}": v
                                for k, v in results[eval_set.name].items()})
    return results
