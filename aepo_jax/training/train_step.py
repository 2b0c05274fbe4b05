"""The jitted, sharded train steps: RL (policy loss) and SFT (next-token loss).

Each step is a pure function `(TrainState, batch) -> (TrainState, metrics)`
over a flat padded batch (see `batch.py`). Gradients are accumulated exactly
over micro-batches: the loss denominator is computed once on the full batch
and every micro-batch contributes `numerator_mb / D`, so the summed gradient
equals the full-batch gradient (spec §3 aggregation, DESIGN.md Trainer).
Mixed precision: float32 master parameters are cast to `compute_dtype`
inside the step; gradients and optimiser state stay float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from aepo_jax.models.attention_mask import causal_mask
from aepo_jax.models.lm_head import TokenScores, next_token_scores
from aepo_jax.objectives.aggregation import loss_denominator
from aepo_jax.objectives.policy_loss import LossConfig, policy_loss
from aepo_jax.objectives.presets import loss_config as objective_loss_config
from aepo_jax.training.metric_keys import GRAD_NORM, LEARNING_RATE, SKIPPED_UPDATES
from aepo_jax.training.optimizer import cast_for_compute, keep_if_finite, resolve_dtype
from aepo_jax.training.train_state import TrainState

Batch = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Static settings of a train step (hashable; changes recompile).

    The policy-loss settings (surrogate, clip bounds, dual clip, aggregation,
    KL and entropy terms) are a `LossConfig` whose defaults live only in
    `aepo_jax.objectives.presets` (`AlgorithmPreset.loss_config()` in a run;
    the bare AEPO surrogate's when not given). The rest is how the step runs.

    `loss_max_len` is the constant `max_len` of `seq_mean_token_sum_norm` (Dr. GRPO, spec §3):
    a run sets it to `rollout.max_response_len` (`build.step_config_from`), the most policy
    tokens one trajectory can have, which is what Dr. GRPO's released code divides by
    (its generation budget) and what verl's divisor, the response width padded to
    `max_response_length`, amounts to. It must not be the batch's column count `T`:
    that is the step's longest prompt plus response rounded to `train.length_bucket`,
    so the loss scale would change from step to step. None (tests of the step's
    mechanics only) falls back to that `T`.
    """

    loss: LossConfig = dataclasses.field(default_factory=lambda: objective_loss_config("aepo"))
    temperature: float = 1.0
    micro_batch_size: int | None = None  # None: the whole batch in one pass
    compute_dtype: str | None = None  # "bfloat16" casts params inside the step
    logits_chunk_size: int | None = None
    loss_max_len: int | None = None  # Dr. GRPO's constant; see the class docstring

    def __post_init__(self) -> None:
        if self.loss_max_len is not None and self.loss_max_len <= 0:
            raise ValueError(f"loss_max_len must be positive, got {self.loss_max_len}")


def forward_logits(graphdef: nnx.GraphDef, params: Any, batch: Batch, compute_dtype: str | None = None) -> jax.Array:
    """Float32 logits `[B, T, V]` of the batch (params cast to `compute_dtype` first)."""
    model = nnx.merge(graphdef, cast_for_compute(params, resolve_dtype(compute_dtype)))
    return model(batch["input_ids"], positions=batch["positions"], attention_mask=causal_mask(batch["valid"]))


def batch_token_scores(graphdef: nnx.GraphDef, params: Any, batch: Batch, temperature: float = 1.0,
                       compute_dtype: str | None = None, chunk_size: int | None = None) -> TokenScores:
    """`TokenScores` `[B, T]` of every token given the ones before it, from the model's hidden states:
    with `chunk_size`, `[B, T, V]` logits never exist (`aepo_jax.models.lm_head`)."""
    model = nnx.merge(graphdef, cast_for_compute(params, resolve_dtype(compute_dtype)))
    return next_token_scores(model, batch["input_ids"], batch["positions"], causal_mask(batch["valid"]),
                             temperature=temperature, chunk_size=chunk_size)


def sequence_logprobs(
    graphdef: nnx.GraphDef,
    params: Any,
    batch: Batch,
    temperature: float = 1.0,
    compute_dtype: str | None = None,
    chunk_size: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Forward then the chunked LM head: (logp, entropy), float32 `[B, T]` each."""
    scores = batch_token_scores(graphdef, params, batch, temperature, compute_dtype, chunk_size)
    return scores.logp, scores.entropy


def split_micro_batches(batch: Batch, micro_batch_size: int | None) -> Batch:
    """[B, ...] -> [n_micro, B / n_micro, ...]; micro-batch j holds rows j, j + n, j + 2n, ...

    The strided split keeps the leading (sharded) batch axis intact: row-major
    `[B] -> [mb, n]` leaves each device's rows on that device.
    """
    rows = batch["input_ids"].shape[0]
    if micro_batch_size is None or micro_batch_size >= rows:
        return jax.tree.map(lambda x: x[None], batch)
    if rows % micro_batch_size:
        raise ValueError(f"batch of {rows} rows is not a multiple of micro_batch_size={micro_batch_size}")
    n_micro = rows // micro_batch_size

    def split(x: jax.Array) -> jax.Array:
        x = x.reshape((micro_batch_size, n_micro) + x.shape[1:])  # [mb, n, ...]
        return jnp.swapaxes(x, 0, 1)  # [n, mb, ...]

    return jax.tree.map(split, batch)


LossFn = Callable[[Any, Batch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


def flat_denominator(mask: jax.Array, denominator_fn: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """`denominator_fn` of a micro-batched `[M, B, T]` mask seen as one `[M * B, T]` batch."""
    return denominator_fn(mask.reshape((-1, mask.shape[-1])))


def accumulate_gradients(loss_fn: LossFn, params: Any, micro: Batch,
                         denominator: jax.Array) -> tuple[jax.Array, Any, dict[str, jax.Array]]:
    """Sum of micro-batch losses and gradients over the leading `[M]` axis, and token-weighted metrics.

    `loss_fn(params, micro_batch, denominator) -> (loss_mb, metrics_mb)` where
    metrics are token means of the micro-batch; they are re-weighted by each
    micro-batch's token count so the result equals the full-batch mean. The
    one accumulation of every step (RL flat or tree-packed, SFT).
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def one(carry, mb):
        loss_sum, grad_sum, metric_sum = carry
        (loss, metrics), grads = grad_fn(params, mb, denominator)
        tokens = jnp.sum(mb["mask"].astype(jnp.float32))
        metric_sum = jax.tree.map(lambda s, m: s + m * tokens, metric_sum, metrics)
        return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads), metric_sum), None

    first = jax.tree.map(lambda x: x[0], micro)
    metric_shapes = jax.eval_shape(lambda: loss_fn(params, first, denominator)[1])
    zeros = (
        jnp.zeros((), jnp.float32),
        jax.tree.map(jnp.zeros_like, params),
        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes),
    )
    if micro["mask"].shape[0] == 1:
        (loss, grads, metric_sum), _ = one(zeros, first)
    else:
        (loss, grads, metric_sum), _ = jax.lax.scan(one, zeros, micro)
    total_tokens = jnp.maximum(jnp.sum(micro["mask"].astype(jnp.float32)), 1.0)
    metrics = jax.tree.map(lambda s: s / total_tokens, metric_sum)
    return loss, grads, metrics


def apply_update(state: TrainState, grads: Any, tx: optax.GradientTransformation,
                 schedule: optax.Schedule | None) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimiser update from summed gradients; shared by the flat, SFT and tree-packed steps.

    A gradient whose global norm is NaN or inf (one bad token is enough) would pass through
    clipping and AdamW into every weight and moment; such an update is skipped instead: the
    parameters, the optimiser state and `state.step` (the count of applied updates, which the
    schedule follows) stay as they were, and the metrics say so (`skipped_updates` 1,
    `update_norm` 0, `grad_norm` the non-finite value).
    """
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    params, opt_state = keep_if_finite(finite, (params, opt_state), (state.params, state.opt_state))
    metrics = {GRAD_NORM: grad_norm,
               "update_norm": jnp.where(finite, optax.tree.norm(updates), jnp.zeros((), jnp.float32)),
               SKIPPED_UPDATES: jnp.logical_not(finite).astype(jnp.int32)}
    if schedule is not None:
        metrics[LEARNING_RATE] = jnp.asarray(schedule(state.step), jnp.float32)
    step = state.step + finite.astype(state.step.dtype)
    return state.replace(step=step, params=params, opt_state=opt_state), metrics


def under_mesh(jitted: Callable, *shardings: Any) -> Callable:
    """`jitted`, traced, lowered and called under the mesh of its `NamedSharding`s (`jax.set_mesh`).

    The splash backend's Pallas kernels cannot be partitioned by the compiler and run
    per device through `shard_map` over the context mesh (`attention_flash.shard_over_mesh`);
    this gives the program that mesh. Unchanged when no sharding names a mesh.
    """
    named = [leaf for leaf in jax.tree.leaves(shardings) if isinstance(leaf, jax.sharding.NamedSharding)]
    if not named:
        return jitted
    mesh = named[0].mesh

    def call(*args, **kwargs):
        with jax.set_mesh(mesh):
            return jitted(*args, **kwargs)

    def lower(*args, **kwargs):
        with jax.set_mesh(mesh):
            return jitted.lower(*args, **kwargs)

    call.lower = lower
    call.jitted = jitted
    return call


def jit_step(step: Callable, state_sharding: Any | None, batch_sharding: Any | None) -> Callable:
    """`jax.jit` a `(state, batch) -> (state, metrics)` step, donating the state, with optional shardings
    (then traced under their mesh, `under_mesh`)."""
    if state_sharding is None and batch_sharding is None:
        return jax.jit(step, donate_argnums=0)
    return under_mesh(jax.jit(step, in_shardings=(state_sharding, batch_sharding),
                              out_shardings=(state_sharding, None), donate_argnums=0), state_sharding, batch_sharding)


def rl_loss_fn(graphdef: nnx.GraphDef, cfg: StepConfig, logprobs: Callable | None = None) -> LossFn:
    """Micro-batch policy loss: forward, log-probs at the sampling temperature, `policy_loss`.

    `logprobs(graphdef, params, mb, temperature, compute_dtype, chunk_size)` gives the flat
    float32 `[B, T]` (logp, entropy): `sequence_logprobs` (default) for padded rows, the
    tree-packed scorer for packed ones; the loss on top is the same function.
    """
    logprobs = sequence_logprobs if logprobs is None else logprobs
    loss_config = cfg.loss

    def loss_fn(params: Any, mb: Batch, denominator: jax.Array):
        logp, entropy = logprobs(graphdef, params, mb, cfg.temperature, cfg.compute_dtype, cfg.logits_chunk_size)
        loss, metrics = policy_loss(
            loss_config, logp=logp, logp_old=mb["logp_old"], advantages=mb["advantages"], mask=mb["mask"],
            max_len=cfg.loss_max_len, global_denominator=denominator, logp_ref=mb.get("logp_ref"),
            entropy=entropy,
        )
        metrics.pop("pg_loss", None)  # a per-micro-batch value; `loss` below is the exact total
        return loss, metrics

    return loss_fn


def make_rl_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    cfg: StepConfig,
    schedule: optax.Schedule | None = None,
    state_sharding: Any | None = None,
    batch_sharding: Any | None = None,
    logprobs: Callable | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """A jitted RL update on one mini-batch.

    Flat (default `logprobs`): the batch needs `input_ids, positions, valid, mask,
    logp_old, advantages` (`[B, T]`), optionally `logp_ref` (required when
    `kl_coef > 0`); attention is causal over its `valid` tokens; it is split into
    micro-batches of `cfg.micro_batch_size` rows inside the step. With another
    scorer (`packing.packed_logprobs`) the batch arrives already micro-batched,
    every array with a leading `[M]` axis (`packing.build_train_batch`), and
    `cfg.micro_batch_size` is ignored.
    """
    return _accumulating_step(rl_loss_fn(graphdef, cfg, logprobs), lambda mask: loss_denominator(mask, cfg.loss.loss_agg),
                              tx, schedule, state_sharding, batch_sharding, cfg.micro_batch_size,
                              pre_split=logprobs is not None)


def _accumulating_step(
    loss_fn: LossFn,
    denominator_fn: Callable[[jax.Array], jax.Array],
    tx: optax.GradientTransformation,
    schedule: optax.Schedule | None,
    state_sharding: Any | None,
    batch_sharding: Any | None,
    micro_batch_size: int | None,
    pre_split: bool = False,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """Jitted step: exact gradient accumulation of `loss_fn` over micro-batches against the whole
    batch's `denominator_fn(mask)`, then one optimiser update. `pre_split`: the batch already
    has its `[M]` axis; else it is split into `micro_batch_size`-row parts here."""

    def step(state: TrainState, batch: Batch):
        micro = batch if pre_split else split_micro_batches(batch, micro_batch_size)
        denominator = flat_denominator(micro["mask"], denominator_fn)
        loss, grads, metrics = accumulate_gradients(loss_fn, state.params, micro, denominator)
        state, update_metrics = apply_update(state, grads, tx, schedule)
        metrics.update(update_metrics, loss=loss, train_tokens=jnp.sum(batch["mask"].astype(jnp.float32)))
        return state, metrics

    return jit_step(step, state_sharding, batch_sharding)


def sft_loss_fn(graphdef: nnx.GraphDef, cfg: StepConfig) -> LossFn:
    """Micro-batch next-token loss on `mask == 1` tokens (cold-start SFT)."""

    def loss_fn(params: Any, mb: Batch, denominator: jax.Array):
        scores = batch_token_scores(graphdef, params, mb, 1.0, cfg.compute_dtype, cfg.logits_chunk_size)
        logp, entropy = scores.logp, scores.entropy  # [B, T] each
        mask = mb["mask"].astype(jnp.float32)
        loss = -jnp.sum(logp * mask) / jnp.maximum(denominator, 1.0)
        hits = scores.is_argmax.astype(jnp.float32)
        tokens = jnp.maximum(jnp.sum(mask), 1.0)
        metrics = {"nll": -jnp.sum(logp * mask) / tokens, "entropy_mean": jnp.sum(entropy * mask) / tokens,
                   "token_accuracy": jnp.sum(hits * mask) / tokens}
        return loss, jax.lax.stop_gradient(metrics)

    return loss_fn


def make_sft_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    cfg: StepConfig,
    schedule: optax.Schedule | None = None,
    state_sharding: Any | None = None,
    batch_sharding: Any | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """A jitted SFT update: mean next-token NLL over `mask == 1` tokens of the batch."""
    return _accumulating_step(sft_loss_fn(graphdef, cfg), lambda mask: jnp.sum(mask.astype(jnp.float32)),
                              tx, schedule, state_sharding, batch_sharding, cfg.micro_batch_size)


def make_logprob_fn(
    graphdef: nnx.GraphDef, cfg: StepConfig, batch_sharding: Any | None = None, logprobs: Callable | None = None,
) -> Callable[[Any, Batch], tuple[jax.Array, jax.Array]]:
    """Jitted `(params, batch) -> (logp, entropy)` in the batch's own layout, one micro-batch at a time.

    The scoring pass of the RL step (`logp_old` recomputed, reference log-probs for KL,
    the current policy's entropies for AEPO's advantages) on the update's batches:
    flat `[B, T]` batches in `cfg.micro_batch_size`-row parts, or, with a packed
    scorer (`packing.packed_logprobs`), `[M, ...]` batches part by part, so its memory
    is that of one micro-batch's forward, not of the whole step's rows.
    """
    pre_split = logprobs is not None
    logprobs = sequence_logprobs if logprobs is None else logprobs

    def fn(params: Any, batch: Batch):
        micro = batch if pre_split else split_micro_batches(batch, cfg.micro_batch_size)
        logp, entropy = jax.lax.map(lambda mb: logprobs(graphdef, params, mb, cfg.temperature, cfg.compute_dtype,
                                                        cfg.logits_chunk_size), micro)  # [M, B/M, T] each
        if pre_split:
            return logp, entropy
        return merge_micro_batches(logp), merge_micro_batches(entropy)

    if batch_sharding is None:
        return jax.jit(fn)
    return under_mesh(jax.jit(fn, in_shardings=(None, batch_sharding)), batch_sharding)


def merge_micro_batches(x: jax.Array) -> jax.Array:
    """Inverse of `split_micro_batches` for one array: `[n, mb, ...]` -> `[mb * n, ...]` in row order."""
    x = jnp.swapaxes(x, 0, 1)  # [mb, n, ...]
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])
