"""Advantage estimators of spec §3.2 on hand-made cases."""

import concurrent.futures
import itertools
import math
import threading

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


# Constants float32 cannot represent, at token counts whose float32 mean is a few ulps off (so a
# computed std is ~1e-8, not 0): (0.3, 7), (1.1, 100), (0.7, 12) gave A (1 +- 0.2) before the fix.
CONSTANTS = [(0.3, 7), (0.3, 12), (0.3, 100), (0.7, 3), (0.7, 7), (0.7, 12), (0.7, 100), (1.1, 7),
             (1.1, 12), (1.1, 100)]


@pytest.mark.parametrize("value, n", CONSTANTS)
def test_entropy_aware_std_zero_counts_as_one(value, n):
    # Spec §3.2 "Std 0 counts as 1": all-equal H gives z = 0, so the advantages come back exactly.
    adv = np.linspace(-2.0, 1.5, 2 * n, dtype=np.float32).reshape(2, n)
    entropy, mask = np.full((2, n), value, np.float32), np.ones((2, n), np.float32)
    out, metrics = entropy_aware_advantages(adv, entropy, mask, scope="batch")
    np.testing.assert_array_equal(np.asarray(out), adv)
    assert float(metrics["entropy_adv_h_std"]) == 1.0
    # group scope: group 3 is constant (two rows of `value`); group 5 is not, and keeps its z-scores
    entropy = np.vstack([entropy, np.linspace(0.1, 2.0, n, dtype=np.float32)[None, :]])
    adv3, mask3 = np.vstack([adv, adv[:1]]), np.ones((3, n), np.float32)
    out, _ = entropy_aware_advantages(adv3, entropy, mask3, scope="group", group_ids=np.array([3, 3, 5]))
    np.testing.assert_array_equal(np.asarray(out)[:2], adv)
    h = entropy[2].astype(np.float64)
    np.testing.assert_allclose(np.asarray(out)[2], adv[0] * (1 + 0.2 * (h - h.mean()) / h.std(ddof=1)),
                               rtol=1e-5)
    # one valid token, the rest masked garbage-free but different: still std 0 -> A unchanged
    out, _ = entropy_aware_advantages(np.array([[0.5, -2.0, 1.0]]), np.array([[value, 9.0, 9.0]]),
                                      np.array([[1.0, 0, 0]]), scope="batch")
    np.testing.assert_allclose(np.asarray(out), [[0.5, 0.0, 0.0]], rtol=1e-7)


@pytest.mark.parametrize("value, n", CONSTANTS)
def test_all_equal_rewards_give_exactly_zero_advantage(value, n):
    # (R - mean_g R) is exactly 0 in an all-equal group (spec §3.2 GRPO, Dr. GRPO; DAPO's filter
    # drops such groups because they carry no signal), and so are the whitened Reinforce++ returns
    # (x - mean) / sqrt(var + 1e-8) of an all-equal batch. A float32 mean a few ulps off gave
    # (R - mean) / (std + 1e-6) ~ 1e-2 and whitened values ~ 1e-4 instead.
    rewards = np.full(n, value, np.float32)
    groups, mask = np.zeros(n, np.int32), np.ones((n, 4), np.float32)
    for name, adv in {"grpo": grpo_advantages(rewards, groups, mask),
                      "dr_grpo": dr_grpo_advantages(rewards, groups, mask),
                      "reinforce_pp_baseline": reinforce_pp_baseline_advantages(rewards, groups, mask),
                      "reinforce_pp": reinforce_pp_advantages(rewards, mask),
                      "whiten": masked_whiten(np.full((2, n), value, np.float32), np.ones((2, n)))}.items():
        np.testing.assert_array_equal(np.asarray(adv), 0.0, err_msg=name)
    # a constant group next to a varied one: the constant group's rows are exactly 0
    mixed = np.concatenate([rewards, np.linspace(0.0, 1.0, n, dtype=np.float32)])
    adv = np.asarray(grpo_advantages(mixed, np.repeat([0, 1], n), np.ones((2 * n, 4), np.float32)))
    np.testing.assert_array_equal(adv[:n], 0.0)
    assert np.all(adv[n:][[0, -1], 0] != 0.0)


def test_garbage_at_masked_positions_does_not_leak():
    # Spec §3: every mean, std and sum runs over mask == 1 only. NaN / inf where mask == 0 must give
    # the advantages of zeros there (NaN * 0 is NaN, so `values * mask` poisoned every token).
    mask = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [1, 1, 0, 0, 0]], np.float32)
    garbage = np.where(mask > 0, 0.0, np.array([np.nan, np.inf, -np.inf, np.nan, np.inf])).astype(np.float32)
    entropy = np.array([[0.2, 1.0, 0.5, 0.0, 0.0], [0.3, 0.0, 0.9, 1.4, 0.0], [0.7, 0.1, 0.0, 0.0, 0.0]],
                       np.float32)
    adv = np.array([[1.0, 1.0, 1.0, 0.0, 0.0], [-0.5, 0.0, -0.5, -0.5, 0.0], [2.0, 2.0, 0.0, 0.0, 0.0]],
                   np.float32)
    groups, rewards = np.array([0, 0, 1]), np.array([1.0, 0.0, 0.5])
    kl = np.where(mask > 0, 0.05, 0.0).astype(np.float32)
    for scope in ("batch", "group"):
        clean, clean_metrics = entropy_aware_advantages(adv, entropy, mask, scope=scope, group_ids=groups)
        dirty, dirty_metrics = entropy_aware_advantages(adv + garbage, entropy + garbage, mask, scope=scope,
                                                        group_ids=groups)
        assert np.all(np.isfinite(np.asarray(clean)))
        np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean), err_msg=scope)
        for key, value in clean_metrics.items():
            assert float(dirty_metrics[key]) == float(value), (scope, key)
    clean = reinforce_pp_advantages(rewards, mask, kl=kl, kl_coef=0.1)
    dirty = reinforce_pp_advantages(rewards, mask, kl=kl + garbage, kl_coef=0.1)
    assert np.all(np.isfinite(np.asarray(clean)))
    np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean))
    np.testing.assert_array_equal(np.asarray(masked_whiten(entropy + garbage, mask)),
                                  np.asarray(masked_whiten(entropy, mask)))
    preset = objectives.get_preset("aepo")
    clean, _ = objectives.compute_advantages(preset, rewards, groups, mask, entropy=entropy)
    dirty, metrics = objectives.compute_advantages(preset, rewards, groups, mask, entropy=entropy + garbage)
    np.testing.assert_array_equal(np.asarray(dirty), np.asarray(clean))
    assert all(np.isfinite(float(v)) for v in metrics.values())


def process_parts(count: int):
    """`batch_total`s for `count` threads that each hold one part of a batch: like
    `parallel.multihost.process_sum`, each call sums the vector of every part (a barrier per call)."""
    barrier, slots = threading.Barrier(count), {}

    def make(part: int):
        calls = itertools.count()

        def batch_total(sums):
            call = next(calls)
            slots[call, part] = np.asarray(sums, np.float64)
            barrier.wait()
            return sum(slots[call, p] for p in range(count))
        return batch_total
    return [make(p) for p in range(count)]


def run_parts(fn, parts):
    """`fn(*part, batch_total)` for every part in its own thread, as processes would."""
    totals = process_parts(len(parts))
    with concurrent.futures.ThreadPoolExecutor(len(parts)) as pool:
        return list(pool.map(lambda i: fn(*parts[i], totals[i]), range(len(parts))))


@pytest.mark.parametrize("values", [(0.3, 0.3), (1.1, 1.1), (0.3, 0.7), (0.7, None)])
def test_batch_statistics_split_over_parts_decide_all_equal_exactly(values):
    # A batch split over processes (batch_total) must decide "all valid H equal" for the whole
    # batch: parts with equal constants -> A unchanged; different constants -> the whole batch's
    # z-scores; a part without a valid token (None) follows the others.
    n, parts = 7, []
    for i, value in enumerate(values):
        mask = np.ones((2, n), np.float32) if value is not None else np.zeros((2, n), np.float32)
        entropy = np.full((2, n), 0.0 if value is None else value, np.float32)
        parts.append((np.linspace(-1.0, 1.0 + i, 2 * n, dtype=np.float32).reshape(2, n), entropy, mask))

    def aware(adv, entropy, mask, batch_total):
        return np.asarray(objectives.entropy_aware_advantages(adv, entropy, mask, batch_total=batch_total)[0])

    def whiten(adv, entropy, mask, batch_total):
        return np.asarray(objectives.masked_whiten(entropy, mask, batch_total))

    whole = [np.concatenate([p[k] for p in parts]) for k in range(3)]
    for fn in (aware, whiten):
        got = np.concatenate(run_parts(fn, parts))
        want = fn(*whole, None)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=fn.__name__)
        if len(set(values) - {None}) == 1:  # all valid H equal: exactly A, exactly 0
            np.testing.assert_array_equal(got, whole[0] * whole[2] if fn is aware else 0.0)


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


def test_a_non_finite_reward_stays_in_its_own_group():
    """`same @ rewards` multiplied the NaN by 0 for every other group: one NaN reward (a judge reply that did
    not parse) made the whole batch's advantages NaN."""
    rewards, groups = np.array([1.0, 0.0, 0.5, np.nan, 0.2]), np.array([0, 0, 1, 1, 1])
    for bad in (np.nan, np.inf):
        rewards[3] = bad
        adv = np.asarray(grpo_advantages(rewards, groups, np.ones((5, 2), np.float32)))
        np.testing.assert_allclose(adv[:2], np.array([[0.5, 0.5], [-0.5, -0.5]]) / (math.sqrt(0.5) + 1e-6),
                                   rtol=1e-6)
        assert not np.isfinite(adv[2:]).all()


def test_group_scope_entropy_statistics_count_only_valid_tokens():
    """Every earlier group-scope case had an all-ones mask, so counting masked tokens passed too."""
    adv = np.array([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [2.0, 2.0, 2.0]])
    entropy = np.array([[0.0, 2.0, 7.0], [1.0, 1.0, 9.0], [5.0, 3.0, 4.0]])  # 7 and 9 are masked
    mask = np.array([[1, 1, 0], [1, 1, 0], [1, 1, 1]], np.float32)
    out, _ = entropy_aware_advantages(adv, entropy, mask, coef=0.2, scope="group", group_ids=np.array([4, 4, 9]))
    valid = np.array([0.0, 2.0, 1.0, 1.0])  # group 4's valid H: mean 1, unbiased std sqrt(2/3)
    z4 = (entropy[:2] - valid.mean()) / valid.std(ddof=1)
    z9 = (entropy[2] - 4.0) / 1.0  # H = 5, 3, 4: mean 4, unbiased std 1
    expected = np.vstack([adv[:2] * (1 + 0.2 * z4), adv[2:] * (1 + 0.2 * z9)]) * mask
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6)


def test_an_overlong_buffer_as_long_as_the_response_is_refused():
    """Lc = Lmax penalised every response in proportion to its length (docs/objectives.md); only the
    dispatch refused it, not the function itself."""
    with pytest.raises(ValueError, match="0 < buffer_len < max_response_len"):
        overlong_penalty(np.array([1, 10, 20]), max_response_len=20, buffer_len=20)
