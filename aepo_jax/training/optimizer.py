"""AdamW with warm-up, a learning-rate schedule, global-norm clipping and
mixed precision (spec §7: AdamW lr 1e-6, weight decay 0.01, constant, clip 1.0).

Master parameters and optimiser moments stay float32; `cast_for_compute`
casts a copy of the parameters to the compute dtype inside the jitted step,
so gradients flow back to the float32 masters through the cast.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from aepo_jax.training.tree_paths import path_names

SCHEDULES = ("constant", "cosine", "linear")
_NO_DECAY_NAMES = ("norm", "bias", "scale")


def learning_rate_schedule(
    peak_lr: float,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "constant",
    final_lr_fraction: float = 0.0,
) -> optax.Schedule:
    """Linear warm-up from 0 to `peak_lr` over `warmup_steps`, then `schedule`.

    `cosine` and `linear` decay to `final_lr_fraction * peak_lr` at `total_steps`.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown lr schedule {schedule!r}; expected one of {SCHEDULES}")
    if warmup_steps < 0 or total_steps < 1:
        raise ValueError(f"need warmup_steps >= 0 and total_steps >= 1, got {warmup_steps}, {total_steps}")
    decay_steps = max(total_steps - warmup_steps, 1)
    final_lr = peak_lr * final_lr_fraction
    if schedule == "constant":
        after = optax.constant_schedule(peak_lr)
    elif schedule == "cosine":
        after = optax.cosine_decay_schedule(peak_lr, decay_steps, alpha=final_lr_fraction)
    else:
        after = optax.linear_schedule(peak_lr, final_lr, decay_steps)
    if warmup_steps == 0:
        return after
    warmup = optax.linear_schedule(0.0, peak_lr, warmup_steps)
    return optax.join_schedules([warmup, after], [warmup_steps])


def weight_decay_mask(params: Any) -> Any:
    """True for matrices (decayed); False for norms, biases and other vectors."""

    def decide(path: tuple, leaf: jax.Array) -> bool:
        names = [n.lower() for n in path_names(path) if n != "value"]
        if any(tag in name for name in names for tag in _NO_DECAY_NAMES):
            return False
        return jnp.ndim(leaf) >= 2

    return jax.tree_util.tree_map_with_path(decide, params)


def make_optimizer(
    learning_rate: float,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "constant",
    weight_decay: float = 0.01,
    grad_clip_norm: float | None = 1.0,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    final_lr_fraction: float = 0.0,
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Global-norm clipping then AdamW with a decay mask; returns (tx, schedule)."""
    lr = learning_rate_schedule(learning_rate, total_steps, warmup_steps, schedule, final_lr_fraction)
    parts = []
    if grad_clip_norm is not None and grad_clip_norm > 0:
        parts.append(optax.clip_by_global_norm(grad_clip_norm))
    parts.append(
        optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=weight_decay_mask)
    )
    return optax.chain(*parts), lr


def keep_if_finite(finite: jax.Array, updated: Any, previous: Any) -> Any:
    """`updated` where the scalar `finite` is True, else `previous`, leaf by leaf (same structure).

    How a step skips an update whose gradient is NaN or inf: the new parameters and optimiser
    state are computed as usual, then the old ones are kept instead (the logic of optax's
    `apply_if_finite`, without its wrapper state). A `jnp.where` per leaf is elementwise, so each
    leaf keeps its sharding and the step's donated buffers can still be reused.
    """
    return jax.tree.map(lambda new, old: jnp.where(finite, new, old), updated, previous)


def optimizer_from_config(cfg: Any, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Build the optimiser from a config's `optim` block (see configs/base.py)."""
    o = cfg.optim
    return make_optimizer(
        learning_rate=o.lr,
        total_steps=total_steps,
        warmup_steps=o.warmup_steps,
        schedule=o.schedule,
        weight_decay=o.weight_decay,
        grad_clip_norm=o.grad_clip_norm,
        b1=o.b1,
        b2=o.b2,
        eps=o.eps,
        final_lr_fraction=o.final_lr_fraction,
    )


def resolve_dtype(name: str | None) -> jnp.dtype | None:
    """'bfloat16' / 'float32' / None -> jnp dtype (None keeps the master dtype)."""
    if name is None or name == "":
        return None
    table = {"bfloat16": jnp.bfloat16, "bf16": jnp.bfloat16, "float32": jnp.float32, "fp32": jnp.float32,
             "float16": jnp.float16}
    if name not in table:
        raise ValueError(f"unknown compute dtype {name!r}; expected one of {sorted(table)}")
    return table[name]


def cast_for_compute(params: Any, compute_dtype: jnp.dtype | None) -> Any:
    """Cast floating leaves to the compute dtype (inside jit; grads stay float32)."""
    if compute_dtype is None:
        return params

    def cast(x: jax.Array) -> jax.Array:
        return x.astype(compute_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree.map(cast, params)
