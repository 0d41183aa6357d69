r"""bert_jax's pre-training step against Hugging Face PyTorch's on the same GPU, and a
profile of our step, in one report.

    pip install "jax[cuda12]" flax optax orbax-checkpoint ml_collections torch transformers
    python benchmarks/gpu_suite.py --part=1     # report under $OUT, else /tmp/gpu_suite
    python benchmarks/gpu_suite.py --part=2     # (another $OUT or --out)
    python benchmarks/gpu_suite.py --smoke --out=/tmp/smoke   # CPU, tiny sizes, minutes

Run it from the repository's root on a machine with one or more NVIDIA GPUs (bert_jax runs
from the checkout; TensorFlow is not needed). It measures four cases, each measurement in
its own process: BERT-Base 256 x 128 (base128), BERT-Large 256 x 128 (large128) and 32 x
512 (large512), and BERT-Large on 32 x 512 rows packed with the held-out sample's
sequences (packed512, real tokens a second). Per case: bert_jax's default row, then HF
torch eager and torch.compile, then the variants: base128 with `attention=cudnn` (cuDNN's
fused attention with its own dropout, against the default row's Pallas kernel with the
hash dropout: the whole-step half of the attention decision, the sweep's the other), and
FP8 (`fp8=true`, the config's model.fp8). Every row says how long its process took to its
first step (init + compile). Then one table of step times, sequences and real tokens a
second, MFU and the bert_jax / torch ratios, and the top kernels of a traced bert_jax step.
The kernel check before them (benchmarks/gpu/kernel_check.py) checks every path the rows
take on this device: Pallas, cuDNN without dropout and cuDNN with its own dropout (its
masks read back, benchmarks/attention_masks.py), the residual + LayerNorm and GELU kernels.

The default run is two back-to-back calls of under 10 minutes each (--part=1, --part=2;
each stops starting measurements at 560 s, --deadline_s, and prints its table). Per row,
from the H200 run of benchmarks/RESULTS.md (2026-11-25: a BERT-Base row about 60 s of its
child's time, 26 s of it compiling, 65 s traced; a BERT-Large row about 115 s; a torch
eager row about 20 s for Base, 25 s for Large; the kernel check about 60 s) and guesses
(the version probe 10 s; cuDNN's dropout masks in the kernel check 30 s; the cuDNN row as
a Pallas one, 60 s; a torch.compile row its eager row plus 70 s of compiling for Base,
130 s for Large, never yet measured):
    part 1: probe 10 + check 90 + base128 (bert_jax 65 traced, eager 20, compile 90,
            attention=cudnn 60) + large128 (bert_jax 115, eager 25) = 475 s; large128
            FP8 (115) only with time left.
    part 2: probe 10 + large512 (bert_jax 115, eager 25, compile 155, FP8 115)
            + packed512 115 = 535 s; packed512 FP8 only with time left.
large128's torch.compile row (about 155 s) fits neither part: a session with time to
spare runs `--cases=large128 --compile_cases=large128 --variants= --profile_case=`
(about 190 s). The rows' first-step times of the first run replace the guesses. Without
--part one run takes every row (about 23 minutes). Other splits: --cases, --variants
('extra': the older variant rows), --compile_cases, --profile_case, --skip_check,
--skip_mask_check, --deadline_s. benchmarks/gpu_session.sh is a 15-minute device
session's selection (benchmarks/RESULTS.md, "First GPU run: what it must show").

With device time left after the suite, run benchmarks/attention_sweep.py (a few minutes):
the attention kernels alone, the Pallas tilings against cuDNN and torch's SDPA.

Figures compare only within one report. The cases, variants and the table's columns are
described in benchmarks/gpu/ (suite.py, report.py).
"""

from __future__ import annotations

import os
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(BENCH), BENCH):  # bert_jax, then pretrain_step / gpu
    if path not in sys.path:
        sys.path.insert(0, path)

from gpu import suite  # noqa: E402


def main(argv=None) -> int:
    return suite.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
