"""ARPO hard attribution fed from the rollout tree (issue 16 part 3), on a hand-built tree.

Group 0 (prompt of 3 tokens; response positions below):
    A (global): gen 0-1, tool result 2-3, gen 4-6                  reward 1
    B = A.branch at 4: + gen 4-5, tool result 6, gen 7 (id 32)     reward 0
    C = B.branch at 7: + gen 7-8, its first token is 32 by chance  reward 1
    D (global): gen 0-2                                            reward 0
Group 1: E alone (a group of one: advantage 0).
"""

import dataclasses

import numpy as np
import pytest

from aepo_jax.agent.trajectory import ToolStep, Trajectory, tree_shared_prefixes
from aepo_jax.objectives import compute_advantages, get_preset, shared_prefix_lengths
from aepo_jax.training.rollout_batch import rollout_sequences

PROMPT = [5, 6, 7]


def generate(traj: Trajectory, ids: list[int]) -> None:
    traj.add_generated(ids, [-1.0] * len(ids), [0.5] * len(ids))


def tool(traj: Trajectory, ids: list[int]) -> None:
    start = len(traj.response_ids)
    traj.add_tool_result(ids)
    traj.tool_steps.append(ToolStep("search", "q", "r", True, start, start + len(ids)))


def hand_built_groups():
    a = Trajectory(traj_id=0, prompt_index=0, prompt_ids=list(PROMPT), root_id=0)
    generate(a, [10, 11])
    tool(a, [20, 21])
    b = a.branch(1, 4)
    generate(a, [12, 13, 14])
    generate(b, [30, 31])
    tool(b, [22])
    c = b.branch(2, 7)
    generate(b, [32])
    generate(c, [32, 41])
    d = Trajectory(traj_id=3, prompt_index=0, prompt_ids=list(PROMPT), root_id=3)
    generate(d, [50, 51, 52])
    e = Trajectory(traj_id=4, prompt_index=1, prompt_ids=[9, 9], root_id=4)
    generate(e, [60, 61])
    return [[a, b, c, d], [e]], [[1.0, 0.0, 1.0, 0.0], [1.0]]


def test_tree_shared_prefixes_of_the_hand_built_tree():
    (group, _), _ = hand_built_groups()
    want = np.array([[7, 4, 4, 0],
                     [4, 8, 7, 0],
                     [4, 7, 9, 0],
                     [0, 0, 0, 3]])
    np.testing.assert_array_equal(tree_shared_prefixes(group), want)
    # never more than the token ids share; here less, where C's token 32 matches B's by chance
    ids = np.zeros((4, 9), np.int64)
    for i, t in enumerate(group):
        ids[i, : len(t.response_ids)] = t.response_ids
    by_tokens = shared_prefix_lengths(ids, np.zeros(4), np.array([len(t.response_ids) for t in group]))
    assert np.all(tree_shared_prefixes(group) <= by_tokens) and by_tokens[1, 2] == 8


def test_shared_prefix_tokens_get_the_mean_advantage_of_their_sharers():
    groups, rewards = hand_built_groups()
    rows = rollout_sequences(groups, rewards, max_len=64, length_bucket=8)
    assert rows.shared_prefix_len.shape == (5, 5)
    np.testing.assert_array_equal(rows.shared_prefix_len[:4, :4], tree_shared_prefixes(groups[0]) + len(PROMPT))
    assert rows.shared_prefix_len[4, 4] == 2 + 2 and not rows.shared_prefix_len[:4, 4:].any()

    preset = dataclasses.replace(get_preset("arpo"), hard_attribution=True)
    adv, _ = compute_advantages(preset, rows.rewards, rows.group_ids, rows.padded()["mask"],
                                shared_prefix_len=rows.shared_prefix_len)
    adv = np.asarray(adv)

    # by hand: GRPO over group 0 (unbiased std, eps 1e-6), then means over each token's sharers
    scale = 0.5 / (np.std([1.0, 0.0, 1.0, 0.0], ddof=1) + 1e-6)
    a, b, c, d = scale, -scale, scale, -scale
    abc, bc = (a + b + c) / 3, (b + c) / 2
    masked = np.nan  # tool-result positions: advantage 0 whatever the attribution
    want = {
        0: [abc, abc, masked, masked, a, a, a],
        1: [abc, abc, masked, masked, bc, bc, masked, b],
        2: [abc, abc, masked, masked, bc, bc, masked, c, c],
        3: [d, d, d],
        4: [0.0, 0.0],
    }
    for row, values in want.items():
        prompt = len(groups[0][0].prompt_ids) if row < 4 else 2
        got = adv[row, prompt: prompt + len(values)]
        values = np.asarray(values)
        np.testing.assert_allclose(got[~np.isnan(values)], values[~np.isnan(values)], rtol=1e-5)
        assert np.all(got[np.isnan(values)] == 0)
        assert np.all(adv[row, :prompt] == 0) and np.all(adv[row, prompt + len(values):] == 0)


def test_soft_attribution_ignores_the_tree():
    groups, rewards = hand_built_groups()
    rows = rollout_sequences(groups, rewards, max_len=64)
    soft, _ = compute_advantages(get_preset("arpo"), rows.rewards, rows.group_ids, rows.padded()["mask"],
                                 shared_prefix_len=rows.shared_prefix_len)
    scale = 0.5 / (np.std([1.0, 0.0, 1.0, 0.0], ddof=1) + 1e-6)
    assert np.asarray(soft)[0, 3] == pytest.approx(scale, rel=1e-5)  # A's first token keeps A's own advantage


def test_a_non_finite_reward_is_named_in_a_warning():
    """The step goes on and its non-finite updates are skipped and counted (tests/training/test_nonfinite_update.py);
    nothing said which reward caused them."""
    groups, rewards = hand_built_groups()
    rewards = [list(group) for group in rewards]
    rewards[0][2] = float("nan")
    with pytest.warns(UserWarning, match=r"group 0, trajectory 2: reward nan is not a finite number"):
        rows = rollout_sequences(groups, rewards, max_len=64, length_bucket=8)
    assert np.isnan(rows.rewards[2]) and np.isfinite(np.delete(rows.rewards, 2)).all()
