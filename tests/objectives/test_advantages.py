"""Advantage estimators of spec §3.2 on hand-made cases."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax import objectives

# Jitted once per function: far fewer XLA compilations than op-by-op eager calls.
dr_grpo_advantages = jax.jit(objectives.dr_grpo_advantages)
dynamic_sampling_keep = jax.jit(objectives.dynamic_sampling_keep)
entropy_aware_advantages = jax.jit(objectives.entropy_aware_advantages, static_argnames="scope")
grpo_advantages = jax.jit(objectives.grpo_advantages)
masked_whiten = jax.jit(objectives.masked_whiten)
overlong_penalty = jax.jit(objectives.overlong_penalty,
                           static_argnames=("max_response_len", "buffer_len"))
reinforce_pp_advantages = jax.jit(objectives.reinforce_pp_advantages)
reinforce_pp_baseline_advantages = jax.jit(objectives.reinforce_pp_baseline_advantages)

# Group 0: four rewards, mean 0.75, unbiased std 0.5; group 7: a group of one;
# group 3: all-equal rewards. Ids need not be contiguous or sorted.
REWARDS = np.array([1.0, 0.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0])
GROUPS = np.array([0, 0, 0, 0, 7, 3, 3, 3])
MASK = np.ones((8, 3), np.float32)
MASK[1, 2] = 0.0


def test_grpo_hand_made_groups():
    adv = np.asarray(grpo_advantages(REWARDS, GROUPS, MASK))
    expected_rows = np.array([0.25, -0.75, 0.25, 0.25, 0, 0, 0, 0]) / (0.5 + 1e-6)
    expected_rows[4:] = 0.0  # group of one, all-equal group
    np.testing.assert_allclose(adv, expected_rows[:, None] * MASK, rtol=1e-6, atol=1e-7)
    assert adv[1, 2] == 0.0


def test_grpo_is_jittable_and_uses_unbiased_std():
    adv = grpo_advantages(jnp.array([0.0, 1.0]), jnp.array([5, 5]), jnp.ones((2, 1)))
    # mean 0.5, unbiased std sqrt(0.5): A = +-0.5 / sqrt(0.5)
    np.testing.assert_allclose(np.asarray(adv)[:, 0], [-math.sqrt(0.5), math.sqrt(0.5)], rtol=1e-5)


def test_dr_grpo_does_not_divide_by_std():
    adv = np.asarray(dr_grpo_advantages(REWARDS, GROUPS, MASK))
    expected_rows = np.array([0.25, -0.75, 0.25, 0.25, 0, 0, 0, 0])
    np.testing.assert_allclose(adv, expected_rows[:, None] * MASK, atol=1e-7)


def test_masked_whiten_hand_made():
    values = np.array([[1.0, 2.0], [3.0, 100.0]])
    mask = np.array([[1.0, 1.0], [1.0, 0.0]])
    # valid values 1, 2, 3: mean 2, unbiased var 1
    out = np.asarray(masked_whiten(values, mask))
    np.testing.assert_allclose(out, np.array([[-1.0, 0.0], [1.0, 0.0]]) / math.sqrt(1 + 1e-8),
                               rtol=1e-6)


def test_reinforce_pp_return_at_last_valid_token_and_whitening():
    mask = np.array([[1, 1, 0, 1, 0], [1, 1, 1, 0, 0]], np.float32)  # row 0 has a tool hole
    adv = np.asarray(reinforce_pp_advantages(np.array([1.0, -1.0]), mask))
    # returns: row 0 -> 1 on its valid tokens, row 1 -> -1; mean 0, unbiased var 6/5
    expected = np.array([[1, 1, 0, 1, 0], [-1, -1, -1, 0, 0]]) / math.sqrt(6 / 5 + 1e-8)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


def test_reinforce_pp_kl_in_reward_reduces_later_returns_less():
    mask = np.array([[1, 1, 0, 1, 0], [1, 1, 1, 0, 0]], np.float32)
    kl = np.full(mask.shape, 0.1)
    adv = np.asarray(reinforce_pp_advantages(np.array([1.0, -1.0]), mask, kl=kl, kl_coef=1.0))
    # return-to-go of token rewards (-0.1 per valid token, +R at the last one)
    returns = np.array([[0.7, 0.8, 0.9, 0.9, 0.0], [-1.3, -1.2, -1.1, 0.0, 0.0]])
    valid = returns[mask > 0]
    expected = (returns - valid.mean()) / math.sqrt(valid.var(ddof=1) + 1e-8) * mask
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)


def test_reinforce_pp_baseline_is_group_centred_then_whitened():
    mask = np.ones((4, 2), np.float32)
    adv = np.asarray(reinforce_pp_baseline_advantages(np.array([1.0, 0.0, 5.0, 5.0]),
                                                      np.array([0, 0, 1, 1]), mask))
    centred = np.array([0.5, -0.5, 0.0, 0.0])[:, None] * mask  # valid: mean 0, var 1/7 * 2
    expected = centred / math.sqrt(np.var(centred, ddof=1) + 1e-8)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)


def test_entropy_aware_batch_scope_hand_made():
    adv = np.ones((2, 2))
    entropy = np.array([[1.0, 2.0], [3.0, 50.0]])
    mask = np.array([[1.0, 1.0], [1.0, 0.0]])
    out, metrics = entropy_aware_advantages(adv, entropy, mask, coef=0.2, scope="batch")
    # H over valid tokens: 1, 2, 3 -> mean 2, unbiased std 1 -> z = -1, 0, 1
    np.testing.assert_allclose(np.asarray(out), [[0.8, 1.0], [1.2, 0.0]], rtol=1e-6)
    assert float(metrics["entropy_adv_h_mean"]) == pytest.approx(2.0)
    assert float(metrics["entropy_adv_h_std"]) == pytest.approx(1.0)


def test_entropy_aware_std_zero_counts_as_one():
    adv = np.array([[0.5, -2.0, 1.0]])
    out, _ = entropy_aware_advantages(adv, np.full((1, 3), 0.7), np.ones((1, 3)), scope="batch")
    np.testing.assert_allclose(np.asarray(out), adv, rtol=1e-7)
    out, _ = entropy_aware_advantages(adv, np.array([[0.7, 9.0, 9.0]]), np.array([[1.0, 0, 0]]),
                                      scope="batch")
    np.testing.assert_allclose(np.asarray(out), [[0.5, 0.0, 0.0]], rtol=1e-7)


def test_entropy_aware_group_scope_uses_each_group_statistics():
    adv = np.array([[1.0, 1.0], [-1.0, -1.0], [2.0, 2.0]])
    entropy = np.array([[0.0, 2.0], [1.0, 1.0], [5.0, 5.0]])
    groups = np.array([4, 4, 9])
    out, _ = entropy_aware_advantages(adv, entropy, np.ones((3, 2)), coef=0.2, scope="group",
                                      group_ids=groups)
    # group 4: H = 0, 2, 1, 1 -> mean 1, unbiased std sqrt(2/3); group 9: std 0 -> z = 0
    z = np.array([[-1.0, 1.0], [0.0, 0.0]]) / math.sqrt(2 / 3)
    expected = np.vstack([adv[:2] * (1 + 0.2 * z), adv[2:]])
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)


@pytest.mark.parametrize("scope", ["batch", "group"])
def test_entropy_aware_detaches_entropy_and_rejects_unknown_scope(scope):
    # Non-constant advantages: with A == 1 the z-scores sum to zero, so even an attached entropy would
    # give a zero gradient. Here the attached gradient is A_t * a * dz_t/dH, far from zero.
    adv = jnp.array([[1.0, 2.0, -1.0], [0.5, -3.0, 2.0]])
    groups = jnp.array([0, 0])
    grad = jax.grad(lambda h: jnp.sum(entropy_aware_advantages(adv, h, jnp.ones((2, 3)), scope=scope,
                                                               group_ids=groups)[0]))(
        jnp.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(np.asarray(grad), 0.0)
    with pytest.raises(ValueError, match="unknown entropy_adv_scope 'token'"):
        entropy_aware_advantages(np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 2)), scope="token")
    with pytest.raises(ValueError, match="needs group_ids"):
        entropy_aware_advantages(np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 2)), scope="group")


def test_overlong_penalty_at_the_three_boundaries():
    lmax, lc = 20, 4
    lengths = np.array([10, 16, 18, 20, 25])  # short, Lmax - Lc, inside buffer, Lmax, beyond
    np.testing.assert_allclose(
        np.asarray(overlong_penalty(lengths, max_response_len=lmax, buffer_len=lc)),
        [0.0, 0.0, -0.5, -1.0, -1.0], atol=1e-7)
    assert float(overlong_penalty(np.array([17]), max_response_len=lmax, buffer_len=lc)[0]) == \
        pytest.approx(-0.25)
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(lengths, max_response_len=20, buffer_len=0)


def test_dynamic_sampling_drops_all_equal_groups():
    rewards = np.array([1.0, 1.0, 0.0, 1.0, 0.5, 0.2, 0.2])
    groups = np.array([0, 0, 1, 1, 2, 3, 3])  # equal, mixed, single, equal
    keep = np.asarray(dynamic_sampling_keep(rewards, groups))
    np.testing.assert_array_equal(keep, [False, False, True, True, False, False, False])


def test_logged_reward_mean_ignores_padding_rows():
    """Rows padded for the mesh (mask all zero) must not enter the logged mean reward."""
    preset = objectives.get_preset("grpo")
    rewards = np.array([1.0, 0.0, -1.0, -1.0, 0.0, 0.0], np.float32)
    mask = np.zeros((6, 3), np.float32)
    mask[:4] = 1.0  # rows 4 and 5 are padding
    group_ids = np.array([0, 0, 1, 1, 2, 3])
    _, metrics = objectives.compute_advantages(preset, rewards, group_ids, mask)
    assert float(metrics["reward_mean"]) == pytest.approx(-0.25)
