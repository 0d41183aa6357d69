"""Optimizers for pre-training and fine-tuning, all from optax.

    optimizer = make_optimizer(config.optimizer, config.schedule, total_steps)

  * AdamW (paper: b1 0.9, b2 0.999, eps 1e-6, decoupled weight decay 0.01) or LAMB
    (You et al. 2019, for the large-batch recipe), both with weight decay masked off the
    LayerNorm parameters and every bias (`decay_mask`);
  * learning rate: linear warmup, then polynomial (power 1 = the paper's linear) or cosine
    decay to `schedule.end_lr`;
  * gradients clipped to global norm `optimizer.clip_norm` (1.0 as the original) first.

Gradient accumulation is not an optax wrapper here: `train/step.py` scans over
micro-batches inside the jitted step and hands one summed gradient to this optimizer, which
keeps the update exactly that of the large batch (see `train/step.py`).
"""

from __future__ import annotations

from typing import Any

import jax
import optax

OPTIMIZERS = ("adamw", "lamb")
DECAYS = ("polynomial", "linear", "cosine", "constant")


def make_schedule(schedule, total_steps: int) -> optax.Schedule:
    """Learning-rate schedule from a config's `schedule` section.

    schedule.lr: peak learning rate; schedule.warmup_steps: linear ramp 0 -> lr;
    schedule.decay: polynomial | linear | cosine | constant over the remaining
    `total_steps - warmup_steps` steps down to schedule.end_lr (polynomial uses
    schedule.power; linear is polynomial with power 1, the paper's choice).
    """
    lr, warmup = float(schedule.lr), int(schedule.warmup_steps)
    end_lr = float(schedule.get("end_lr", 0.0))
    decay = schedule.get("decay", "linear")
    if decay not in DECAYS:
        raise ValueError(f"config.schedule.decay={decay!r}; expected one of {DECAYS}")
    if warmup < 0 or total_steps <= 0:
        raise ValueError(
            f"config.schedule.warmup_steps={warmup} and total steps {total_steps} must be "
            ">= 0 and > 0")
    decay_steps = max(total_steps - warmup, 1)
    if decay == "constant":
        after = optax.constant_schedule(lr)
    elif decay == "cosine":
        after = optax.cosine_decay_schedule(lr, decay_steps, alpha=end_lr / lr if lr else 0.0)
    else:
        power = 1.0 if decay == "linear" else float(schedule.get("power", 1.0))
        after = optax.polynomial_schedule(lr, end_lr, power, decay_steps)
    if warmup == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), after], [warmup])


def _path_names(path) -> tuple[str, ...]:
    """Dict keys along a pytree path (flax's boxes add attribute keys, which we skip)."""
    return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def decays(names: tuple[str, ...]) -> bool:
    """True for matrices (Dense / DenseGeneral `kernel`, embedding tables); False for
    biases (`bias`, the MLM `output_bias`) and LayerNorm `scale` / `bias`. The original
    BERT excludes exactly "LayerNorm", "layer_norm" and "bias" by name; our parameter names
    are regular, so the leaf name decides."""
    return bool(names) and names[-1] in ("kernel", "embedding")


def decay_mask(params: Any) -> Any:
    """Tree of bools like `params` (boxed or not): True where weight decay applies."""
    return jax.tree_util.tree_map_with_path(lambda p, _: decays(_path_names(p)), params)


def make_optimizer(optimizer, schedule, total_steps: int) -> optax.GradientTransformation:
    """optax transformation from the config's `optimizer` and `schedule` sections.

    optimizer.name: adamw | lamb; b1, b2, eps, weight_decay; clip_norm (<= 0: no clipping).
    """
    name = optimizer.name
    if name not in OPTIMIZERS:
        raise ValueError(f"config.optimizer.name={name!r}; expected one of {OPTIMIZERS}")
    lr = make_schedule(schedule, total_steps)
    kwargs = dict(b1=float(optimizer.b1), b2=float(optimizer.b2), eps=float(optimizer.eps),
                  weight_decay=float(optimizer.weight_decay), mask=decay_mask)
    core = optax.adamw(lr, **kwargs) if name == "adamw" else optax.lamb(lr, **kwargs)
    clip = float(optimizer.get("clip_norm", 1.0))
    if clip > 0:
        return optax.chain(optax.clip_by_global_norm(clip), core)
    return core


def learning_rate(schedule, total_steps: int, step) -> Any:
    """The learning rate used for the update at `step` (0-based), for metrics."""
    return make_schedule(schedule, total_steps)(step)
