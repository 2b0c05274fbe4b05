"""GiGPO anchor-state steps and ARPO hard attribution on a hand-made tree (spec §3.2)."""

import jax
import numpy as np
import pytest

from aepo_jax.objectives import (
    gigpo_advantages,
    hard_attribution_advantages,
    shared_prefix_lengths,
)

# One prompt group of three trajectories in the trainer layout (prompt, then
# response, from column 0) with an empty prompt, so the response starts at
# column 0. Columns 0-1: first generated segment; column 2: a tool result
# (mask 0, token 9); columns 3-4: second segment; 5-7: padding.
# Rows 0 and 1 are a fork at the end of the tool result (shared prefix of 3
# columns); row 2 is an independent sample that happens to end the same way.
# Row 3 belongs to another prompt and repeats row 0's tokens exactly.
TOKENS = np.array([
    [1, 2, 9, 3, 4, 0, 0, 0],
    [1, 2, 9, 5, 6, 0, 0, 0],
    [7, 8, 9, 3, 4, 0, 0, 0],
    [1, 2, 9, 3, 4, 0, 0, 0],
])
MASK = np.array([[1, 1, 0, 1, 1, 0, 0, 0]] * 4, np.float32)
GROUPS = np.array([0, 0, 0, 1])
LENGTHS = np.array([5, 5, 5, 5])
STEP_STARTS = [[0, 3]] * 4


def test_shared_prefix_lengths_hand_made_tree():
    shared = shared_prefix_lengths(TOKENS, GROUPS, LENGTHS)
    expected = np.array([
        [5, 3, 0, 0],
        [3, 5, 0, 0],
        [0, 0, 5, 0],
        [0, 0, 0, 5],  # identical tokens, but another prompt: nothing shared
    ])
    np.testing.assert_array_equal(shared, expected)


def test_hard_attribution_gives_shared_tokens_the_mean_advantage():
    shared = shared_prefix_lengths(TOKENS, GROUPS, LENGTHS)
    seq_adv = np.array([1.0, -1.0, 0.5, 2.0])
    out = np.asarray(hard_attribution_advantages(seq_adv, shared, GROUPS, MASK))
    expected = np.array([
        [0.0, 0.0, 0.0, 1.0, 1.0, 0, 0, 0],     # columns 0-1 shared with row 1: mean(1, -1)
        [0.0, 0.0, 0.0, -1.0, -1.0, 0, 0, 0],
        [0.5, 0.5, 0.0, 0.5, 0.5, 0, 0, 0],     # shares nothing
        [2.0, 2.0, 0.0, 2.0, 2.0, 0, 0, 0],
    ])
    np.testing.assert_allclose(out, expected, atol=1e-7)


def test_hard_attribution_three_way_and_nested_prefixes():
    # Rows 0, 1, 2 share column 0; rows 0 and 1 also share column 1.
    shared = np.array([[3, 2, 1], [2, 3, 1], [1, 1, 3]])
    out = np.asarray(hard_attribution_advantages(np.array([3.0, 0.0, -3.0]), shared,
                                                 np.zeros(3, int), np.ones((3, 3))))
    expected = np.array([[0.0, 1.5, 3.0], [0.0, 1.5, 0.0], [0.0, -3.0, -3.0]])
    np.testing.assert_allclose(out, expected, atol=1e-7)


def test_gigpo_anchor_groups_on_hand_made_tree():
    rewards = np.array([1.0, 0.0, 1.0, 0.3])
    adv, metrics = gigpo_advantages(rewards, GROUPS, MASK, TOKENS, STEP_STARTS,
                                    gamma=0.95, omega=1.0, norm="mean_norm")
    # Episode (mean_norm): group 0 mean 2/3; row 3 is a group of one.
    episode = np.array([1 / 3, -2 / 3, 1 / 3, 0.0])
    # Step 0 (anchor: the bare prompt) returns 0.95 * R: group 0 mean 0.95 * 2/3.
    step0 = 0.95 * np.array([1.0, 0.0, 1.0]) - 0.95 * 2 / 3
    step0 = np.append(step0, 0.0)
    # Step 1 anchors: rows 0, 1 share [1, 2, 9] (returns 1, 0); row 2 ([7, 8, 9]) and
    # row 3 (other prompt) are alone.
    step1 = np.array([0.5, -0.5, 0.0, 0.0])
    expected = np.zeros_like(MASK)
    expected[:, 0:2] = (episode + step0)[:, None]
    expected[:, 3:5] = (episode + step1)[:, None]
    np.testing.assert_allclose(adv, expected, rtol=1e-6, atol=1e-7)
    assert metrics["gigpo_step_groups"] == 5.0  # prompt 0, prompt 1, [1,2,9]x2 prompts, [7,8,9]


def test_gigpo_mean_std_norm_and_omega():
    rewards = np.array([1.0, 0.0, 1.0, 0.3])
    adv, _ = gigpo_advantages(rewards, GROUPS, MASK, TOKENS, STEP_STARTS, omega=0.5,
                              norm="mean_std_norm")
    std_ep = np.std([1.0, 0.0, 1.0], ddof=1)
    episode = (np.array([1.0, 0.0, 1.0]) - 2 / 3) / (std_ep + 1e-6)
    step1_rows01 = np.array([0.5, -0.5]) / (np.std([1.0, 0.0], ddof=1) + 1e-6)
    np.testing.assert_allclose(adv[:2, 3], episode[:2] + 0.5 * step1_rows01, rtol=1e-5)
    np.testing.assert_allclose(adv[2, 3], episode[2], rtol=1e-5)


def test_gigpo_rejects_bad_step_starts():
    with pytest.raises(ValueError, match="must be increasing"):
        gigpo_advantages(np.zeros(4), GROUPS, MASK, TOKENS, [[0, 3], [3, 0], [0], [0]])
    with pytest.raises(ValueError, match="policy tokens before its first step"):
        gigpo_advantages(np.zeros(4), GROUPS, MASK, TOKENS, [[1, 3], [0], [0], [0]])
    with pytest.raises(ValueError, match="unknown GiGPO norm"):
        gigpo_advantages(np.zeros(4), GROUPS, MASK, TOKENS, STEP_STARTS, norm="std")


def test_hard_attribution_rejects_a_response_only_prefix_matrix():
    # The trainer's rows are prompt-first: here a 3-token prompt (mask 0), then rows 0 and 1 share
    # their first 2 response tokens. Their shared_prefix_len counts the prompt (diagonal = prompt +
    # response = 7); the response-only count (diagonal 4) ends before the rows' last policy token
    # (column 6) and would silently shift every attribution by 3 columns.
    mask = np.array([[0, 0, 0, 1, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1, 0]], np.float32)
    adv, groups = np.array([1.0, -1.0]), np.zeros(2, int)
    response_only = np.array([[4, 2], [2, 4]])
    out = np.asarray(hard_attribution_advantages(adv, response_only + 3, groups, mask))
    np.testing.assert_allclose(out[:, 3:7], [[0, 0, 1, 1], [0, 0, -1, -1]], atol=1e-7)
    with pytest.raises(ValueError, match=r"shared_prefix_len does not match the mask's layout: rows \[0, 1\] "
                                         r"have own prefix length \(diagonal\) \[4, 4\] but policy tokens up to "
                                         r"column \[6, 6\]. Rows are prompt-first"):
        hard_attribution_advantages(adv, response_only, groups, mask)
    # under jit the values are traced and cannot be checked; the eager call above is the guard
    jax.jit(hard_attribution_advantages)(adv, response_only + 3, groups, mask)


@pytest.mark.parametrize("norm", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("value, n", [(0.3, 7), (1.1, 7), (0.7, 12), (1.1, 100)])
def test_gigpo_all_equal_returns_give_exactly_zero(norm, value, n):
    # n identical trajectories with reward `value`: every episode and step group is all-equal, so
    # A = 0 exactly (numpy's mean of seven 1.1s is 1 ulp off, which left ~1e-16 per step).
    tokens = np.tile(TOKENS[:1], (n, 1))
    adv, _ = gigpo_advantages(np.full(n, value), np.zeros(n, int), np.tile(MASK[:1], (n, 1)), tokens,
                              [[0, 3]] * n, norm=norm)
    np.testing.assert_array_equal(adv, 0.0)
