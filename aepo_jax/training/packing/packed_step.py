"""The tree-packed RL train step: one forward over packed rows, the flat policy loss.

Per micro-batch: forward the packed rows under their ancestor mask (positions =
depths), so every slot's logits equal the flat layout's logits at that token;
score each flat token with the logits of its parent's slot (`score_row`,
`score_col`), then apply exactly the flat step's `policy_loss` to the `[B, T]`
arrays. A node shared by several trajectories is computed once and the
gradient of the gather sums the per-trajectory weights (advantage, mask,
aggregation denominator), so loss and gradient equal the flat step's for every
surrogate and aggregation, GSPO's sequence ratio included (docs/packing.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from aepo_jax.models.lm_head import head_token_scores
from aepo_jax.objectives.aggregation import loss_denominator
from aepo_jax.training.optimizer import cast_for_compute, resolve_dtype
from aepo_jax.training.packing.ancestor_mask import ancestor_mask
from aepo_jax.training.train_state import TrainState
from aepo_jax.training.train_step import (
    StepConfig,
    apply_update,
    jit_step,
    rl_loss_fn,
)

Batch = dict[str, jax.Array]


def packed_logprobs(
    graphdef: nnx.GraphDef,
    params: Any,
    mb: Batch,
    temperature: float = 1.0,
    compute_dtype: str | None = None,
    chunk_size: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Flat `(logp, entropy)`, float32 `[B, T]`, of one micro-batch computed on its packed rows.

    Token `t` of flat row `b` is scored at slot `(score_row, score_col)[b, t]`,
    its parent's slot; column 0 and padding are 0, as in the flat step.
    A slot with several children is scored once per child: the first child
    (`packed_next_ids`) by the chunked LM head, the others by their own
    logit (one dot product) minus the slot's log normaliser, so `[R, L, V]`
    logits never exist when `chunk_size` is set.
    """
    model = nnx.merge(graphdef, cast_for_compute(params, resolve_dtype(compute_dtype)))
    hidden = model(mb["packed_ids"], positions=mb["packed_positions"],
                   attention_mask=ancestor_mask(mb["packed_subtree_end"]), return_hidden=True)  # [R, L, D]
    head = model.head()  # [D, V]
    slot = head_token_scores(hidden, head, mb["packed_next_ids"], dtype=model.config.dtype,
                             temperature=temperature, chunk_size=chunk_size)  # [R, L] each, no [R, L, V]

    rows, cols, targets = mb["score_row"], mb["score_col"], mb["input_ids"]  # [B, T] each
    dtype = model.config.dtype
    parent_hidden = hidden[rows, cols].astype(dtype)  # [B, T, D]
    target_columns = jnp.take(head, targets, axis=1).astype(dtype)  # [D, B, T]
    target_logit = jnp.einsum("btd,dbt->bt", parent_hidden, target_columns,
                              preferred_element_type=jnp.float32) / temperature  # [B, T]
    is_first = mb["packed_next_ids"][rows, cols] == targets
    logp = jnp.where(is_first, slot.logp[rows, cols], target_logit - slot.log_norm[rows, cols])
    scored = mb["scored"] > 0
    return jnp.where(scored, logp, 0.0), jnp.where(scored, slot.entropy[rows, cols], 0.0)


def packed_rl_loss_fn(graphdef: nnx.GraphDef, cfg: StepConfig):
    """`(params, micro_batch, denominator) -> (loss, metrics)`, the flat `rl_loss_fn` on packed rows."""
    return rl_loss_fn(graphdef, cfg, logprobs=packed_logprobs)


def packed_loss_and_grads(graphdef: nnx.GraphDef, cfg: StepConfig, params: Any,
                          batch: Batch) -> tuple[jax.Array, Any, dict[str, jax.Array]]:
    """Loss, gradients and token-weighted metrics summed over the `[M]` micro-batches.

    The denominator is computed once over every micro-batch's flat mask, so
    the sum equals the full-batch loss exactly (as in the flat trainer).
    """
    mask = batch["mask"]  # [M, B, T]
    denominator = loss_denominator(mask.reshape((-1, mask.shape[-1])), cfg.loss_agg)
    grad_fn = jax.value_and_grad(packed_rl_loss_fn(graphdef, cfg), has_aux=True)

    def one(carry, mb):
        loss_sum, grad_sum, metric_sum = carry
        (loss, metrics), grads = grad_fn(params, mb, denominator)
        tokens = jnp.sum(mb["mask"].astype(jnp.float32))
        metric_sum = jax.tree.map(lambda s, m: s + m * tokens, metric_sum, metrics)
        return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads), metric_sum), None

    first = jax.tree.map(lambda x: x[0], batch)
    metric_shapes = jax.eval_shape(lambda: packed_rl_loss_fn(graphdef, cfg)(params, first, denominator)[1])
    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params),
             jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes))
    if mask.shape[0] == 1:
        (loss, grads, metric_sum), _ = one(zeros, first)
    else:
        (loss, grads, metric_sum), _ = jax.lax.scan(one, zeros, batch)
    total_tokens = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
    return loss, grads, jax.tree.map(lambda s: s / total_tokens, metric_sum)


def make_packed_rl_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    cfg: StepConfig,
    schedule: optax.Schedule | None = None,
    state_sharding: Any | None = None,
    batch_sharding: Any | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """A jitted RL update on a tree-packed batch (`build_packed_batch`); same metrics as the flat step.

    `cfg.micro_batch_size` is ignored: micro-batches are fixed when the batch
    is built (`build_packed_batch(..., micro_batches=M)`), since a tree must
    not be split across them.
    """

    def step(state: TrainState, batch: Batch):
        loss, grads, metrics = packed_loss_and_grads(graphdef, cfg, state.params, batch)
        state, update_metrics = apply_update(state, grads, tx, schedule)
        metrics.update(update_metrics, loss=loss, train_tokens=jnp.sum(batch["mask"]))
        return state, metrics

    return jit_step(step, state_sharding, batch_sharding)


def make_packed_logprob_fn(
    graphdef: nnx.GraphDef, cfg: StepConfig, batch_sharding: Any | None = None
) -> Callable[[Any, Batch], tuple[jax.Array, jax.Array]]:
    """Jitted `(params, packed_batch) -> (logp, entropy)`, `[M, B, T]` in packed-batch order
    (reference log-probs for KL, current entropies for AEPO's entropy-aware advantages;
    `unpack_flat` restores the input order)."""

    def fn(params: Any, batch: Batch):
        return jax.lax.map(lambda mb: packed_logprobs(graphdef, params, mb, cfg.temperature, cfg.compute_dtype,
                                                      cfg.logits_chunk_size), batch)

    if batch_sharding is None:
        return jax.jit(fn)
    return jax.jit(fn, in_shardings=(None, batch_sharding))
