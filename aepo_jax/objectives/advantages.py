"""Group and batch advantage estimators of spec §3.2, plus DAPO's reward shaping and filter.

Inputs are plain arrays the rollout produces: `rewards [B]` (one outcome
reward per trajectory), `group_ids [B]` (any ints; equal ids = same prompt, so
tree branches belong to their prompt's group) and `mask [B, T]`. Groups are
found with a `[B, B]` same-group matrix, so ids need no remapping and
everything is jit-compatible. Token advantages are `[B, T]`, zero where
`mask == 0`.

Statistics "over the batch" (REINFORCE++ whitening, AEPO's batch entropy
z-score) are over the whole update batch. When it is split over processes,
each holding its own groups, `batch_total` sums a vector of this part's sums
over every part (`parallel.multihost.process_sum`), so every process uses the
statistics of the whole batch; None (the default) means this part is the
whole batch.

Every sum runs over `mask == 1` only, through `jnp.where` (not `values * mask`), so NaN or inf
at masked positions cannot leak in (`NaN * 0` is NaN). A scope whose valid values are all equal
(max == min) gets exactly that value as its mean and a variance of exactly 0: in float32 the
computed mean of, say, twelve 0.3s is a few ulps off, which made a constant group's GRPO
advantage nonzero and AEPO's entropy std ~1e-8 instead of 0 (so z ~ +-1 where the spec's
"std 0 counts as 1" gives z = 0).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

GROUP_STD_EPS = 1e-6  # spec §3.2: A = (R - mean) / (std + 1e-6)
WHITEN_EPS = 1e-8
ENTROPY_ADV_SCOPES = ("batch", "group")


BatchTotal = Callable[[jax.Array], jax.Array]  # this part's sums [n] -> the whole batch's [n]


def _float(x: jax.Array) -> jax.Array:
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return x.astype(jnp.float32)


def _masked(values: jax.Array, mask: jax.Array) -> jax.Array:
    """`values` where `mask == 1`, exactly 0 elsewhere, whatever is there (NaN and inf included)."""
    return jnp.where(mask > 0, values, jnp.zeros((), values.dtype))


def _valid_range(values: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Min and max of `values` over `mask == 1` along the last axis (+inf and -inf where none)."""
    valid = mask > 0
    return (jnp.min(jnp.where(valid, values, jnp.inf), axis=-1),
            jnp.max(jnp.where(valid, values, -jnp.inf), axis=-1))


def _group_range(lo: jax.Array, hi: jax.Array, same: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per row, the min of `lo [B]` and the max of `hi [B]` over the rows of its group."""
    in_group = same > 0  # [B, B]
    return (jnp.min(jnp.where(in_group, lo[None, :], jnp.inf), axis=1),
            jnp.max(jnp.where(in_group, hi[None, :], -jnp.inf), axis=1))


def _constant_vote(lo: jax.Array, hi: jax.Array) -> jax.Array:
    """One part's say on "all valid values of the batch are equal", as a vector to sum over parts.

    `[its values differ, it has a value, each bit of its value if it has one]`. Parts exchange only
    sums (`batch_total`), and a max / min does not add up; these do: see `_votes_agree`.
    """
    has = lo <= hi
    value = jnp.where(lo == 0, jnp.zeros((), lo.dtype), lo)  # -0.0 and 0.0 are equal; their bits not
    nbits = 8 * lo.dtype.itemsize
    code = jax.lax.bitcast_convert_type(jnp.where(has, value, 0), jnp.dtype(f"uint{nbits}"))
    bits = (code >> jnp.arange(nbits, dtype=code.dtype)) & 1  # [nbits]
    return jnp.concatenate([jnp.stack([lo < hi, has]), bits * has]).astype(lo.dtype)


def _votes_agree(votes: jax.Array) -> jax.Array:
    """True when no part's values differ and every bit is set in none or all of the parts with a
    value, i.e. every valid value of the whole batch is the same (True also when there is none)."""
    differ, has, bits = votes[0], votes[1], votes[2:]
    return (differ == 0) & jnp.all((bits == 0) | (bits == has))


def same_group_matrix(group_ids: jax.Array) -> jax.Array:
    """`[B, B]` float, 1 where rows i and j belong to the same prompt group."""
    group_ids = jnp.asarray(group_ids)
    if group_ids.ndim != 1:
        raise ValueError(f"group_ids must be [B], got shape {group_ids.shape}")
    return (group_ids[:, None] == group_ids[None, :]).astype(jnp.float32)


def _group_sum(same: jax.Array, values: jax.Array) -> jax.Array:
    """Per row, the sum of `values [B]` over the rows of its group. A select and a sum, not `same @ values`:
    a non-finite value stays in its own group (0 * NaN is NaN in every other group's product), and the
    sum is float32 whatever precision the backend gives matrix products (TF32 on GPUs, bf16 passes on TPU)."""
    return jnp.sum(jnp.where(same > 0, values[None, :], jnp.zeros((), values.dtype)), axis=1)


def group_mean_std(rewards: jax.Array, group_ids: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-row group mean, unbiased group std (0 for a group of one) and group size. Each `[B]`."""
    rewards = _float(rewards)
    if rewards.ndim != 1 or rewards.shape != jnp.shape(group_ids):
        raise ValueError(f"rewards must be [B] like group_ids, got {rewards.shape} and "
                         f"{jnp.shape(group_ids)}")
    same = same_group_matrix(group_ids).astype(rewards.dtype)  # [B, B]
    size = jnp.sum(same, axis=1)  # [B]
    lo, hi = _group_range(rewards, rewards, same)
    mean = jnp.where(lo == hi, lo, _group_sum(same, rewards) / size)  # all-equal group: exact mean, std 0
    sq_dev = jnp.where(same > 0, jnp.square(rewards[None, :] - mean[:, None]), 0.0)  # [B, B]
    var = jnp.sum(sq_dev, axis=1) / jnp.maximum(size - 1.0, 1.0)
    return mean, jnp.sqrt(var), size


def broadcast_to_tokens(sequence_values: jax.Array, mask: jax.Array) -> jax.Array:
    """`[B]` per-trajectory values -> `[B, T]`, zero on masked tokens."""
    mask = _float(mask)
    return sequence_values[:, None].astype(mask.dtype) * mask


def group_relative_advantages(rewards: jax.Array, group_ids: jax.Array,
                              normalize_std: bool = True) -> jax.Array:
    """Per-trajectory GRPO advantage `(R - mean_g R) / (std_g R + 1e-6)`, `[B]`.

    Unbiased std; a group of one gets 0 (its mean is its own reward).
    `normalize_std=False` is Dr. GRPO's `R - mean_g R`.
    """
    mean, std, _ = group_mean_std(rewards, group_ids)
    centered = _float(rewards) - mean
    return centered / (std + GROUP_STD_EPS) if normalize_std else centered


def grpo_advantages(rewards: jax.Array, group_ids: jax.Array, mask: jax.Array) -> jax.Array:
    """GRPO group advantages broadcast to every valid token. Returns `[B, T]`."""
    return broadcast_to_tokens(group_relative_advantages(rewards, group_ids), mask)


def dr_grpo_advantages(rewards: jax.Array, group_ids: jax.Array, mask: jax.Array) -> jax.Array:
    """Dr. GRPO: `R - mean_g R`, no std division. Returns `[B, T]`."""
    return broadcast_to_tokens(group_relative_advantages(rewards, group_ids, False), mask)


def _total(sums: jax.Array, batch_total: BatchTotal | None) -> jax.Array:
    return sums if batch_total is None else jnp.asarray(batch_total(sums), sums.dtype)


def masked_mean_var(values: jax.Array, mask: jax.Array,
                    batch_total: BatchTotal | None = None) -> tuple[jax.Array, jax.Array]:
    """Mean and unbiased variance of `values` over the valid tokens of the whole batch (scalars).

    No valid token gives mean 0, one gives variance 0; all valid values equal give exactly that
    value and variance 0 (module doc). `batch_total`: see the module doc; the mean is the whole
    batch's before the squared deviations from it are summed (two exchanges, the single-batch
    formula exactly)."""
    values, mask = _float(values), _float(mask)
    row_lo, row_hi = _valid_range(values, mask)
    lo, hi = jnp.min(row_lo), jnp.max(row_hi)  # this part's
    local = jnp.stack([jnp.sum(mask), jnp.sum(_masked(values, mask))])
    sums = _total(jnp.concatenate([local, _constant_vote(lo, hi)]), batch_total)
    count = jnp.maximum(sums[0], 1.0)
    # All valid values equal: they are this part's `lo` (a part without one keeps total / count).
    mean = jnp.where(_votes_agree(sums[2:]) & (lo <= hi), lo, sums[1] / count)
    sq_dev_sum = _total(jnp.sum(_masked(jnp.square(values - mean), mask))[None], batch_total)[0]
    return mean, sq_dev_sum / jnp.maximum(count - 1.0, 1.0)


def masked_whiten(values: jax.Array, mask: jax.Array, batch_total: BatchTotal | None = None) -> jax.Array:
    """Whiten over valid tokens of the whole batch: `(x - mean) / sqrt(var + 1e-8)`, unbiased var.

    Returns `[B, T]`, zero where masked; exactly zero when all valid values are equal.
    `batch_total`: see the module doc.
    """
    values, mask = _float(values), _float(mask)
    mean, var = masked_mean_var(values, mask, batch_total)
    return _masked((values - mean) * jax.lax.rsqrt(var + WHITEN_EPS), mask)


def last_valid_token_onehot(mask: jax.Array) -> jax.Array:
    """`[B, T]` one-hot of each row's last `mask == 1` position (all zero for an empty row)."""
    mask = _float(mask)
    positions = jnp.arange(mask.shape[-1])
    last = jnp.max(jnp.where(mask > 0, positions, -1), axis=-1)  # [B]
    return (positions[None, :] == last[:, None]).astype(mask.dtype)


def reinforce_pp_advantages(
    rewards: jax.Array,
    mask: jax.Array,
    kl: jax.Array | None = None,
    kl_coef: float = 0.0,
    batch_total: BatchTotal | None = None,
) -> jax.Array:
    """Reinforce++: return-to-go (discount 1) of token rewards, whitened over the batch.

    Token reward = outcome reward at the last valid token, minus
    `kl_coef * kl` on every valid token when `kl` is given (`kl_in_reward`).

    Args:
      rewards: `[B]` outcome rewards.
      mask: `[B, T]` policy-token mask.
      kl: `[B, T]` per-token KL of the sampling policy to the reference, or None.
      kl_coef: weight of the KL penalty inside the reward.
      batch_total: the whole batch's sums when this is one process's part (module doc).
    """
    mask = _float(mask)
    token_rewards = _float(rewards)[:, None] * last_valid_token_onehot(mask)  # [B, T]
    if kl is not None:
        token_rewards = token_rewards - kl_coef * _masked(jax.lax.stop_gradient(_float(kl)), mask)
    returns = jnp.flip(jnp.cumsum(jnp.flip(token_rewards, -1), axis=-1), -1)  # [B, T]
    return masked_whiten(returns, mask, batch_total)


def reinforce_pp_baseline_advantages(rewards: jax.Array, group_ids: jax.Array, mask: jax.Array,
                                     batch_total: BatchTotal | None = None) -> jax.Array:
    """Reinforce++-baseline: `R - mean_g R` broadcast to tokens, then batch whitening."""
    return masked_whiten(dr_grpo_advantages(rewards, group_ids, mask), mask, batch_total)


def entropy_aware_advantages(
    advantages: jax.Array,
    entropy: jax.Array,
    mask: jax.Array,
    coef: float = 0.2,
    scope: str = "batch",
    group_ids: jax.Array | None = None,
    batch_total: BatchTotal | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """AEPO entropy-aware reshape: `A_t * (1 + a * z_t)` (spec §3.2).

    `z_t = (H_t - mean H) / std H` over valid tokens of the batch
    (`scope="batch"`; the whole update batch's with `batch_total`, module doc)
    or of the token's prompt group (`scope="group"`, always on one process); std
    is unbiased, and a std of 0 (or a single token) counts as 1. Std 0 is decided exactly:
    all valid `H` of the scope equal (max == min), not a float32 std that rounds to ~1e-8
    (module doc). `H` is detached.

    Returns:
      `([B, T] advantages, metrics)` with the batch entropy mean and std used.
    """
    if scope not in ENTROPY_ADV_SCOPES:
        raise ValueError(f"unknown entropy_adv_scope {scope!r}; known: {list(ENTROPY_ADV_SCOPES)}")
    advantages, mask = _float(advantages), _float(mask)
    entropy = jax.lax.stop_gradient(_float(entropy))
    if scope == "batch":
        mean, var = masked_mean_var(entropy, mask, batch_total)
        std = jnp.sqrt(var)
    else:
        if group_ids is None:
            raise ValueError("entropy_adv_scope='group' needs group_ids")
        same = same_group_matrix(group_ids).astype(mask.dtype)  # [B, B]
        count = _group_sum(same, jnp.sum(mask, -1))  # [B], valid tokens in each row's group
        lo, hi = _group_range(*_valid_range(entropy, mask), same)  # [B] each
        mean = _group_sum(same, jnp.sum(_masked(entropy, mask), -1)) / jnp.maximum(count, 1.0)  # [B]
        mean = jnp.where(lo == hi, lo, mean)  # all-equal group: exact mean, std exactly 0
        # rows of one group share one mean, so per-row squared deviations add up
        sq_dev_sum = _group_sum(same, jnp.sum(_masked(jnp.square(entropy - mean[:, None]), mask), -1))  # [B]
        std = jnp.sqrt(sq_dev_sum / jnp.maximum(count - 1.0, 1.0))
    std = jnp.where(std > 0, std, 1.0)
    if scope == "group":
        mean, std = mean[:, None], std[:, None]  # [B, 1]
    z = (entropy - mean) / std  # [B, T]
    metrics = {
        "entropy_adv_h_mean": jnp.mean(mean),
        "entropy_adv_h_std": jnp.mean(std),
        "entropy_adv_z_abs_mean": jnp.sum(_masked(jnp.abs(z), mask)) / jnp.maximum(jnp.sum(mask), 1.0),
    }
    return _masked(advantages * (1.0 + coef * z), mask), metrics


def overlong_penalty(
    response_lengths: jax.Array,
    max_response_len: int,
    buffer_len: int,
    penalty_factor: float = 1.0,
) -> jax.Array:
    """DAPO overlong shaping, added to the reward (spec §3.2). `[B]`.

    `0` if `L <= Lmax - Lc`; `((Lmax - Lc) - L) / Lc` inside the buffer (which
    reaches `-1` at `L = Lmax`); `-1` beyond `Lmax`; all times `penalty_factor`.
    """
    if not 0 < buffer_len < max_response_len:  # Lc = Lmax would penalise every response by its length
        raise ValueError(f"need 0 < buffer_len < max_response_len, got {buffer_len}, "
                         f"{max_response_len}")
    lengths = _float(response_lengths)
    expected = max_response_len - buffer_len
    penalty = jnp.clip((expected - lengths) / buffer_len, -1.0, 0.0)
    return penalty_factor * penalty


def dynamic_sampling_keep(rewards: jax.Array, group_ids: jax.Array) -> jax.Array:
    """DAPO dynamic-sampling filter: bool `[B]`, False for rows whose group's rewards are all equal.

    Such groups (including groups of one) give every token zero advantage; the
    rollout drops them and samples more prompts (spec §3.2).
    """
    rewards = _float(rewards)
    same = same_group_matrix(group_ids) > 0  # [B, B]
    differs = rewards[:, None] != rewards[None, :]
    return jnp.any(same & differs, axis=1)
