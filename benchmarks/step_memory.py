r"""What the compiled pre-training step holds in device memory, on any machine.

    python benchmarks/step_memory.py --config=configs/bert_large.py --batch=256 --seq=128 --target=h100
    python benchmarks/step_memory.py --config=configs/bert_tiny.py --batch=8 --seq=128 --target=cpu

Lowers the trainer's own step (bert_jax.train.step, MLM + NSP, AdamW, dropout on, one
device) on abstract inputs (`jax.ShapeDtypeStruct`: nothing is allocated), compiles it and
prints `memory_analysis()`: the arguments (params, optimizer state, batch), the outputs, the
temporaries (activations kept for the backward pass, gradients, workspace) and the temp
bytes per example per layer. The last line is the temp figure in GiB.

--target=h100 compiles for an NVIDIA H100 SXM on a machine without a GPU: it needs the
`jax-cuda12-plugin` and `jax-cuda12-pjrt` wheels matching the installed jax (not a
dependency of bert_jax) and reads the device description from --gpu_target_config
(default ../shared/gpu/h100_sxm.txtpb beside the repo). On a machine with a GPU,
--target=device compiles for the local device. --target=cpu uses the host.

The model section's remat policy, attention implementation and dtype come from the config
and can be overridden as usual (`--config.model.remat=...`); --dtype sets model.dtype
(default bfloat16, the accelerator setting).
"""

from __future__ import annotations

import math
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Run config (model section used).")
flags.DEFINE_integer("batch", 8, "Global batch size.")
flags.DEFINE_integer("seq", 128, "Sequence length.")
flags.DEFINE_integer("predictions", None, "MLM slots per example (default: ceil(0.15 * "
                     "seq): 20 at 128 as BERT's data, 77 at 512; as gpu_suite.py).")
flags.DEFINE_string("dtype", "bfloat16", "Compute dtype (params stay float32).")
flags.DEFINE_enum("target", "cpu", ["cpu", "h100", "device"], "What to compile for.")
flags.DEFINE_string("gpu_target_config",
                    os.path.join(os.path.dirname(_ROOT), "shared", "gpu", "h100_sxm.txtpb"),
                    "GPU target description (text proto) for --target=h100.")
flags.DEFINE_bool("dropout", True, "Dropout on (as in training).")
flags.mark_flags_as_required(["config"])

GIB = 2.0**30
MIB = 2.0**20


def main(argv):
    del argv
    if FLAGS.target == "h100":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    import jax

    from bert_jax.train import step_memory

    devices = None
    if FLAGS.target == "h100":
        devices = step_memory.gpu_target_devices(FLAGS.gpu_target_config)
    elif FLAGS.target == "cpu":
        devices = jax.devices("cpu")[:1]
    else:
        devices = jax.devices()[:1]
    config = FLAGS.config
    with config.unlocked():
        config.model.dtype = FLAGS.dtype
    preds = FLAGS.predictions or max(1, math.ceil(0.15 * FLAGS.seq - 1e-9))
    report = step_memory.analyze(config, FLAGS.batch, FLAGS.seq, preds, devices=devices,
                                 dropout=FLAGS.dropout)
    m = report["model"]
    print(f"model: L={m.num_hidden_layers} H={m.hidden_size} A={m.num_attention_heads} "
          f"dtype {m.dtype}, remat {m.remat}, attention {report['attention']}, "
          f"scan_layers {m.scan_layers}")
    print(f"step: batch {FLAGS.batch} x {FLAGS.seq}, {preds} MLM slots, dropout "
          f"{'on' if FLAGS.dropout else 'off'}; compiled for {report['device']} "
          f"in {report['compile_s']:.1f} s")
    for key in ("argument", "output", "alias"):
        print(f"{key}: {report[key] / GIB:.3f} GiB")
    per = report["temp"] / (FLAGS.batch * m.num_hidden_layers)
    print(f"temp per example per layer: {per / MIB:.3f} MiB")
    print(f"peak estimate (argument + output - alias + temp): {report['peak'] / GIB:.3f} GiB")
    print(f"temp: {report['temp'] / GIB:.3f} GiB")


if __name__ == "__main__":
    app.run(main)
