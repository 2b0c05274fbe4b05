"""Algorithm presets and the `compute_advantages` pipeline they drive."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

from aepo_jax.objectives import (
    PRESETS,
    compute_advantages,
    get_preset,
    grpo_advantages,
    make_preset,
)
from aepo_jax.objectives.advantage_dispatch import overlong_buffer_len

SPEC_NAMES = ["grpo", "dr_grpo", "reinforce_pp", "reinforce_pp_baseline", "dapo", "cispo", "gppo",
              "gigpo", "arpo", "aepo", "gspo"]


def test_every_spec_algorithm_has_a_preset():
    assert sorted(PRESETS) == sorted(SPEC_NAMES)
    for name in SPEC_NAMES:
        assert get_preset(name).name == name


@pytest.mark.parametrize(
    "name, surrogate, advantage, clip_low, clip_high, dual_clip_c, loss_agg, rollout",
    [
        ("aepo", "aepo", "grpo", 0.2, 0.2, 3.0, "token_mean", "aepo"),
        ("arpo", "ppo", "grpo", 0.2, 0.2, 3.0, "token_mean", "arpo"),
        ("grpo", "ppo", "grpo", 0.2, 0.2, 3.0, "seq_mean_token_mean", "independent"),
        ("dr_grpo", "ppo", "dr_grpo", 0.2, 0.2, 3.0, "seq_mean_token_sum_norm", "independent"),
        ("dapo", "ppo", "grpo", 0.2, 0.28, 3.0, "token_mean", "independent"),
        ("cispo", "cispo", "grpo", 1.0, 0.28, None, "token_mean", "independent"),
        ("gppo", "gppo", "grpo", 0.2, 0.2, 3.0, "token_mean", "independent"),
        ("gspo", "gspo", "grpo", 3e-4, 4e-4, 3.0, "seq_mean_token_mean", "independent"),
    ],
)
def test_preset_values_follow_the_spec(name, surrogate, advantage, clip_low, clip_high,
                                       dual_clip_c, loss_agg, rollout):
    p = get_preset(name)
    assert (p.surrogate, p.advantage, p.clip_low, p.clip_high, p.dual_clip_c, p.loss_agg,
            p.rollout) == (surrogate, advantage, clip_low, clip_high, dual_clip_c, loss_agg,
                           rollout)


def test_switches_of_dapo_aepo_arpo_and_reinforce():
    dapo, aepo, arpo = get_preset("dapo"), get_preset("aepo"), get_preset("arpo")
    assert dapo.dynamic_sampling and dapo.overlong_shaping and not dapo.entropy_advantage
    assert aepo.entropy_advantage and aepo.entropy_advantage_coef == 0.2
    assert aepo.entropy_advantage_scope == "batch" and aepo.kl_coef == 0.0
    assert not arpo.hard_attribution  # the spec's default is soft attribution
    assert get_preset("reinforce_pp").kl_in_reward
    assert get_preset("reinforce_pp").loss_config().kl_coef == 0.0  # KL sits in the reward, not in the loss


def test_unknown_names_raise_listing_the_known_ones():
    with pytest.raises(ValueError, match="unknown algorithm preset 'ppo'.*'aepo'"):
        get_preset("ppo")
    with pytest.raises(ValueError, match="unknown surrogate 'trpo'"):
        make_preset("x", "trpo", "grpo")
    with pytest.raises(ValueError, match="unknown rollout 'tree'"):
        make_preset("x", "ppo", "grpo", rollout="tree")
    with pytest.raises(ValueError, match="unknown loss_agg"):
        make_preset("x", "ppo", "grpo", loss_agg="sum")
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_preset("aepo").clip_high = 0.3


REWARDS = np.array([1.0, 0.0, 0.5, 0.5])
GROUPS = np.array([0, 0, 1, 1])
MASK = np.ones((4, 3), np.float32)


def test_dapo_shapes_rewards_before_group_normalisation():
    lengths = np.array([10, 20, 10, 18])  # Lmax 20, Lc 4: penalties 0, -1, 0, -0.5
    preset = dataclasses.replace(get_preset("dapo"), overlong_buffer_len=4)
    adv, metrics = compute_advantages(preset, REWARDS, GROUPS, MASK, response_lengths=lengths,
                                      max_response_len=20)
    shaped = REWARDS + np.array([0.0, -1.0, 0.0, -0.5])
    np.testing.assert_allclose(np.asarray(adv), np.asarray(grpo_advantages(shaped, GROUPS, MASK)),
                               rtol=1e-6)
    assert float(metrics["overlong_penalty_mean"]) == pytest.approx(-0.375)
    with pytest.raises(ValueError, match="needs response_lengths"):
        compute_advantages(preset, REWARDS, GROUPS, MASK)


def spec_overlong_penalty(lengths, lmax, lc):
    """Spec §3.2 in float64: 0 up to Lmax - Lc, ((Lmax - Lc) - |y|) / Lc in the buffer, -1 beyond Lmax."""
    lengths = np.asarray(lengths, np.float64)
    inside = ((lmax - lc) - lengths) / lc
    return np.where(lengths <= lmax - lc, 0.0, np.where(lengths > lmax, -1.0, inside))


@pytest.mark.parametrize("lmax, lc", [(4096, 819), (6192, 1238), (20480, 4096)])  # 7B, 14B, DAPO paper
def test_dapo_default_buffer_is_the_papers_share_of_the_budget(lmax, lc):
    # Lc = 0.2 Lmax (4096 of 20480), so responses up to 0.8 Lmax are not penalised at any budget.
    lengths = np.array([1, lmax // 2, lmax - lc, lmax - lc + 1, lmax - lc // 2, lmax, lmax + 7])
    rewards, groups, mask = np.zeros(7, np.float32), np.zeros(7, np.int32), np.ones((7, 2), np.float32)
    _, metrics = compute_advantages(get_preset("dapo"), rewards, groups, mask, response_lengths=lengths,
                                    max_response_len=lmax)
    assert overlong_buffer_len(None, lmax) == lc
    want = spec_overlong_penalty(lengths, lmax, lc)
    np.testing.assert_array_equal(want[:3], 0.0)
    assert float(metrics["overlong_penalty_mean"]) == pytest.approx(want.mean(), rel=1e-6)
    one = dataclasses.replace(get_preset("dapo"), dynamic_sampling=False)
    for length, penalty in zip(lengths, want):  # one row each: reward_mean is that row's shaped reward
        _, m = compute_advantages(one, np.zeros(1, np.float32), np.zeros(1, np.int32), np.ones((1, 1)),
                                  response_lengths=np.array([length]), max_response_len=lmax)
        assert float(m["reward_mean"]) == pytest.approx(penalty, abs=1e-6), length


def test_dapo_buffer_at_or_above_the_budget_raises_instead_of_clamping():
    preset = dataclasses.replace(get_preset("dapo"), overlong_buffer_len=4096)
    args = (np.zeros(2, np.float32), np.zeros(2, np.int32), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match=r"0 < Lc < max_response_len \(Lmax\) = 4096, got 4096"):
        compute_advantages(preset, *args, response_lengths=np.array([10, 20]), max_response_len=4096)
    compute_advantages(preset, *args, response_lengths=np.array([10, 20]), max_response_len=4097)
    with pytest.raises(ValueError, match="overlong_buffer_len must be > 0 or None"):
        dataclasses.replace(get_preset("dapo"), overlong_buffer_len=0)


def test_dapo_tiny_config_keeps_its_buffer_and_a_bad_one_fails_at_build():
    from aepo_jax.training.build import preset_from
    from configs.dapo_tiny import get_config

    cfg = get_config()
    preset = preset_from(cfg)
    lmax = int(cfg.rollout.max_response_len)
    assert (preset.overlong_buffer_len, lmax) == (8, 64)
    lengths = np.array([10, 56, 60, 64, 70])  # <= Lmax - Lc, = Lmax - Lc, in the buffer, = Lmax, beyond
    one = dataclasses.replace(preset, dynamic_sampling=False)
    for length, penalty in zip(lengths, spec_overlong_penalty(lengths, lmax, 8)):
        _, m = compute_advantages(one, np.zeros(1, np.float32), np.zeros(1, np.int32), np.ones((1, 1)),
                                  response_lengths=np.array([length]), max_response_len=lmax)
        assert float(m["reward_mean"]) == pytest.approx(penalty, abs=1e-6), length
    cfg.objective.overlong_buffer_len = 64
    with pytest.raises(ValueError, match="0 < Lc < max_response_len"):
        preset_from(cfg)


def test_aepo_pipeline_reshapes_grpo_by_entropy():
    entropy = np.array([[1.0, 2.0, 3.0]] * 4)
    adv, metrics = compute_advantages(get_preset("aepo"), REWARDS, GROUPS, MASK, entropy=entropy)
    base = np.asarray(grpo_advantages(REWARDS, GROUPS, MASK))
    z = (entropy - 2.0) / np.std(entropy, ddof=1)
    np.testing.assert_allclose(np.asarray(adv), base * (1 + 0.2 * z), rtol=1e-5)
    assert "entropy_adv_h_std" in metrics
    with pytest.raises(ValueError, match="needs entropy"):
        compute_advantages(get_preset("aepo"), REWARDS, GROUPS, MASK)


def test_arpo_hard_attribution_switch():
    preset = dataclasses.replace(get_preset("arpo"), hard_attribution=True)
    shared = np.array([[3, 1, 0, 0], [1, 3, 0, 0], [0, 0, 3, 0], [0, 0, 0, 3]])
    adv, _ = compute_advantages(preset, REWARDS, GROUPS, MASK, shared_prefix_len=shared)
    soft = np.asarray(grpo_advantages(REWARDS, GROUPS, MASK))
    expected = soft.copy()
    expected[:2, 0] = 0.0  # rows 0, 1 share column 0: mean of +a and -a
    np.testing.assert_allclose(np.asarray(adv), expected, atol=1e-6)
    with pytest.raises(ValueError, match="hard attribution needs a per-trajectory"):
        dataclasses.replace(get_preset("reinforce_pp"), hard_attribution=True)


def test_gigpo_and_reinforce_pipelines_need_their_inputs():
    tokens = np.array([[1, 2, 3]] * 4)
    adv, metrics = compute_advantages(get_preset("gigpo"), REWARDS, GROUPS, MASK, tokens=tokens,
                                      step_starts=[[0]] * 4)
    # one step per trajectory: A = 2 * (R - mean) under mean_norm (step return = R)
    np.testing.assert_allclose(np.asarray(adv)[:, 0], [1.0, -1.0, 0.0, 0.0], atol=1e-6)
    assert metrics["gigpo_step_groups"] == 2.0
    with pytest.raises(ValueError, match="needs kl"):
        compute_advantages(get_preset("reinforce_pp"), REWARDS, GROUPS, MASK)
    adv, _ = compute_advantages(get_preset("reinforce_pp_baseline"), REWARDS, GROUPS, MASK)
    # group-centred rewards [0.5, -0.5, 0, 0] on every token, whitened over the 12 valid tokens
    centred = np.array([0.5, -0.5, 0.0, 0.0])[:, None] * MASK
    np.testing.assert_allclose(np.asarray(adv), centred / np.sqrt(np.var(centred, ddof=1) + 1e-8), rtol=1e-6)


def test_compute_advantages_jits_for_array_only_presets():
    preset = dataclasses.replace(get_preset("aepo"), hard_attribution=True)
    shared = np.array([[3, 1, 0, 0], [1, 3, 0, 0], [0, 0, 3, 0], [0, 0, 0, 3]])
    entropy = np.arange(12.0).reshape(4, 3)
    fn = jax.jit(functools.partial(compute_advantages, preset))
    adv, _ = fn(REWARDS, GROUPS, MASK, entropy=entropy, shared_prefix_len=shared)
    eager, _ = compute_advantages(preset, REWARDS, GROUPS, MASK, entropy=entropy,
                                  shared_prefix_len=shared)
    np.testing.assert_allclose(np.asarray(adv), np.asarray(eager), rtol=1e-6)


def test_compute_advantages_names_mismatched_shapes():
    with pytest.raises(ValueError, match=r"rewards \[B\] and mask \[B, T\], got \(4,\) and \(3, 3\)"):
        compute_advantages(get_preset("grpo"), REWARDS, GROUPS, np.ones((3, 3)))
    with pytest.raises(ValueError, match=r"entropy must be \[B, T\] like mask \(4, 3\), got \(4, 2\)"):
        compute_advantages(get_preset("aepo"), REWARDS, GROUPS, MASK, entropy=np.ones((4, 2)))
