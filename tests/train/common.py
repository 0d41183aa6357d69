"""Shared helpers for the training tests: a very small run config, hand-built batches and a
deterministic in-memory batch source with the input pipeline's get_state / set_state."""

from __future__ import annotations

import numpy as np

VOCAB = 128
LENGTH = 16
PREDICTIONS = 4


def tiny_config(steps: int = 5, batch_size: int = 8, **sections):
    """A run config small enough for subprocess tests: vocab 128, H 32, 2 layers, 4 heads
    (tensor=4 divides heads and mlp), float32, no dropout, fixed lr (no warmup)."""
    import ml_collections

    from bert_jax.data.pretrain import data_config
    from bert_jax.models.config import model_config
    from bert_jax.train.config import add_training_sections

    config = ml_collections.ConfigDict()
    config.model = model_config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=4, intermediate_size=64,
                                max_position_embeddings=64)
    config.model.nsp = True
    # source="synthetic" for launch/train.py runs; in-process tests pass memory_data.
    config.data = data_config(
        source="synthetic", max_seq_length=LENGTH, max_predictions_per_seq=PREDICTIONS,
        vocab_size=VOCAB, cls_id=2, sep_id=3, mask_id=4)
    add_training_sections(
        config,
        schedule=dict(lr=1e-3, warmup_steps=0, decay="constant"),
        train=dict(batch_size=batch_size, eval_batch_size=batch_size, steps=steps,
                   log_every=1, eval_every=-1, deterministic=True),
        checkpoint=dict(every=1000, keep=3))
    for name, overrides in sections.items():
        getattr(config, name).update(overrides)
    return config



def text_config(text_files: str):
    """tiny_config training on raw text (data.text_files) with uncased BERT's vocabulary."""
    config = tiny_config()
    config.model.vocab_size = 30522
    config.data.source = "tfrecord"
    config.data.text_files = text_files
    return config

def random_batch(seed: int, batch: int, length: int = LENGTH, predictions: int = PREDICTIONS,
                 vocab: int = VOCAB, padded_tail: bool = True) -> dict:
    """A valid pre-training batch with real padding: variable lengths, masked-LM slots with
    weight 0, both NSP labels. Deterministic in `seed`."""
    rs = np.random.RandomState(seed)
    lengths = rs.randint(length // 2, length + 1, size=batch)
    pos = np.arange(length)[None, :]
    input_mask = (pos < lengths[:, None]).astype(np.int32)
    input_ids = rs.randint(5, vocab, size=(batch, length)).astype(np.int32) * input_mask
    segment_ids = ((pos >= (lengths // 2)[:, None]) & (input_mask > 0)).astype(np.int32)
    n_pred = rs.randint(1, predictions + 1, size=batch) if padded_tail else np.full(batch, predictions)
    positions = np.zeros((batch, predictions), np.int32)
    weights = np.zeros((batch, predictions), np.float32)
    ids = np.zeros((batch, predictions), np.int32)
    for b in range(batch):
        p = np.sort(rs.choice(np.arange(1, lengths[b]), size=n_pred[b], replace=False))
        positions[b, :n_pred[b]] = p
        weights[b, :n_pred[b]] = 1.0
        ids[b, :n_pred[b]] = input_ids[b, p]
        input_ids[b, p] = 4  # [MASK]
    return dict(input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids,
                masked_lm_positions=positions, masked_lm_ids=ids, masked_lm_weights=weights,
                next_sentence_labels=rs.randint(0, 2, size=(batch, 1)).astype(np.int32))


class MemorySource:
    """Batch i of the global stream is random_batch(1000 + i); each process yields its own
    contiguous rows of it. State: the index of the next batch."""

    def __init__(self, batch_size: int, process_index: int = 0, process_count: int = 1):
        self.batch_size, self.pi, self.pc = batch_size, process_index, process_count
        self.index = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        full = random_batch(1000 + self.index, self.batch_size)
        self.index += 1
        rows = self.batch_size // self.pc
        return {k: v[self.pi * rows:(self.pi + 1) * rows] for k, v in full.items()}

    def get_state(self) -> dict:
        from bert_jax.data.state import pack_meta

        return {"index": np.asarray(self.index, np.int64),
                "meta": pack_meta({"kind": "memory", "batches": self.index})}

    def set_state(self, state: dict) -> None:
        self.index = int(state["index"])

    def seek(self, batches: int) -> None:
        """The restore fallback onto another process count: batch i of the global stream
        does not depend on the layout, so this one is exact."""
        self.index = int(batches)


def memory_data(config, workdir):  # noqa: ARG001  (make_train_data signature)
    import jax

    return MemorySource(int(config.train.batch_size), jax.process_index(), jax.process_count())


def memory_eval_data(config, workdir):  # noqa: ARG001
    import jax

    n, pc, pi = int(config.train.eval_batch_size), jax.process_count(), jax.process_index()
    rows = n // pc
    return [{k: v[pi * rows:(pi + 1) * rows] for k, v in random_batch(7 + i, n).items()}
            for i in range(2)]


def tiny_state(config=None, seed: int = 0) -> dict:
    """The sharded pieces of a run of `config` (default `tiny_config()`) on its mesh, as the
    trainer builds them: config, mesh, rules, model, tx, schedule, abstract, shardings, a
    `fresh()` that initialises a new state from `seed`, and one such `state`."""
    import jax

    from bert_jax import optim
    from bert_jax import sharding as sharding_lib
    from bert_jax.train import state as state_lib
    from bert_jax.train.config import total_steps

    from bert_jax.tasks.pretraining import PretrainingTask

    config = tiny_config() if config is None else config
    task = PretrainingTask(config, "")  # no init_checkpoint: the workdir is not read
    mesh = sharding_lib.make_mesh(config.mesh)
    rules = sharding_lib.rules_from_config(config.mesh)
    model = task.model
    tx = optim.make_optimizer(config.optimizer, config.schedule, total_steps(config))
    schedule = optim.make_schedule(config.schedule, total_steps(config))
    abstract, shardings = state_lib.state_shardings(
        model, tx, mesh, rules, state_lib.dummy_inputs(LENGTH, PREDICTIONS))

    def fresh():
        return state_lib.init_state(model, tx, mesh, rules, jax.random.key(seed),
                                    state_lib.dummy_inputs(LENGTH, PREDICTIONS), shardings)
    return dict(config=config, task=task, mesh=mesh, rules=rules, model=model, tx=tx,
                schedule=schedule, abstract=abstract, shardings=shardings, fresh=fresh,
                state=fresh())


def sigterm_when_logged(cmd, env, log, lines: int = 3, timeout: float = 300, cwd=None) -> str:
    """Start `cmd`, wait until the file `log` has `lines` lines, send SIGTERM, and check the
    process exits 0 (a preempted run saves and exits cleanly). Returns its stdout."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= lines:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, stderr[-3000:]
    return stdout


def traced_steps(profile_dir) -> list[int]:
    """The step numbers marked in the one jax.profiler trace under `profile_dir`."""
    import jax

    traces = list(profile_dir.glob("plugins/profile/*/*.xplane.pb"))
    assert len(traces) == 1, traces
    data = jax.profiler.ProfileData.from_file(str(traces[0]))
    return sorted(int(dict(e.stats)["step_num"]) for plane in data.planes
                  for line in plane.lines for e in line.events if e.name == "train")


def free_port() -> int:
    """A localhost port free now (for jax.distributed's coordinator)."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch_processes(worker: str, args, env: dict, cwd, timeout: float = 240,
                     processes: int = 2) -> list[tuple[int, str, str]]:
    """Runs `worker i address *args` for i = 0 .. processes - 1 at once (jax.distributed
    on a free localhost port): [(exit code, stdout, stderr)]; an AssertionError if one hangs."""
    import subprocess
    import sys

    address = f"localhost:{free_port()}"
    procs = [subprocess.Popen([sys.executable, worker, str(i), address, *map(str, args)],
                              cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(processes)]
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("a process hung (the failure did not reach every process)")
        out.append((p.returncode, stdout, stderr))
    return out
