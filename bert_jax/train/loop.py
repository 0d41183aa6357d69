"""The one training loop, for pre-training and every fine-tuning task (bert_jax.train.task):
mesh, sharded state, resume / warm start, steps, logging, evaluation, checkpoints, faults.

    outcome = train(config, workdir, task)

The same call again resumes from the latest checkpoint in WORKDIR/checkpoints (params,
optimizer state, step, RNG and the input's position: the resumed steps log the losses of an
uninterrupted run; with another process count all but the data position is exact, with a
warning). SIGTERM finishes the step, saves and returns (`outcome.preempted`); with several
processes, a SIGTERM to any one of them makes every process save the same step
(bert_jax.train.runtime.Preemption). A save that fails in the background stops the run at
the next step in one line; a latest checkpoint that cannot be read is skipped, set aside
and named (bert_jax.train.checkpoint). Input or a save that fails on one of several
processes stops all of them at the same step (bert_jax.train.gate); a lost process ends the
others in one line each (bert_jax.train.coordination).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Optional

import jax
import numpy as np

from bert_jax import optim, paths
from bert_jax.data import device as data_device
from bert_jax.errors import FaultError, ReportedError
from bert_jax.models.kernels import attention as attention_ops
from bert_jax.models.kernels.backend import platform_name
from bert_jax.models.config import ConfigError
from bert_jax.convert.sources import saved_steps
from bert_jax.train import checkpoint as ckpt_lib
from bert_jax.train import console
from bert_jax.train import coordination
from bert_jax.train import metrics as metrics_lib
from bert_jax.train import settings
from bert_jax.train import state as state_lib
from bert_jax.train import step as step_lib
from bert_jax.train import warm_start
from bert_jax.train.checked import Checked, check
from bert_jax.train.config import run_steps, total_steps
from bert_jax.train.checkpoint_faults import CheckpointSaveError
from bert_jax.train.gate import SAVE, InputGate, VoidSteps, void_error
from bert_jax.train.profile import Profiler
from bert_jax.train.runtime import Preemption


class NonFiniteError(FaultError, FloatingPointError):
    """The loss or gradient of a step was NaN / inf (and train.skip_nonfinite is off)."""


@dataclasses.dataclass
class Outcome:
    """summary: the final scalars (train/..., eval/..., perf/...) plus step, preempted,
    nonfinite_skipped, train_seconds, kernels; params: the final params (device arrays)."""

    summary: dict
    params: Any
    preempted: bool
    programs: Any = None


@dataclasses.dataclass
class Programs:
    """What a run compiles (optimizer, schedule, abstract state and shardings, jitted
    steps, the train step's executable): a sweep's restarts of one rate reuse it."""

    tx: Any
    schedule: Any
    abstract: Any
    shardings: Any
    train_fn: Any
    eval_fn: Any
    compiled: Any = None


@dataclasses.dataclass
class EvalPrograms:
    """What evaluating given params builds (predicting with a fine-tuned model): the params'
    abstract tree (ShapeDtypeStructs) and shardings, the jitted eval step; no optimizer
    state and no train step."""

    abstract_params: Any
    param_shardings: Any
    eval_fn: Any


def config_to_dict(config) -> dict:
    return json.loads(config.to_json_best_effort())


def check_task(config, task) -> None:
    """The task's sequences fit the model's positions."""
    limit = task.model_config.max_position_embeddings
    if task.shape.seq_len > limit:
        raise ConfigError(f"{task.title}: sequences of {task.shape.seq_len} tokens exceed "
                          f"the model's max_position_embeddings={limit}")


def build(config, task, checked: Checked, steps: int) -> Programs:
    """The optimizer over `steps` (the run's), the abstract state and the jitted steps, on
    the checked config's mesh."""
    total = total_steps(config, steps)
    schedule = optim.make_schedule(config.schedule, total)
    tx = optim.make_optimizer(config.optimizer, config.schedule, total)
    abstract, shardings = state_lib.state_shardings(task.model, tx, checked.mesh,
                                                    checked.rules, task.init_inputs())
    train_fn = step_lib.jit_train_step(
        task, tx, schedule, shardings, checked.batch_sharding, checked.rules,
        accum_steps=checked.accum_steps,
        deterministic=bool(config.train.deterministic),
        keep_state_on_nonfinite=bool(config.train.skip_nonfinite))
    eval_fn = step_lib.jit_eval_step(task, shardings.params, checked.batch_sharding,
                                     checked.rules)
    return Programs(tx, schedule, abstract, shardings, train_fn, eval_fn)


def build_eval(task, checked: Checked) -> EvalPrograms:
    """The eval step alone, on the checked config's mesh: `build` less the optimizer, the
    optimizer state's abstract tree and the train step."""
    abstract, shardings = state_lib.params_shardings(task.model, checked.mesh, checked.rules,
                                                     task.init_inputs())
    eval_fn = step_lib.jit_eval_step(task, shardings, checked.batch_sharding, checked.rules)
    return EvalPrograms(abstract, shardings, eval_fn)


def evaluate_params(config, workdir: str, task, params, programs: EvalPrograms,
                    checked: Checked) -> dict:
    """task.evaluate of `params` (placed on programs.param_shardings) as at step 0, its
    scalars written to WORKDIR/metrics.jsonl (predicting with a fine-tuned model)."""
    sharding = checked.batch_sharding

    def run(batch):
        return jax.device_get(programs.eval_fn(params, data_device.to_global(batch, sharding)))

    writer = metrics_lib.MetricWriter(workdir, bool(config.train.tensorboard))
    try:
        scalars = task.evaluate(run, 0, workdir)
        if scalars:
            writer.write(0, scalars)
    finally:
        writer.close()
    return scalars


def fresh_state(config, task, programs: Programs, checked: Checked, rng=None):
    """(state, rng) of a run that starts: params from the seed's init key, then the trees
    task.init_keys takes from task.init_source (a warm start), a fresh optimizer state."""
    rep = checked.replicated
    if rng is None:  # built by a jitted function: device_put cannot reach other processes
        rng = jax.jit(lambda: jax.random.key(int(config.train.seed)), out_shardings=rep)()
    state = state_lib.init_state(task.model, programs.tx, checked.mesh, checked.rules,
                                 jax.random.fold_in(rng, 0x5EED), task.init_inputs(),
                                 programs.shardings)
    if task.init_source is not None:
        state, rng = warm_start.warm_start(
            task.init_source, state, rng, programs.abstract, programs.shardings, programs.tx,
            rep, keys=task.init_keys, full=config.train.init_state == "full",
            resize=getattr(task, "init_resize", None))
    return state, rng


def train(config, workdir: str, task, *, checked: Optional[Checked] = None,
          programs: Optional[Programs] = None, progress: bool = True,
          after_save: Optional[Callable[[int], None]] = None,
          after_step: Optional[Callable[[int], None]] = None,
          fail_save_at: Optional[int] = None) -> Outcome:
    """Runs (or resumes) `task`'s training under `config` in `workdir`. `checked`:
    check(config) already done (a sweep's runs share it; checked here when not given).
    `programs`: those of a previous run of the same config and shapes. `after_save(step)`
    runs once a checkpoint is on disk, `after_step(step)` after each step (tests kill or
    preempt there); `fail_save_at`: the save of that step fails on this process (fault
    drills)."""
    run = _Run(config, workdir, task, checked, programs, progress, after_save, after_step,
               fail_save_at)
    return run.go()


class _Run:
    """One call of train(): the pieces the steps share."""

    def __init__(self, config, workdir, task, checked, programs, progress, after_save,
                 after_step, fail_save_at=None):
        self.config, self.task, self.progress = config, task, progress
        self.after_save, self.after_step = after_save, after_step
        self.is_main = jax.process_index() == 0
        self.workdir = paths.resolve(workdir)  # a local path, or a URI such as gs://bucket/run
        # --- everything that can fail cheaply fails before any compile, and before the
        # workdir is made (a mistake leaves nothing behind) --------------------------------
        paths.check_dir(self.workdir)
        self.checked = checked = checked or check(config)
        self.mesh = checked.mesh
        check_task(config, task)
        self.steps = run_steps(config, getattr(task, "train_examples", None))
        self.ckpt_every = checked.checkpoint_every  # 0: at the end only
        # The attention path each step will take on these devices (an explicit choice that
        # cannot run here fails now, naming model.attention).
        self.platform = platform_name(self.mesh.devices.flat[0].platform)
        self.kernels = attention_ops.describe(
            task.model_config, self.platform,
            deterministic_training=bool(config.train.deterministic),
            window=task.model_config.layer_window(1))
        self.resumable = bool(saved_steps(self.workdir))
        if checked.resize.active and getattr(task, "init_resize", None) is None:
            raise ConfigError(f"config.train.init_extend_positions / init_extend_vocab apply "
                              f"to pre-training warm starts, not to {task.title}; extend the "
                              f"model by a pre-training run first")
        if self.resumable:  # the run's own settings, as its checkpoints were trained with
            self.setting_changes = settings.check_resume(
                task.settings, self.workdir,
                accept=bool(config.train.get("accept_setting_changes", False)))
        if task.init_source is not None and not self.resumable:
            # Shapes only, from the source's metadata: before any data is read or compiled.
            warm_start.check_shapes(task.init_source,
                                    state_lib.abstract_params(task.model, task.init_inputs()),
                                    task.init_keys, getattr(task, "init_resize", None))
        self.batch_sharding = checked.batch_sharding
        self.rep = checked.replicated
        # The input is checked before anything is built or compiled (TFRecords built from
        # raw text go under the workdir, made for them).
        host_data = task.train_data(config, self.workdir)
        paths.makedirs(self.workdir)
        self.programs = programs or build(config, task, checked, self.steps)
        self.gate = InputGate(self.batch_sharding,
                              int(config.train.batch_size) // jax.process_count())
        self.writer = metrics_lib.MetricWriter(self.workdir, bool(config.train.tensorboard))
        c = config.checkpoint
        self.checkpointer = ckpt_lib.Checkpointer(
            self.workdir, every=self.ckpt_every, keep=c.keep,
            keep_period=c.get("keep_period", 0), async_save=c.async_save,
            timeout=int(c.get("timeout", 300)), fail_at_step=fail_save_at)
        self.config_dict = config_to_dict(config)
        self.unchecked: list[tuple[int, dict]] = []   # (step, device metrics) not flag-read
        self.nonfinite_skipped = 0
        # Last (go() closes it): a thread keeps `prefetch_to_device` batches on the devices
        # ahead of the step; its get_state() still names the next batch the step will see.
        self.train_data = data_device.DevicePrefetcher(
            host_data, self.batch_sharding,
            size=max(int(config.get("data", {}).get("prefetch_to_device", 2)), 1))

    # --- state ---------------------------------------------------------------------------

    def initial_state(self):
        """(state, rng): restored from the latest checkpoint that restores, warm-started
        from train.init_checkpoint, or fresh."""
        p, config = self.programs, self.config
        # Built by a jitted function: device_put cannot target non-addressable devices.
        rng = jax.jit(lambda: jax.random.key(int(config.train.seed)),
                      out_shardings=self.rep)()
        if self.resumable:
            # The newest step that restores; a damaged one is skipped, set aside and named.
            state, rng, saved = self.checkpointer.restore(p.abstract, self.train_data,
                                                          rng_sharding=self.rep)
            _check_same_seed(saved, config, self.checkpointer.directory)
            for bad, reason, moved in self.checkpointer.skipped:
                self.info(f"checkpoint at step {bad} skipped: {reason}; kept as {moved}")
            self.info(f"resumed from {self.checkpointer.directory}/"
                      f"{int(jax.device_get(state.step))}"
                      + _changes(getattr(self, "setting_changes", [])))
            restored = self.checkpointer.data_restore
            if restored is not None and not restored.exact:
                # Another process count (or a refused state): logged as a warning as well.
                self.info(f"the input data was NOT resumed exactly ({restored.reason}); "
                          f"every process skipped {restored.position} batches of its own "
                          f"stream instead")
            return state, rng
        state, rng = fresh_state(config, self.task, p, self.checked, rng)
        if self.task.init_source is not None:
            self.info(f"warm start from {self.task.init_source.path}"
                      + _changes(getattr(self.task, "init_changes", [])))
        return state, rng

    # --- checks, saves, evaluation --------------------------------------------------------

    def check_finite(self, lag: int = 0) -> None:
        """Reads the non-finite flags of all but the last `lag` unchecked steps (NonFiniteError
        unless train.skip_nonfinite): lag=1 after each step (the previous step's flag, done
        already: no stall), lag=0 before anything saves or evaluates the state."""
        while len(self.unchecked) > lag:
            at, m = self.unchecked.pop(0)
            self.gate.check(m, void_after=len(self.unchecked))
            self.nonfinite_skipped += count_nonfinite(m, at, self.config)

    def save(self) -> None:
        self.check_finite()
        self.checkpointer.save(self.state, self.rng, self.train_data, self.config_dict,
                               force=True)
        if self.after_save is not None:
            self.checkpointer.wait()
            self.after_save(int(jax.device_get(self.state.step)))

    def saved_first(self, error: ReportedError, step: int) -> ReportedError:
        """`error` (bad input met mid-run), after a save kept the steps done since the
        last checkpoint, with a message that says so."""
        if step <= self.start or self.checkpointer.latest_step() == step:
            return error
        self.save()
        return type(error)(f"{error} Saved step {step}, the last good one: the same command "
                           f"resumes from it.")

    def evaluate(self, step: int) -> dict:
        self.check_finite()
        if step == self.start:  # nothing trained since the restart: a finished run, again
            done, scalars = metrics_lib.recorded(self.workdir, step, self.task.eval_prefix)
            if done:
                return scalars
        params, eval_fn, sharding = self.state.params, self.programs.eval_fn, self.batch_sharding

        def run(batch):
            return jax.device_get(eval_fn(params, data_device.to_global(batch, sharding)))

        try:
            scalars = self.task.evaluate(run, step, self.workdir,
                                         int(self.config.train.eval_steps))
        except ReportedError as e:  # a corrupt or unparsable eval file
            raise self.saved_first(e, step) from None
        if scalars:
            self.writer.write(step, scalars)
            self.info(f"step {step}: " + metrics_lib.format_summary(scalars))
        return scalars

    # --- the steps -------------------------------------------------------------------------

    def go(self) -> Outcome:
        eval_scalars, preempted = {}, False
        try:  # a restore that fails (another seed, no step restores) closes what is open too
            self.state, self.rng = self.initial_state()
            self.start = int(jax.device_get(self.state.step))
            n_params = sum(int(np.prod(x.shape))
                           for x in jax.tree_util.tree_leaves(self.state.params))
            self.info(f"{self.task.title}: model {n_params / 1e6:.2f}M params, "
                      f"{self.task.model_config.describe_compute(self.platform)}; mesh "
                      f"{dict(self.mesh.shape)}; {jax.device_count()} "
                      f"{jax.devices()[0].platform} devices, {jax.process_count()} "
                      f"process(es); steps {self.start} -> {self.steps}; {self.kernels}")
            self.log = _Logger(self, self.progress)
            self.profiler = Profiler(os.path.join(self.workdir, "profile"), self.start,
                                     int(self.config.train.profile_start),
                                     int(self.config.train.profile_steps), self.is_main)
            t0 = time.perf_counter()
            with Preemption() as preemption:
                preempted = self.steps_until_done(preemption)
            if not preempted and (self.checkpointer.latest_step()
                                  != int(jax.device_get(self.state.step))):
                self.save()
            self.checkpointer.wait()  # the last save's failure is this run's error
            train_seconds = time.perf_counter() - t0
            if not preempted and int(self.config.train.eval_every) >= 0:
                eval_scalars = self.evaluate(self.steps)  # > 0: periodic and final; 0: final
        except VoidSteps as void:
            # Every process is here at the same step: the flag came out of the step itself.
            self.unchecked.clear()  # the void steps changed nothing, not even the counters
            step = int(jax.device_get(self.state.step))
            if void.kind == SAVE:  # nothing is saved after a failed save: the last good one
                self.save_failed = True
                try:  # this process's part of it: its own error if it failed here
                    self.checkpointer.wait()
                except CheckpointSaveError as e:
                    self.gate.fail(e)
                saved = saved_steps(self.workdir)
                raise void_error(self.gate, void, step, saved[-1] if saved else None) from None
            if self.gate.error is None:
                self.train_data.unread(void.steps)  # the resumed run reads them again
            raise self.saved_first(void_error(self.gate, void, step), step) from None
        except Exception as e:  # noqa: BLE001  (a failed collective: is a process lost?)
            coordination.suspect(e)
            raise
        finally:
            self.close()
        summary = dict(self.log.summary, **eval_scalars)
        summary.update({"step": int(jax.device_get(self.state.step)), "preempted": preempted,
                        "nonfinite_skipped": self.nonfinite_skipped,
                        "train_seconds": train_seconds, "kernels": self.kernels,
                        "peak_flops_source": self.log.peak_source})
        if self.is_main:
            _print_summary(summary, self.workdir, self.task)
        return Outcome(summary, self.state.params, preempted, self.programs)

    def steps_until_done(self, preemption) -> bool:
        """Steps from the start to train.steps; True if a SIGTERM stopped them (saved)."""
        step, eval_every = self.start, int(self.config.train.eval_every)
        coordination.watch(self.workdir, step)
        if preemption.noticed(step):  # a SIGTERM while the run started: stop before a step
            if self.checkpointer.latest_step() != step:
                self.save()
            self.preempted(step)
            return True
        while step < self.steps:
            try:
                batch = self.gate.next(self.train_data, first=self.programs.compiled is None)
            except ReportedError as e:  # bad input found mid-run, e.g. a corrupt shard
                raise self.saved_first(e, step) from None
            compiled = self.compile(batch)
            self.profiler.before(step)
            # Step markers for the profile viewer (no cost when no trace is running).
            with jax.profiler.StepTraceAnnotation("train", step_num=step + 1):
                self.state, metrics = compiled(self.state, batch, self.rng)
            step += 1
            coordination.watch(step=step)
            self.profiler.after(step, self.state)
            # A save that failed in the background (a full disk) stops the run here; with
            # several processes, every process at the same step (the gate's void steps).
            try:
                self.checkpointer.check()
            except CheckpointSaveError as e:
                if not self.gate.multi:
                    raise
                self.gate.fail(e)
            self.unchecked.append((step, metrics))
            self.check_finite(lag=1)
            self.log.step(step, metrics)
            if eval_every > 0 and step % eval_every == 0 and step != self.steps:
                self.evaluate(step)
                self.log.restart_clock()  # eval time is not step time
            if self.after_step is not None:
                self.after_step(step)
            if preemption.due(step):
                self.save()
                self.preempted(step)
                return True
            if self.ckpt_every > 0 and step % self.ckpt_every == 0:
                self.save()
        return False

    def preempted(self, step: int) -> None:
        """The SIGTERM's line: process 0's (one process), every process's (several)."""
        n = jax.process_count()
        if n == 1:
            self.info(f"preemption: saved step {step}; exiting")
        else:
            console.say(f"preempted: saved step {step} on all {n} processes; rerun the same "
                        f"command to resume")

    def compile(self, batch):
        if self.programs.compiled is None:
            t0 = time.perf_counter()
            self.programs.compiled = self.programs.train_fn.lower(
                self.state, batch, self.rng).compile()
            self.info(f"compiled the train step in {time.perf_counter() - t0:.1f}s")
        return self.programs.compiled

    def close(self) -> None:
        for part in ("profiler", "train_data", "checkpointer", "log", "writer"):
            if part == "checkpointer" and hasattr(self, part):
                # Waits, never raises; after a failed save on another process this one's
                # save of that step failed too: reported already, by the gate's error.
                self.checkpointer.close(quiet=getattr(self, "save_failed", False))
            elif hasattr(self, part):
                getattr(self, part).close()

    def info(self, msg: str) -> None:
        if self.is_main:
            console.say(msg)  # above the progress bar, never on its line


class _Logger:
    """Every log_every steps (and the last): the mean of the steps' metrics, throughput,
    MFU and real-token figures, to metrics.jsonl / TensorBoard and the progress bar."""

    def __init__(self, run: _Run, progress: bool):
        self.run, self.pending, self.summary = run, [], {}
        config, task = run.config, run.task
        self.every = max(int(config.train.log_every), 1)
        self.batch_size = int(config.train.batch_size)
        shape = task.shape
        self.flops = shape.sequences * metrics_lib.model_flops_per_example(
            task.model_config, shape.seq_len, shape.predictions, nsp=shape.nsp)
        self.peak, self.peak_source = metrics_lib.peak_flops_per_device()
        self.last_time, self.last_step = None, run.start
        self.bar = console.bar(run.is_main and progress, run.start, run.steps, task.title)

    def step(self, step: int, metrics: dict) -> None:
        self.pending.append(metrics)
        if self.bar is not None:
            self.bar.update(1)
        if step % self.every and step != self.run.steps:
            return
        self.run.check_finite()
        records = [step_lib.host_metrics(m) for m in self.pending]
        for r in records:
            r.pop("train/input_ok", None)
        scalars = metrics_lib.average(records)
        inputs = {k: scalars.pop(k) for k in metrics_lib.INPUT_STATS if k in scalars}
        now, step_time, shape = time.perf_counter(), None, self.run.task.shape
        if self.last_time is not None:
            step_time = (now - self.last_time) / max(step - self.last_step, 1)
            scalars.update(metrics_lib.throughput(
                step_time, self.batch_size, shape.seq_len * shape.sequences, self.flops,
                self.peak, jax.device_count()))
        scalars.update(metrics_lib.real_token_metrics(  # real (non-padding) tokens
            inputs, rows=self.batch_size * shape.sequences, seq_len=shape.seq_len,
            config=self.run.task.model_config, nsp=shape.nsp, step_time=step_time,
            peak_per_device=self.peak, num_devices=jax.device_count()))
        self.run.writer.write(step, scalars)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{scalars['train/loss']:.3f}",
                                 **({"seq/s": f"{scalars['perf/seq_per_s']:.1f}"}
                                    if "perf/seq_per_s" in scalars else {}))
        self.summary.update(scalars)
        self.pending = []
        self.last_time, self.last_step = time.perf_counter(), step

    def restart_clock(self) -> None:
        self.last_time = time.perf_counter()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _changes(changes: list[str]) -> str:
    return f" (settings changed on purpose: {', '.join(changes)})" if changes else ""


def _check_same_seed(saved: Optional[dict], config, directory: str) -> None:
    """A workdir's checkpoints continue the run of their own seed (a sweep keeps one run
    per seed); resuming them with another train.seed would mix two runs."""
    seed = ((saved or {}).get("train") or {}).get("seed")
    if seed is not None and int(seed) != int(config.train.seed):
        raise ConfigError(f"{directory}: saved by a run with train.seed={seed}, not "
                          f"{int(config.train.seed)}; use a new workdir")


def count_nonfinite(metrics: dict, step: int, config) -> int:
    """1 when the step's update was non-finite and skipped (train.skip_nonfinite), 0 when it
    was finite; NonFiniteError naming the step otherwise."""
    bad = float(jax.device_get(metrics["train/nonfinite"]))
    if bad and not config.train.skip_nonfinite:
        loss = float(jax.device_get(metrics["train/loss"]))
        gnorm = float(jax.device_get(metrics["train/grad_norm"]))
        raise NonFiniteError(
            f"non-finite loss or gradient at step {step} (loss={loss}, grad_norm={gnorm}); "
            f"stopped before saving anything from it. Lower the learning rate, check the "
            f"data, or set --config.train.skip_nonfinite=True to skip such updates.")
    return int(bad > 0)


SUMMARY_PERF = ("perf/step_time", "perf/seq_per_s", "perf/mfu", "perf/real_tokens_per_s",
                "perf/real_mfu", "data/padding_fraction")


def _print_summary(summary: dict, workdir: str, task) -> None:
    train = [k for k in sorted(summary) if k.startswith("train/") and k not in (
        "train/lr", "train/grad_norm", "train/param_norm", "train/nonfinite")]
    evals = [k for k in sorted(summary) if k.startswith(task.eval_prefix)]
    print(f"done at step {summary['step']}" + (" (preempted)" if summary["preempted"] else "")
          + ": " + metrics_lib.format_summary(summary, train + evals + list(SUMMARY_PERF)),
          flush=True)
    for line in task.describe(summary):
        print(line, flush=True)
    print(f"{summary['kernels']}; MFU against the {summary['peak_flops_source']}; metrics: "
          f"{os.path.join(workdir, 'metrics.jsonl')}; checkpoints: "
          f"{os.path.join(workdir, 'checkpoints')}", flush=True)
