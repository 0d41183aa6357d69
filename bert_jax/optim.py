"""Optimizers for pre-training and fine-tuning, all from optax.

    optimizer = make_optimizer(config.optimizer, config.schedule, total_steps)

  * AdamW (paper: b1 0.9, b2 0.999, eps 1e-6, decoupled weight decay 0.01) or LAMB
    (You et al. 2019, for the large-batch recipe), both with weight decay masked off the
    LayerNorm parameters and every bias (`decay_mask`); LAMB also leaves those out of the
    layer-wise trust ratio (`lamb` below);
  * learning rate: linear warmup, then polynomial (power 1 = the paper's linear) or cosine
    decay to `schedule.end_lr`;
  * two conventions (Hugging Face's by default, as `transformers` + `torch.optim.AdamW`
    train): Adam with bias correction, and a decay from the peak over the steps after
    warmup. google-research/bert's `AdamWeightDecayOptimizer` has no bias correction
    (`optimizer.bias_correction=False`: `scale_by_adam_uncorrected`) and decays over all
    steps from step 0, the warmup replacing the rate while it lasts
    (`schedule.decay_from="start"`);
  * gradients clipped to global norm `optimizer.clip_norm` (1.0 as the original) first;
  * optionally, layer-wise learning-rate decay for fine-tuning (`optimizer.layer_decay`,
    `with_layer_decay`): lower layers move less than the top ones.

Gradient accumulation is not an optax wrapper here: `train/step.py` scans over
micro-batches inside the jitted step and hands one summed gradient to this optimizer, which
keeps the update exactly that of the large batch (see `train/step.py`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.models.config import ConfigError

OPTIMIZERS = ("adamw", "lamb")
DECAYS = ("polynomial", "linear", "cosine", "constant")
DECAY_FROM = ("peak", "start")


def make_schedule(schedule, total_steps: int) -> optax.Schedule:
    """Learning-rate schedule from a config's `schedule` section.

    schedule.lr: peak learning rate; schedule.warmup_steps: linear ramp 0 -> lr (< 0:
    schedule.warmup_ratio of `total_steps`, rounded, as fine-tuning recipes give it);
    schedule.decay: polynomial | linear | cosine | constant over the remaining
    `total_steps - warmup_steps` steps down to schedule.end_lr (polynomial uses
    schedule.power; linear is polynomial with power 1, the paper's choice).
    schedule.decay_from: "peak" (the above: step t >= W decays over T - W steps, Hugging
    Face's get_linear_schedule_with_warmup) or "start" (google-research/bert's
    create_optimizer: the decay runs over all T steps from step 0, lr (1 - t / T) for
    linear, and the warmup's lr t / W replaces it for t < W).
    """
    lr, warmup = float(schedule.lr), warmup_steps(schedule, total_steps)
    end_lr = float(schedule.get("end_lr", 0.0))
    decay = schedule.get("decay", "linear")
    if decay not in DECAYS:
        raise ConfigError(f"config.schedule.decay={decay!r}; expected one of {DECAYS}")
    if warmup < 0 or total_steps <= 0:
        raise ConfigError(
            f"config.schedule.warmup_steps={warmup} and total steps {total_steps} must be "
            ">= 0 and > 0")
    decay_from = schedule.get("decay_from", "peak")
    if decay_from not in DECAY_FROM:
        raise ConfigError(f"config.schedule.decay_from={decay_from!r}; expected one of "
                          f"{DECAY_FROM}")
    if decay_from == "start":
        return _decay_from_start(_decay(schedule, decay, lr, end_lr, total_steps), lr, warmup)
    after = _decay(schedule, decay, lr, end_lr, max(total_steps - warmup, 1))
    if warmup == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), after], [warmup])


def _decay(schedule, decay: str, lr: float, end_lr: float, decay_steps: int) -> optax.Schedule:
    """The decay part of the schedule: lr -> end_lr over `decay_steps` from its step 0."""
    if decay == "constant":
        after = optax.constant_schedule(lr)
    elif decay == "cosine":
        after = optax.cosine_decay_schedule(lr, decay_steps, alpha=end_lr / lr if lr else 0.0)
    else:
        power = 1.0 if decay == "linear" else float(schedule.get("power", 1.0))
        after = optax.polynomial_schedule(lr, end_lr, power, decay_steps)
    return after


def _decay_from_start(after: optax.Schedule, lr: float, warmup: int) -> optax.Schedule:
    """google-research/bert's rule: `after` at the global step t (not t - warmup), and
    lr * t / warmup instead while t < warmup."""
    if warmup == 0:
        return after

    def schedule(step):
        t = jnp.asarray(step)
        warm = lr * t.astype(jnp.float32) / float(warmup)
        return jnp.where(t < warmup, warm, after(step))

    return schedule


def warmup_steps(schedule, total_steps: int) -> int:
    """schedule.warmup_steps, or (when negative) warmup_ratio x total_steps, rounded."""
    steps = int(schedule.warmup_steps)
    if steps >= 0:
        return steps
    ratio = float(schedule.get("warmup_ratio", 0.0))
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"config.schedule.warmup_ratio={ratio}: expected 0 <= ratio <= 1 "
                          f"(with warmup_steps < 0)")
    return int(round(ratio * total_steps))


def path_names(path) -> tuple[str, ...]:
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
    return jax.tree_util.tree_map_with_path(lambda p, _: decays(path_names(p)), params)


def scale_by_adam_uncorrected(b1: float = 0.9, b2: float = 0.999,
                              eps: float = 1e-6) -> optax.GradientTransformation:
    """Adam's direction without bias correction, as google-research/bert's
    AdamWeightDecayOptimizer computes it (optimization.py):

        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2;   u = m / (sqrt(v) + eps)

    The state is optax's ScaleByAdamState (count, mu, nu), the bias-corrected transform's
    own, so a run can resume with either setting."""
    base = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

    def update(updates, state, params=None):
        del params
        mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
        nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g),
                                    state.nu, updates)
        out = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
        count = optax.safe_int32_increment(state.count)
        return out, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

    return optax.GradientTransformation(base.init, update)


def adamw(learning_rate, *, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
          weight_decay: float = 0.01, mask=decay_mask,
          bias_correction: bool = True) -> optax.GradientTransformation:
    """AdamW: `optax.adamw` itself with bias correction; without it, the same chain with
    `scale_by_adam_uncorrected`, which is google-research/bert's AdamWeightDecayOptimizer:
    w -= lr * (m / (sqrt(v) + eps) + weight_decay * w), the decay where `mask` is True."""
    if bias_correction:
        return optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                           mask=mask)
    return optax.chain(
        scale_by_adam_uncorrected(b1=b1, b2=b2, eps=eps),
        optax.add_decayed_weights(weight_decay=weight_decay, mask=mask),
        optax.scale_by_learning_rate(learning_rate),
    )


def lamb(learning_rate, *, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
         weight_decay: float = 0.01, mask=decay_mask,
         bias_correction: bool = True) -> optax.GradientTransformation:
    """LAMB (You et al. 2019, Algorithm 2) as BERT recipes run it: weight decay AND the
    layer-wise trust ratio only where `mask` is True (kernels and embeddings); biases and
    LayerNorm parameters take plain Adam steps.

    Per parameter tensor w with gradient g at step t (1-based):

        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
        r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)     # bias-corrected Adam
        masked:   u = r + weight_decay * w;   u *= ||w|| / ||u||  (1 if either norm is 0)
        unmasked: u = r
        w -= lr_t * u

    `optax.lamb` applies the trust ratio to every tensor, biases and LayerNorm included;
    the LAMB BERT recipe excludes them from layer adaptation (google-research's LAMB
    `exclude_from_layer_adaptation` defaults to the weight-decay exclusions; NVIDIA's apex
    FusedLAMB, with use_nvlamb=False as NVIDIA's BERT runs it, takes the ratio only in
    parameter groups with non-zero decay, and the bias / LayerNorm group has decay 0).
    A bias's scale is set by its own gradients, not by a norm that starts at zero, so a
    trust ratio ||b|| / ||u|| would freeze freshly zero-initialised biases (ratio 1 only
    while ||b|| = 0, then tiny steps).

    Numerics match both references: bias correction on (paper's Algorithm 2 and FusedLAMB's
    default bias_correction=True), eps added outside the square root (optax's
    scale_by_adam with eps_root=0, as FusedLAMB and the paper), trust ratio norms per
    tensor (Frobenius), phi = identity, no clipping of the ratio. optax evaluates 1 - b^t
    in float32 (so does apex's kernel): b2 = 0.999 rounds to 0.99900001287, which changes
    the first step by 6e-6 relative and fades with t.
    Built from optax parts; only the mask on the trust ratio differs from `optax.lamb`.
    bias_correction=False drops the 1 - b^t factors (`scale_by_adam_uncorrected`), as
    FusedLAMB's bias_correction=False does.
    """
    return optax.chain(
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=0.0) if bias_correction
        else scale_by_adam_uncorrected(b1=b1, b2=b2, eps=eps),
        optax.add_decayed_weights(weight_decay=weight_decay, mask=mask),
        optax.masked(optax.scale_by_trust_ratio(), mask),
        optax.scale_by_learning_rate(learning_rate),
    )


def _encoder_layer(names: tuple[str, ...]):
    """Where a parameter sits in the layer stack: i for `.../encoder/layer_<i>/...`,
    "scanned" for `.../encoder/layers/...` (nn.scan), None elsewhere."""
    if "encoder" not in names:
        return None
    below = names[names.index("encoder") + 1:]
    if below and below[0].startswith("layer_") and below[0][6:].isdigit():
        return int(below[0][6:])
    if below and below[0] == "layers":
        return "scanned"
    return None


def layer_depths(params: Any) -> tuple[Any, int]:
    """(tree like `params` of depths, number of encoder layers L) for layer-wise decay.

    A leaf's depth is 0 for the embeddings (`.../embeddings/...`), i + 1 for encoder layer i
    (`.../encoder/layer_<i>/...`; under `nn.scan`, `.../encoder/layers/...` leaves get the
    numpy vector 1..L along their leading [layers] axis) and L + 1 for everything above the
    layer stack: the pooler, a pre-LN encoder's final LayerNorm and every head. L counts the
    layers found; a tree with no encoder layers is an error."""
    found: set[int] = set()
    scanned: set[int] = set()

    def visit(path, leaf):
        where = _encoder_layer(path_names(path))
        if where == "scanned":
            scanned.add(int(jax.numpy.shape(leaf)[0]))
        elif where is not None:
            found.add(where)

    jax.tree_util.tree_map_with_path(visit, params)
    if (found and scanned) or len(scanned) > 1:
        raise ValueError("optimizer.layer_decay: the params mix encoder layer layouts "
                         f"(layer_<i>: {sorted(found)}, scanned lengths: {sorted(scanned)})")
    if found and found != set(range(len(found))):
        raise ValueError("optimizer.layer_decay: encoder layers are not numbered 0..L-1 "
                         f"(found layer_{sorted(found)})")
    num_layers = len(found) or (scanned.pop() if scanned else 0)
    if not num_layers:
        raise ConfigError("optimizer.layer_decay < 1 needs a BERT encoder in the params "
                         "(`.../encoder/layer_<i>/...` or a scanned `.../encoder/layers/...`); "
                         "none was found")

    def depth(path, leaf):
        names = path_names(path)
        where = _encoder_layer(names)
        if where == "scanned":
            return np.arange(1, num_layers + 1)
        if where is not None:
            return where + 1
        return 0 if "embeddings" in names else num_layers + 1

    return jax.tree_util.tree_map_with_path(depth, params), num_layers


def layer_decay_factors(decay: float, params: Any) -> Any:
    """Tree like `params` of the update factors decay ** (L + 1 - depth) (`layer_depths`):
    1 for the heads and pooler, decay for the top encoder layer, decay ** (L - i) for layer
    i, decay ** (L + 1) for the embeddings: numpy float32 constants (a [L, 1, ...] array
    for a scanned leaf), folded into the compiled step."""
    depths, num_layers = layer_depths(params)

    def factor(d, leaf):
        f = np.float32(decay) ** (num_layers + 1 - np.asarray(d))
        if f.ndim:  # a scanned leaf: one factor per layer
            f = f.reshape(f.shape + (1,) * (len(jax.numpy.shape(leaf)) - 1))
        return f.astype(np.float32)

    return jax.tree_util.tree_map(factor, depths, params)


def _checked_layer_decay(decay) -> float:
    decay = float(decay)
    if not 0.0 < decay <= 1.0:
        raise ConfigError(f"config.optimizer.layer_decay={decay}; expected 0 < layer_decay <= 1 "
                         "(1: off)")
    return decay


def check_optimizer(optimizer) -> None:
    """Refuses what `make_optimizer` would refuse in the config's `optimizer` section
    (name, layer_decay) without building anything: fine-tuning calls it before it reads
    and tokenizes any data."""
    if optimizer.name not in OPTIMIZERS:
        raise ConfigError(f"config.optimizer.name={optimizer.name!r}; expected one of "
                         f"{OPTIMIZERS}")
    _checked_layer_decay(optimizer.get("layer_decay", 1.0))


def with_layer_decay(inner: optax.GradientTransformation,
                     decay: float) -> optax.GradientTransformation:
    """`inner` with layer-wise learning-rate decay (as BEiT and DeBERTa-v3 fine-tune;
    ELECTRA's variant puts the top layer two factors below the head): every update of
    `inner` is multiplied by `layer_decay_factors`, so the heads and pooler take the full
    learning rate, encoder layer i of L decay ** (L - i) times it and the embeddings
    decay ** (L + 1) times it. Applied to the final update, after the learning rate, it
    scales the whole step, decoupled weight decay and LAMB's trust-ratio step included,
    exactly as a per-layer learning rate would. The optimizer state is `inner`'s own, so a
    run may resume with another layer_decay. decay = 1 returns `inner` unchanged."""
    decay = _checked_layer_decay(decay)
    if decay == 1.0:
        return inner

    def update(updates, state, params=None):
        updates, state = inner.update(updates, state, params)
        factors = layer_decay_factors(decay, updates)
        return jax.tree_util.tree_map(lambda u, f: (u * f).astype(u.dtype), updates,
                                      factors), state

    def init(params):
        layer_depths(params)  # a tree without encoder layers fails here, before compiling
        return inner.init(params)

    return optax.GradientTransformation(init, update)


def make_optimizer(optimizer, schedule, total_steps: int) -> optax.GradientTransformation:
    """optax transformation from the config's `optimizer` and `schedule` sections.

    optimizer.name: adamw | lamb; b1, b2, eps, weight_decay; bias_correction (False:
    google-research/bert's Adam); clip_norm (<= 0: no clipping); layer_decay (1: off;
    < 1: `with_layer_decay`, for fine-tuning).
    adamw is `adamw` above (`optax.adamw` with bias correction; decoupled decay masked by
    `decay_mask`); lamb is `lamb` above (decay and trust ratio masked by `decay_mask`).
    """
    check_optimizer(optimizer)
    name = optimizer.name
    lr = make_schedule(schedule, total_steps)
    kwargs = dict(b1=float(optimizer.b1), b2=float(optimizer.b2), eps=float(optimizer.eps),
                  weight_decay=float(optimizer.weight_decay), mask=decay_mask,
                  bias_correction=bool(optimizer.get("bias_correction", True)))
    core = adamw(lr, **kwargs) if name == "adamw" else lamb(lr, **kwargs)
    core = with_layer_decay(core, optimizer.get("layer_decay", 1.0))
    clip = float(optimizer.get("clip_norm", 1.0))
    if clip > 0:
        return optax.chain(optax.clip_by_global_norm(clip), core)
    return core


def learning_rate(schedule, total_steps: int, step) -> Any:
    """The learning rate used for the update at `step` (0-based), for metrics."""
    return make_schedule(schedule, total_steps)(step)
