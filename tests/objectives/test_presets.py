"""Algorithm presets and the `compute_advantages` pipeline they drive."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

from aepo_jax.objectives import (
    PRESETS,
    AlgorithmPreset,
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


# Every AlgorithmPreset field, its value for a preset that does not set it, written from the spec
# (the line quoted) and not read from presets.py. Fields the spec gives no value for carry the choice
# docs/objectives.md documents (marked "open"), so a new field or a changed default fails here.
SPEC_DEFAULTS = {
    # §3.1 "Dual clip (`dual_clip_c`, default 3.0, set `None` to disable; not for CISPO)"
    "dual_clip_c": 3.0,
    # §3.1 "Clip defaults: `el = eh = 0.2` (AEPO, ARPO, GRPO, GPPO as released)"
    "clip_low": 0.2,
    "clip_high": 0.2,
    # §3 "`token_mean` (sum over all valid tokens / number of valid tokens in the batch, the default)"
    "loss_agg": "token_mean",
    # §2.1 "Independent sampling (GRPO, DAPO, CISPO, GPPO, GSPO, Reinforce++)"
    "rollout": "independent",
    # §3.2 "AEPO entropy-aware: `A_t = A_i * (1 + a * z_t)`, `a = 0.2`" ... "(`entropy_adv_scope =
    # "batch"`, or `"group"`)": AEPO only
    "entropy_advantage": False,
    "entropy_advantage_coef": 0.2,
    "entropy_advantage_scope": "batch",
    # §3.2 "DAPO: GRPO advantages; dynamic sampling drops groups ...; overlong shaping": DAPO only
    "dynamic_sampling": False,
    "overlong_shaping": False,
    "overlong_buffer_len": None,  # open: Lc = 0.2 Lmax, the DAPO paper's 4096 of 20480
    # §3.2 "`((Lmax - Lc) - |y|) / Lc` inside the buffer, `-1` beyond `Lmax`": penalty factor 1
    "overlong_penalty_factor": 1.0,
    # §3.2 "ARPO hard attribution (switch): ... default is soft (plain GRPO)"
    "hard_attribution": False,
    # §3.3 "`kl_coef` default 0.0 for AEPO"; §7 "KL coefficient 0"
    "kl_coef": 0.0,
    "kl_estimator": "k3",  # open: §3.3 lists k1, k2, k3 without a default
    "kl_in_reward": False,  # §3.2 Reinforce++ "minus the per-token KL penalty if `kl_in_reward`"
    # §3.3 "Optional entropy bonus `entropy_coef` (default 0)."
    "entropy_coef": 0.0,
    # §3.2 "GiGPO: `A = A_episode + omega * A_step`, `omega = 1`; `A_step` normalises the discounted
    # return (gamma 0.95) ... `mean_norm` (no std) default."
    "gigpo_gamma": 0.95,
    "gigpo_omega": 1.0,
    "gigpo_norm": "mean_norm",
}

SPEC_PRESETS = {
    # §3.1 "PPO / GRPO / DAPO / ARPO | `min(r A, clip(r, 1-el, 1+eh) A)`"; §3.2 "GRPO: `A_i = (R_i -
    # mean_g R) / (std_g R + 1e-6)`". Aggregation: §2.3 "The GRPO baseline in the paper is ARPO's
    # machinery with `initial_rollouts = k` (no branching)", so ARPO's token_mean, which is also
    # §3's "`token_mean` (..., the default)"; "`seq_mean_token_mean` (GRPO paper)" is an override.
    "grpo": {"surrogate": "ppo", "advantage": "grpo", "loss_agg": "token_mean"},
    # §3 "`seq_mean_token_sum_norm` (Dr. GRPO: token sum / constant `max_len`)"; §3.2 "Dr. GRPO: no
    # std division." Surrogate open: GRPO's.
    "dr_grpo": {"surrogate": "ppo", "advantage": "dr_grpo", "loss_agg": "seq_mean_token_sum_norm"},
    # §3.2 "Reinforce++: return of the outcome reward at the last valid token (discount 1), minus the
    # per-token KL penalty if `kl_in_reward`". Open: the KL on (k1, 0.01, OpenRLHF's), PPO surrogate.
    "reinforce_pp": {"surrogate": "ppo", "advantage": "reinforce_pp", "kl_in_reward": True,
                     "kl_coef": 0.01, "kl_estimator": "k1"},
    # §3.2 "Reinforce++-baseline: `R_i - mean_g R`, then batch whitening." Surrogate open: PPO.
    "reinforce_pp_baseline": {"surrogate": "ppo", "advantage": "reinforce_pp_baseline"},
    # §3.1 "DAPO `el = 0.2, eh = 0.28`"; §3.2 "DAPO: GRPO advantages; dynamic sampling ...; overlong
    # shaping"
    "dapo": {"surrogate": "ppo", "advantage": "grpo", "clip_high": 0.28, "dynamic_sampling": True,
             "overlong_shaping": True},
    # §3.1 "CISPO `el` large (no lower bound), `eh = 0.28`"; "Dual clip (...; not for CISPO)".
    # el = 1 puts the lower bound 1 - el at 0. Advantage open: GRPO's.
    "cispo": {"surrogate": "cispo", "advantage": "grpo", "clip_low": 1.0, "clip_high": 0.28,
              "dual_clip_c": None},
    # §3.1 "GPPO | `min(r A, clip(r, (1-el) r/sg(r), (1+eh) r/sg(r)) A)`"; clips 0.2 / 0.2 (as
    # released). Advantage open: GRPO's.
    "gppo": {"surrogate": "gppo", "advantage": "grpo"},
    # §3.2 "GiGPO: ... anchor-state group: trajectories of the prompt whose token prefix up to the end
    # of a tool result is identical (branch points are exactly such states)". Open: the ARPO tree
    # rollout (its branch points are the shared states), PPO surrogate.
    "gigpo": {"surrogate": "ppo", "advantage": "gigpo", "rollout": "arpo"},
    # §2.2 "ARPO: entropy-based adaptive branching"; §3.2 "ARPO hard attribution (switch): ...
    # default is soft (plain GRPO)"
    "arpo": {"surrogate": "ppo", "advantage": "grpo", "rollout": "arpo"},
    # §3.1 "AEPO | `min(r A, clip(r, 1-el, (1+eh) r/sg(r)) A)`"; §2.3 "AEPO: dynamic entropy-balanced
    # rollout"; §3.2 "It must be computed whenever enabled"; §3.3 "`kl_coef` default 0.0 for AEPO"
    "aepo": {"surrogate": "aepo", "advantage": "grpo", "rollout": "aepo", "entropy_advantage": True},
    # §3.1 "GSPO: sequence ratio `s_i = exp(mean_t(logp - logp_old))` clipped at `(1-3e-4, 1+4e-4)`".
    # Open: the GSPO paper's sequence mean (seq_mean_token_mean), GRPO advantages.
    "gspo": {"surrogate": "gspo", "advantage": "grpo", "clip_low": 3e-4, "clip_high": 4e-4,
             "loss_agg": "seq_mean_token_mean"},
}


def test_spec_tables_cover_every_preset_and_field():
    assert sorted(SPEC_PRESETS) == sorted(PRESETS)
    fields = {f.name for f in dataclasses.fields(AlgorithmPreset)} - {"name", "surrogate", "advantage"}
    assert sorted(SPEC_DEFAULTS) == sorted(fields)


@pytest.mark.parametrize("name", sorted(SPEC_PRESETS))
def test_preset_values_follow_the_spec(name):
    preset = get_preset(name)
    expected = {"name": name} | SPEC_DEFAULTS | SPEC_PRESETS[name]
    got = {field: getattr(preset, field) for field in expected}
    wrong = {field: (got[field], value) for field, value in expected.items() if got[field] != value}
    assert not wrong, f"{name}: field: (preset, spec) {wrong}"
    loss = preset.loss_config()  # what policy_loss receives
    assert (loss.surrogate, loss.clip_low, loss.clip_high, loss.dual_clip_c, loss.loss_agg, loss.entropy_coef) == (
        expected["surrogate"], expected["clip_low"], expected["clip_high"], expected["dual_clip_c"],
        expected["loss_agg"], expected["entropy_coef"])
    assert loss.kl_coef == (0.0 if expected["kl_in_reward"] else expected["kl_coef"])


def test_grpo_papers_aggregation_is_one_override_away():
    # §3 "`seq_mean_token_mean` (GRPO paper)": reachable with dataclasses.replace (and with
    # --config.objective.loss_agg=seq_mean_token_mean, which build.preset_from passes on).
    from aepo_jax.training.build import preset_from
    from configs.grpo_tiny import get_config

    paper = dataclasses.replace(get_preset("grpo"), loss_agg="seq_mean_token_mean")
    assert paper.loss_config().loss_agg == "seq_mean_token_mean"
    cfg = get_config()
    assert preset_from(cfg).loss_agg == "token_mean"
    cfg.objective.loss_agg = "seq_mean_token_mean"
    assert preset_from(cfg).loss_config().loss_agg == "seq_mean_token_mean"


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


def test_reinforce_pp_preset_puts_its_kl_coefficient_into_the_token_rewards():
    """Spec §3.2: "minus the per-token KL penalty if `kl_in_reward`", with the preset's coefficient 0.01. The
    objective tests only checked that a missing KL is refused, so a dispatch passing 0 instead passed."""
    preset = get_preset("reinforce_pp")
    assert preset.kl_in_reward and preset.kl_coef == 0.01
    mask = np.array([[1, 1, 0, 1, 0], [1, 1, 1, 0, 0]], np.float64)  # row 0 has a tool hole
    kl = np.array([[0.5, 2.0, 9.0, 1.0, 9.0], [3.0, 0.2, 1.5, 9.0, 9.0]])  # 9: masked
    rewards = np.array([1.0, -1.0])
    adv, _ = compute_advantages(preset, rewards, np.array([0, 0]), mask, kl=kl)
    returns = np.zeros_like(kl)  # float64 reference: return-to-go of -0.01 * KL, plus R at the last valid token
    for row in range(2):
        valid = np.flatnonzero(mask[row])
        running = 0.0
        for t in valid[::-1]:
            running += -0.01 * kl[row, t] + (rewards[row] if t == valid[-1] else 0.0)
            returns[row, t] = running
    flat = returns[mask > 0]
    expected = (returns - flat.mean()) / np.sqrt(flat.var(ddof=1) + 1e-8) * mask
    np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-5, atol=1e-6)
