"""Metric writing (process 0 only) and the throughput / MFU arithmetic.

    writer = MetricWriter(workdir)      # WORKDIR/metrics.jsonl + TensorBoard events
    writer.write(step, {"train/loss": 2.3, "perf/mfu": 0.41})

MFU = achieved model FLOP/s / peak FLOP/s of the devices. Model FLOPs count the matmuls of
the forward pass (2 FLOPs per multiply-add) times 3 for forward + backward; attention score
and context matmuls are included, elementwise work is not (the PaLM convention). The peak
comes from a table of per-device dense bf16 peaks by `device_kind`; on CPU (or an unknown
device) it is a float32 matmul ceiling measured at start-up on the host that runs it.

Real tokens. Padding costs compute but is no work: `input_stats` counts, inside the step,
the batch's real tokens, sequences (several per packed row), squared sequence lengths (the
attention's share) and predictions, and `real_token_metrics` turns them into
perf/real_tokens_per_s, perf/real_mfu (the FLOPs of those sequences alone, unpadded: what
packing gains shows here, while perf/mfu counts every row at full length) and the input's
data/padding_fraction and data/sequences_per_row.
"""

from __future__ import annotations

import json
import os
import time
from typing import Mapping

import jax
import numpy as np
from etils import epath

from bert_jax import paths

# Dense bf16 peak FLOP/s per JAX device, by a substring of `device.device_kind`
# (vendor data sheets; TPU v2/v3 expose one device per core, later TPUs one per chip).
PEAK_FLOPS = (
    ("TPU v2", 22.5e12),
    ("TPU v3", 61.5e12),
    ("TPU v4", 275e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5e", 197e12),
    ("TPU v5p", 459e12),
    ("TPU v5", 459e12),
    ("TPU v6 lite", 918e12),
    ("TPU v6e", 918e12),
    ("TPU7x", 2307e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("A100", 312e12),
    ("A10G", 125e12),
    ("L4", 121e12),
    ("V100", 125e12),
    ("T4", 65e12),
)


def model_flops(config, tokens: float, square_lengths: float, sequences: float,
                predictions: float, nsp: bool = True) -> float:
    """Training FLOPs (forward + backward = 3 x forward) of `sequences` sequences of
    `tokens` tokens in all (sum of their squared lengths `square_lengths`: attention
    compares the tokens of a sequence with each other) with `predictions` MLM outputs,
    for a BertConfig."""
    h, i, n, v = (config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                  config.vocab_size)
    per_layer = (tokens * 2 * h * 3 * h      # Q, K, V projections
                 + tokens * 2 * h * h        # attention output projection
                 + 2 * 2 * square_lengths * h  # scores Q K^T and context P V
                 + tokens * 2 * 2 * h * i)   # feed-forward in and out
    forward = n * per_layer
    forward += sequences * 2 * h * h         # pooler
    forward += predictions * (2 * h * h + 2 * h * v)  # MLM transform + tied decoder
    if nsp:
        forward += sequences * 2 * h * 2
    return 3.0 * forward


def model_flops_per_example(config, seq_len: int, max_predictions: int, nsp: bool = True) -> float:
    """Training FLOPs of one example of length `seq_len` with `max_predictions` MLM slots
    (every row at full length: what the hardware computes)."""
    return model_flops(config, seq_len, seq_len * seq_len, 1, max_predictions, nsp)


_MEASURED: dict = {}


def measure_matmul_flops(size: int = 1024, repeats: int = 5, dtype="float32") -> float:
    """FLOP/s of the best of `repeats` jitted [size, size] @ [size, size] matmuls on the
    default device: the practical ceiling of a CPU (cached per process)."""
    key = (size, dtype)
    if key not in _MEASURED:
        import jax.numpy as jnp

        a = jnp.ones((size, size), dtype)
        f = jax.jit(lambda x: x @ x)
        f(a).block_until_ready()
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            f(a).block_until_ready()
            best = min(best, time.perf_counter() - t)
        _MEASURED[key] = 2.0 * size ** 3 / best
    return _MEASURED[key]


def peak_flops_per_device(device=None) -> tuple[float, str]:
    """(peak FLOP/s, where it came from) for one device."""
    device = device or jax.devices()[0]
    kind = getattr(device, "device_kind", "")
    for name, peak in PEAK_FLOPS:
        if name.lower() in kind.lower():
            return peak, f"{kind} bf16 peak"
    return measure_matmul_flops(), f"measured float32 matmul ceiling of {kind or device.platform}"


def throughput(step_time: float, batch_size: int, seq_len: int, flops_per_example: float,
               peak_per_device: float, num_devices: int) -> dict:
    """perf/* metrics for one optimizer step of `batch_size` examples."""
    seq_per_s = batch_size / step_time
    return {"perf/step_time": step_time, "perf/seq_per_s": seq_per_s,
            "perf/tokens_per_s": seq_per_s * seq_len,
            "perf/mfu": seq_per_s * flops_per_example / (peak_per_device * num_devices)}


INPUT_STATS = ("input/tokens", "input/sequences", "input/square_lengths", "input/predictions")


def input_stats(batch) -> dict:
    """The real work in a (global) batch, float32 scalars (jnp, inside the jitted step):
    input/tokens (input_mask), input/sequences (rows, the choices of a multiple-choice
    example, or the sequences of packed rows), input/square_lengths (sum of squared
    sequence lengths), input/predictions (masked-LM outputs; 0 for the other tasks)."""
    import jax.numpy as jnp

    mask = batch["input_mask"].astype(jnp.float32)
    if "sequence_ids" in batch:  # packed rows: the tokens of each sequence k = 1..K
        k = batch["next_sentence_weights"].shape[-1]
        ids = batch["sequence_ids"][..., None] == jnp.arange(1, k + 1, dtype=jnp.int32)
        lengths = jnp.sum(ids, axis=1, dtype=jnp.float32)      # [batch, K]
    else:
        lengths = jnp.sum(mask, axis=-1)                        # [batch] or [batch, choices]
    weights = batch.get("masked_lm_weights")
    return {"input/tokens": jnp.sum(mask),
            "input/sequences": jnp.sum((lengths > 0).astype(jnp.float32)),
            "input/square_lengths": jnp.sum(lengths * lengths),
            "input/predictions": (jnp.zeros((), jnp.float32) if weights is None
                                  else jnp.sum(weights.astype(jnp.float32)))}


def real_token_metrics(stats: Mapping[str, float], *, rows: int, seq_len: int, config,
                       nsp: bool = True, step_time: float | None = None,
                       peak_per_device: float = 0.0, num_devices: int = 1) -> dict:
    """From the per-step means of input_stats (`rows` rows of `seq_len` tokens a step):
    data/padding_fraction, data/sequences_per_row and, with step_time,
    perf/real_tokens_per_s and perf/real_mfu (model_flops of the real sequences only)."""
    if "input/tokens" not in stats:
        return {}
    out = {"data/padding_fraction": 1.0 - stats["input/tokens"] / (rows * seq_len),
           "data/sequences_per_row": stats["input/sequences"] / rows}
    if step_time:
        flops = model_flops(config, stats["input/tokens"], stats["input/square_lengths"],
                            stats["input/sequences"], stats["input/predictions"], nsp)
        out["perf/real_tokens_per_s"] = stats["input/tokens"] / step_time
        out["perf/real_mfu"] = flops / step_time / (peak_per_device * num_devices)
    return out


class MetricWriter:
    """Appends one JSON object per call to WORKDIR/metrics.jsonl and writes TensorBoard
    scalars under WORKDIR/tensorboard (TensorFlow's event writer, imported lazily: a run
    without TensorFlow still gets the JSONL; the `tensorboard` package is not needed).
    Only process 0 writes; on other processes every method is a no-op."""

    def __init__(self, workdir: str, tensorboard: bool = True):
        self.active = jax.process_index() == 0
        self._tb = None
        self._jsonl = None
        if not self.active:
            return
        paths.makedirs(workdir)
        # epath: a local file, or gfile's append on gs:// (each flush uploads the file).
        self._jsonl = epath.Path(workdir, "metrics.jsonl").open("a", encoding="utf-8")
        if tensorboard:
            try:
                import tensorflow as tf

                tf.config.set_visible_devices([], "GPU")  # keep TF off the accelerators
                self._tf = tf
                self._tb = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))
            except Exception:  # noqa: BLE001  (no TF or no tensorboard: JSONL only)
                self._tb = None

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        if not self.active:
            return
        record = {"step": int(step)}
        record.update({k: float(v) for k, v in scalars.items()})
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            # Classic simple_value summaries: TensorBoard's scalar dashboard reads them,
            # and writing them needs only TensorFlow (tf.summary.scalar needs tensorboard).
            pb = self._tf.compat.v1.Summary(value=[
                self._tf.compat.v1.Summary.Value(tag=k, simple_value=float(v))
                for k, v in scalars.items()])
            with self._tb.as_default():
                self._tf.summary.experimental.write_raw_pb(
                    pb.SerializeToString(), step=int(step))
            self._tb.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def average(records: list[Mapping[str, float]]) -> dict:
    """Mean of each key over the steps of a log interval (NaN-aware: a skipped non-finite
    step does not turn the interval's mean into NaN)."""
    keys = sorted({k for r in records for k in r})
    out = {}
    for k in keys:
        vals = np.asarray([r[k] for r in records if k in r], np.float64)
        finite = vals[np.isfinite(vals)]
        out[k] = float(finite.mean()) if finite.size else float("nan")
    if "train/nonfinite" in out:
        out["train/nonfinite"] = float(sum(r.get("train/nonfinite", 0.0) for r in records))
    return out


def format_summary(scalars: Mapping[str, float], keys=None) -> str:
    keys = keys or sorted(scalars)
    return " ".join(f"{k}={scalars[k]:.4g}" for k in keys if k in scalars)


def read_jsonl(path: str) -> list[dict]:
    with epath.Path(path).open("r", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def recorded(workdir: str, step: int, prefix: str = "eval/") -> tuple[bool, dict]:
    """(whether WORKDIR/metrics.jsonl already holds `prefix`* scalars for `step`, those
    scalars): a finished run started again reports its final evaluation instead of running
    it and appending it twice. Process 0 reads the file and every process gets its answer
    (the evaluation it decides about is collective); the scalars only on process 0."""
    found: dict = {}
    path = paths.join(workdir, "metrics.jsonl")
    if jax.process_index() == 0 and paths.is_file(path):
        for record in read_jsonl(path):
            if record.get("step") == step and any(k.startswith(prefix) for k in record):
                found = {k: v for k, v in record.items() if k.startswith(prefix)}
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return bool(int(multihost_utils.broadcast_one_to_all(np.int32(bool(found))))), found
    return bool(found), found
