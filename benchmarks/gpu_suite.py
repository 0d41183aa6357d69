r"""bert_jax's pre-training step against Hugging Face PyTorch's on the same GPU, and a
profile of our step, in one report.

    pip install "jax[cuda12]" flax optax orbax-checkpoint ml_collections torch transformers
    python benchmarks/gpu_suite.py          # report under $OUT, else /tmp/gpu_suite
    python benchmarks/gpu_suite.py --smoke --out=/tmp/smoke   # CPU, tiny sizes, minutes

Run it from the repository's root on a machine with one or more NVIDIA GPUs (bert_jax runs
from the checkout; TensorFlow is not needed). It measures three cases (base128, large128,
large512), each in its own process: bert_jax's step and its variants, HF torch eager, and
torch.compile for --compile_cases. Then it prints one table of step times, sequences per
second, MFU and the bert_jax / torch ratios, and the top kernels of a traced bert_jax step.

A whole run takes several minutes on a current data-center GPU. If your job runner limits a
command's time, run back-to-back calls, each with --deadline_s a little under the limit and
one or two cases, e.g.
    --cases=base128 --compile_cases=          (profile, variants, eager torch)
    --cases=large128 --profile_case= --skip_check      (remat=none row, torch.compile)
    --cases=large512 --profile_case= --compile_cases= --skip_check

On an H200 a BERT-Base row takes about 60 s of its child's time (26 s of it compiling), a
BERT-Large row about 115 s, a torch eager row about 20 s, the kernel check 35 s (measured
before it also checked the residual + LayerNorm and GELU kernels: allow a minute): a
15-minute device budget holds about ten rows (benchmarks/RESULTS.md).

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
