r"""The trainer's step compiled under several sets of XLA compiler options, alternated step
by step in one process: which options make the step faster on the host that runs it.

    python benchmarks/compiler_options.py --config=configs/bert_base.py --batch=8 --seq=128 \
        --variant='ynn_dot_only:xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_DOT' \
        --variant='no_ynn:xla_cpu_experimental_ynn_fusion_type='
    python benchmarks/compiler_options.py --config=configs/bert_base.py --dtype=bfloat16 \
        --batch=64 --variant='no_triton_gemm:xla_gpu_enable_triton_gemm=false'

Each --variant is NAME:KEY=VALUE[;KEY=VALUE...] (DebugOptions fields, as XLA_FLAGS spells
them without the leading dashes; true / false / integers are converted). The step is
lowered once (`benchmarks/pretrain_step.py`, as launch/train.py builds it) and compiled for
the default options and for every variant; then every round runs one step of each, in
turn, on the same state, and the script prints per variant the median and best step time,
its ratio to the default's median, and the loss of its steps (the numbers differ with the
data order only, unless an option changes the arithmetic). Taking one variant's step
after another's on the shared state keeps machine noise out of the ratios, which separate
runs on a shared CPU do not.

Read a ratio within the spread of the rounds' step times as no difference. The XLA:CPU dot
backends compared so far, and their figures, are in benchmarks/RESULTS.md ("XLA:CPU dot
backends").
"""

from __future__ import annotations

import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from absl import app, flags  # noqa: E402
from pretrain_step import build, define_step_flags, step_config  # noqa: E402

FLAGS = flags.FLAGS
define_step_flags()
flags.DEFINE_integer("rounds", 4, "Timed rounds (one step of every variant each).")
flags.DEFINE_multi_string("variant", [], "NAME:KEY=VALUE[;KEY=VALUE...]")


def parse_variant(text: str) -> tuple[str, dict]:
    """'name:key=value;key=value' -> (name, {key: value}); true/false/ints converted."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise ValueError(f"--variant={text!r}: expected NAME:KEY=VALUE[;KEY=VALUE...]")
    options = {}
    for item in filter(None, rest.split(";")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--variant={text!r}: {item!r} is not KEY=VALUE")
        key = key.strip().lstrip("-")
        low = value.strip().lower()
        if low in ("true", "false"):
            options[key] = low == "true"
        elif low.lstrip("-").isdigit():
            options[key] = int(low)
        else:
            options[key] = value.strip()
    return name, options


def main(argv):
    del argv
    import jax

    variants = dict(parse_variant(v) for v in FLAGS.variant)
    if "default" in variants:
        raise ValueError("--variant: the name 'default' is the step without options")
    config = step_config(FLAGS.config, FLAGS.dtype)
    built = build(config, FLAGS.batch, FLAGS.seq, max(1, int(round(0.15 * FLAGS.seq))))
    compiled = {"default": built["compiled"]}
    print(f"default: compiled in {built['compile_s']:.1f} s")
    for name, options in variants.items():
        t = time.perf_counter()
        try:
            compiled[name] = built["lowered"].compile(compiler_options=options)
        except Exception as e:  # an unknown option or value: say which, go on
            print(f"{name}: {options} not compiled: {str(e).splitlines()[0][:300]}")
            continue
        print(f"{name}: {options}, compiled in {time.perf_counter() - t:.1f} s")
    state, batches, rng = built["state"], built["batches"], built["rng"]
    times = {name: [] for name in compiled}
    losses = {name: [] for name in compiled}
    for r in range(FLAGS.rounds + 1):  # round 0 warms every executable up, untimed
        for i, (name, fn) in enumerate(compiled.items()):
            time.sleep(0.2)
            t = time.perf_counter()
            state, m = fn(state, batches[(r * len(compiled) + i) % 2], rng)
            loss = float(jax.block_until_ready(m)["train/loss"])
            if r:
                times[name].append(time.perf_counter() - t)
                losses[name].append(loss)
    base = statistics.median(times["default"])
    print(f"\n{jax.device_count()} x {jax.devices()[0].device_kind}, batch {FLAGS.batch} x "
          f"{FLAGS.seq}, {FLAGS.dtype}, {FLAGS.rounds} rounds; load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'variant':>16} {'median s':>9} {'best s':>8} {'ratio':>6}  losses")
    for name in compiled:
        med = statistics.median(times[name])
        print(f"{name:>16} {med:9.3f} {min(times[name]):8.3f} {med / base:6.3f}  "
              + " ".join(f"{x:.4f}" for x in losses[name]))


if __name__ == "__main__":
    app.run(main)
