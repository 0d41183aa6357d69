"""What the suite's parent and its children share: the paths, the cases and each case's
config, the result line's prefix and the one-line error format."""

from __future__ import annotations

import math
import os

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCH)
SCRIPT = os.path.join(BENCH, "gpu_suite.py")  # the parent runs it again as each child

RESULT_PREFIX = "GPU_SUITE_RESULT "  # a child's answer: this prefix + one JSON line
CASES = {  # name: (config file, batch, seq)
    "base128": ("configs/bert_base.py", 256, 128),
    "large128": ("configs/bert_large.py", 256, 128),
    "large512": ("configs/bert_large.py", 32, 512),
    "packed512": ("configs/bert_large.py", 32, 512),
}
# Cases of packed rows (packed.py): name -> K, the most sequences a row holds.
PACKED = {"packed512": 3}
SMOKE_SHAPES = {"base128": (4, 32), "large128": (4, 32), "large512": (2, 64),
                "packed512": (2, 512)}
SMOKE_CONFIG = "configs/bert_tiny.py"
GIB = 1024 ** 3


def preds_for(seq: int) -> int:
    """MLM predictions per row: ceil(0.15 * seq), 20 at 128 (BERT's max_predictions_per_seq
    there), 77 at 512. (train_step.py's default, round(), gives 19 at 128.)"""
    return max(1, math.ceil(0.15 * seq - 1e-9))


def one_line(text: str, limit: int = 300) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def exc_line(e: BaseException) -> str:
    return one_line(f"{type(e).__name__}: {e}")


def case_config(spec: dict):
    """The case's config (locked as load_config leaves it), smoke-shrunk, with the
    variant's model overrides applied. An override of a key that is neither in the config's
    model section nor a BertConfig field raises ConfigError: unknown keys never run
    silently as the default (model.fp8 before the checkout has the FP8 option)."""
    import dataclasses

    from bert_jax.models import BertConfig, ConfigError  # the parent imports no bert_jax
    from bert_jax.train.config import load_config

    config = load_config(spec["config"])
    fields = {f.name for f in dataclasses.fields(BertConfig)}
    unknown = [k for k in spec.get("overrides", {}) if k not in config.model and k not in fields]
    if unknown:
        raise ConfigError(f"model.{unknown[0]} is neither a key of {spec['config']}'s model "
                          f"section nor a BertConfig field in this checkout: the variant "
                          f"cannot run here")
    if spec.get("smoke"):
        real = config
        config = load_config(SMOKE_CONFIG)
        with config.unlocked():
            for key in ("scan_layers", "scan_unroll", "remat"):
                if key in real.model:
                    config.model[key] = real.model[key]
    with config.unlocked():
        for key, value in spec.get("overrides", {}).items():
            config.model[key] = value
    return config
