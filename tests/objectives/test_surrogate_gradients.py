"""Gradient-weight table of spec §3.1, checked token by token and region by region.

The expected weight `F` is written below with plain numpy straight from the
spec's table; it never calls the code under test.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax.objectives import LossConfig, loss_config, policy_loss

EL, EH, C = 0.2, 0.28, 3.0
# One compilation per configuration instead of op-by-op eager dispatch.
_jitted = jax.jit(policy_loss, static_argnums=0, static_argnames=("max_len", "return_parts"))
LOSS_FIELDS = {f.name for f in dataclasses.fields(LossConfig)} - {"surrogate"}


def split_loss_kwargs(algorithm, kw):
    """`policy_loss(loss_config(algorithm, **settings), **arrays)` from one keyword dict."""
    settings = {k: v for k, v in kw.items() if k in LOSS_FIELDS}
    return loss_config(algorithm, **settings), {k: v for k, v in kw.items() if k not in LOSS_FIELDS}


def jitted_policy_loss(algorithm, **kw):
    config, arrays = split_loss_kwargs(algorithm, kw)
    return _jitted(config, **arrays)
TOKEN_SURROGATES = ("ppo", "gppo", "aepo", "cispo")

# Ratio regions (for el=0.2, eh=0.28, c=3): sampled well inside, away from the kinks.
REGIONS = {
    "below 1-el": (0.3, 0.75),
    "inside": (0.85, 1.2),
    "above 1+eh (below c)": (1.4, 2.8),
    "beyond dual clip c": (3.3, 6.0),
}


def region_grid(seed=0, rows=4):
    """Ratios covering every region x both advantage signs, plus region labels. `[rows, 16]`."""
    rng = np.random.default_rng(seed)
    ratios, signs, labels = [], [], []
    for name, (lo, hi) in REGIONS.items():
        for sign in (1.0, -1.0):
            for _ in range(2):
                ratios.append(rng.uniform(lo, hi, size=rows))
                signs.append(np.full(rows, sign))
                labels.append(f"{name}, A{'>' if sign > 0 else '<'}0")
    ratio = np.stack(ratios, axis=1)  # [rows, 16]
    adv = np.stack(signs, axis=1) * rng.uniform(0.3, 2.0, size=ratio.shape)
    logp_old = rng.uniform(-3.0, -0.5, size=ratio.shape)
    logp = logp_old + np.log(ratio)
    return logp, logp_old, adv, np.array(labels)


def expected_weight(algorithm, r, a, el, eh, c):
    """F of spec §3.1 (independent numpy transcription of the table)."""
    above, below = r > 1 + eh, r < 1 - el
    if algorithm == "cispo":
        return np.clip(r, 1 - el, 1 + eh)  # sign of A does not matter; no dual clip
    f = r.copy()
    if algorithm == "ppo":
        f[above & (a > 0)] = 0.0
        f[below & (a < 0)] = 0.0
    elif algorithm == "gppo":
        f[above & (a > 0)] = 1 + eh
        f[below & (a < 0)] = 1 - el
    elif algorithm == "aepo":
        f[above & (a > 0)] = 1 + eh
        f[below & (a < 0)] = 0.0
    if c is not None:
        f[(r > c) & (a < 0)] = 0.0
    return f


def loss_grad(algorithm, logp, logp_old, adv, mask, **kw):
    def loss_fn(lp):
        config, arrays = split_loss_kwargs(algorithm, kw)
        return policy_loss(config, logp=lp, logp_old=logp_old, advantages=adv, mask=mask, **arrays)[0]
    return np.asarray(jax.jit(jax.grad(loss_fn))(jnp.asarray(logp, jnp.float32)))


def assert_per_region(actual, expected, labels, what):
    for label in np.unique(labels):
        cols = labels == label
        np.testing.assert_allclose(actual[:, cols], expected[:, cols], rtol=2e-5, atol=1e-7,
                                   err_msg=f"{what}: region '{label}'")


@pytest.mark.parametrize("algorithm", TOKEN_SURROGATES)
@pytest.mark.parametrize("dual_clip_c", [C, None])
def test_gradient_equals_minus_table_weight_times_advantage(algorithm, dual_clip_c):
    if algorithm == "cispo" and dual_clip_c is not None:
        pytest.skip("CISPO takes no dual clip")
    logp, logp_old, adv, labels = region_grid()
    mask = np.ones_like(logp)
    grad = loss_grad(algorithm, logp, logp_old, adv, mask, clip_low=EL, clip_high=EH,
                     dual_clip_c=dual_clip_c)
    r = np.exp(logp - logp_old)
    expected = -expected_weight(algorithm, r, adv, EL, EH, dual_clip_c) * adv / mask.sum()
    assert_per_region(grad, expected, labels, f"{algorithm} dual_clip_c={dual_clip_c}")


def test_cispo_default_has_no_lower_clip():
    logp, logp_old, adv, labels = region_grid(seed=1)
    mask = np.ones_like(logp)
    grad = loss_grad("cispo", logp, logp_old, adv, mask)  # defaults: el = 1, eh = 0.28
    r = np.exp(logp - logp_old)
    expected = -np.minimum(r, 1.28) * adv / mask.sum()
    assert_per_region(grad, expected, labels, "cispo defaults")


def test_cispo_weight_is_independent_of_advantage_sign():
    logp, logp_old, adv, labels = region_grid(seed=2)
    mask = np.ones_like(logp)
    magnitude = np.abs(adv)
    g_pos = loss_grad("cispo", logp, logp_old, magnitude, mask, clip_low=EL, clip_high=EH)
    g_neg = loss_grad("cispo", logp, logp_old, -magnitude, mask, clip_low=EL, clip_high=EH)
    w_pos, w_neg = -g_pos / magnitude * mask.sum(), g_neg / magnitude * mask.sum()
    assert_per_region(w_pos, w_neg, labels, "cispo weight, A>0 vs A<0")


def gspo_rows(seed=3):
    """Rows whose sequence ratio sits in each GSPO region; token log-ratios vary around it."""
    rng = np.random.default_rng(seed)
    targets = {"inside": 1 + 1e-4, "above 1+eh": 1 + 2e-3, "below 1-el": 1 - 2e-3,
               "beyond dual clip c": 4.0}
    logp_rows, old_rows, adv_rows, labels = [], [], [], []
    for name, s in targets.items():
        for sign in (1.0, -1.0):
            noise = rng.normal(scale=0.05, size=6)
            noise -= noise.mean()  # row mean of the log-ratio is exactly log(s)
            old = rng.uniform(-3, -0.5, size=6)
            logp_rows.append(old + np.log(s) + noise)
            old_rows.append(old)
            adv_rows.append(sign * rng.uniform(0.3, 2.0, size=6))
            labels.append(f"{name}, A{'>' if sign > 0 else '<'}0")
    return (np.array(logp_rows), np.array(old_rows), np.array(adv_rows), np.array(labels))


def test_gspo_token_gradient_is_sequence_ratio_through_own_logp():
    logp, logp_old, adv, labels = gspo_rows()
    mask = np.ones_like(logp)
    el, eh = 3e-4, 4e-4
    grad = loss_grad("gspo", logp, logp_old, adv, mask, clip_low=el, clip_high=eh,
                     dual_clip_c=C, loss_agg="token_mean")
    s = np.exp(np.mean(logp - logp_old, axis=1, keepdims=True)) * np.ones_like(logp)
    f = s.copy()
    f[(s > 1 + eh) & (adv > 0)] = 0.0
    f[(s < 1 - el) & (adv < 0)] = 0.0
    f[(s > C) & (adv < 0)] = 0.0
    expected = -f * adv / mask.sum()
    for row, label in enumerate(labels):
        np.testing.assert_allclose(grad[row], expected[row], rtol=1e-4, atol=1e-8,
                                   err_msg=f"gspo: region '{label}'")


def test_gspo_sequence_ratio_averages_only_the_valid_tokens():
    """Rows with padding (A > 0): row 0's ratio over its valid tokens is above 1 + eh (clipped: no gradient)
    but inside the range when the mean runs over the whole width, padding counted as 0 or as what it holds;
    row 1 is inside either way. The one earlier masked row was clipped either way, so a mean over the
    padded width passed too."""
    el, eh = 3e-4, 4e-4
    old = np.array([[-1.0, -2.0, -1.5, -0.5, -3.0, -1.0], [-0.7, -1.2, -2.5, -1.0, -0.2, -4.0]])
    logp = old + np.array([[6e-4, 4e-4, 5e-4, 5e-4, -5.0, -5.0], [1e-4, 0.0, 2e-4, 1e-4, -5.0, 3.0]])
    mask = np.array([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]])
    adv = np.full_like(old, 1.5)
    s_valid = np.exp(np.sum((logp - old) * mask, axis=1) / mask.sum(axis=1))  # [1.0005, 1.0001]
    assert s_valid[0] > 1 + eh and 1 - el < s_valid[1] < 1 + eh
    for s_width in (np.exp(np.sum((logp - old) * mask, axis=1) / 6), np.exp(np.mean(logp - old, axis=1))):
        assert s_width[0] < 1 + eh  # under either mean over the width, row 0 would not be clipped
    grad = loss_grad("gspo", logp, old, adv, mask, clip_low=el, clip_high=eh, dual_clip_c=C, loss_agg="token_mean")
    expected = -np.array([0.0, s_valid[1]])[:, None] * adv * mask / mask.sum()
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-9)


def test_gspo_value_is_clipped_sequence_ratio_surrogate():
    logp, logp_old, adv, _ = gspo_rows(seed=4)
    adv = np.repeat(adv[:, :1], adv.shape[1], axis=1)  # one advantage per sequence
    mask = np.ones_like(logp)
    el, eh = 3e-4, 4e-4
    loss, metrics = jitted_policy_loss("gspo", logp=logp, logp_old=logp_old, advantages=adv, mask=mask,
                                clip_low=el, clip_high=eh, dual_clip_c=None,
                                loss_agg="seq_mean_token_mean")
    s = np.exp(np.mean(logp - logp_old, axis=1))
    a = adv[:, 0]
    expected = -np.mean(np.minimum(s * a, np.clip(s, 1 - el, 1 + eh) * a))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["ratio_mean"]), s.mean(), rtol=1e-5)


@pytest.mark.parametrize("dual_clip_c", [C, None])
def test_aepo_and_gppo_forward_equal_ppo(dual_clip_c):
    logp, logp_old, adv, _ = region_grid(seed=5)
    mask = (np.random.default_rng(5).uniform(size=logp.shape) > 0.2).astype(np.float32)
    kw = {"logp": logp, "logp_old": logp_old, "advantages": adv, "mask": mask, "clip_low": EL,
              "clip_high": EH, "dual_clip_c": dual_clip_c}
    ppo = float(jitted_policy_loss("ppo", **kw)[0])
    for algorithm in ("aepo", "gppo"):
        np.testing.assert_allclose(float(jitted_policy_loss(algorithm, **kw)[0]), ppo, rtol=1e-6,
                                   err_msg=f"{algorithm} forward value differs from PPO")


@pytest.mark.parametrize("algorithm", TOKEN_SURROGATES + ("gspo",))
def test_masked_tokens_get_exactly_zero_gradient_even_with_garbage(algorithm):
    logp, logp_old, adv, _ = region_grid(seed=6)
    mask = np.ones_like(logp)
    mask[:, ::3] = 0.0
    logp[:, ::3] = np.nan  # garbage where the mask is 0 must not leak
    logp_old[:, ::3] = -np.inf
    logp_ref = logp_old - 0.1
    logp_ref[:, ::3] = np.inf
    kw = {"dual_clip_c": None} if algorithm == "cispo" else {}
    grad = loss_grad(algorithm, logp, logp_old, adv, mask, logp_ref=logp_ref, kl_coef=0.1, **kw)
    assert np.all(grad[:, ::3] == 0.0), f"{algorithm}: masked tokens got gradient"
    assert np.all(np.isfinite(grad)), f"{algorithm}: non-finite gradient"
    assert np.any(grad[:, 1::3] != 0.0)


def frozen_reference_loss(algorithm, x, x0, logp_old, adv, mask, el, eh, c):
    """Spec §3.1 surrogates in float64 numpy, with every `sg(.)` held at the point x0."""
    r, r0 = np.exp(x - logp_old), np.exp(x0 - logp_old)
    if algorithm == "ppo":
        s = np.minimum(r * adv, np.clip(r, 1 - el, 1 + eh) * adv)
    elif algorithm == "gppo":
        s = np.minimum(r * adv, np.clip(r, (1 - el) * r / r0, (1 + eh) * r / r0) * adv)
    elif algorithm == "aepo":
        s = np.minimum(r * adv, np.clip(r, 1 - el, (1 + eh) * r / r0) * adv)
    elif algorithm == "cispo":
        s = np.clip(r0, 1 - el, 1 + eh) * adv * x
    else:  # gspo token form
        seq0 = np.exp(np.sum((x0 - logp_old) * mask, 1, keepdims=True) / mask.sum(1, keepdims=True))
        t = seq0 * np.exp(x - x0)
        s = np.minimum(t * adv, np.clip(t, 1 - el, 1 + eh) * adv)
    if c is not None and algorithm != "cispo":
        s = np.where(adv < 0, np.maximum(s, c * adv), s)
    return -np.sum(s * mask) / mask.sum()


@pytest.mark.parametrize("algorithm", TOKEN_SURROGATES + ("gspo",))
def test_float64_finite_differences_match_jax_grad(algorithm):
    if algorithm == "gspo":
        logp, logp_old, adv, _ = gspo_rows(seed=7)
        el, eh, c = 3e-4, 4e-4, C
    else:
        logp, logp_old, adv, _ = region_grid(seed=7, rows=2)
        el, eh, c = EL, EH, (None if algorithm == "cispo" else C)
    mask = np.ones_like(logp)
    mask[0, -1] = 0.0
    with jax.enable_x64(True):
        def loss_fn(lp):
            return policy_loss(loss_config(algorithm, clip_low=el, clip_high=eh, dual_clip_c=c),
                               logp=lp, logp_old=jnp.asarray(logp_old),
                               advantages=jnp.asarray(adv), mask=jnp.asarray(mask))[0]
        loss_fn = jax.jit(loss_fn)
        x64 = jnp.asarray(logp, jnp.float64)
        assert loss_fn(x64).dtype == jnp.float64
        grad = np.asarray(jax.grad(loss_fn)(x64))
        own_fd = np.zeros_like(logp)
        h = 1e-6
        for idx in np.ndindex(logp.shape):
            step = np.zeros_like(logp)
            step[idx] = h
            ref_fd = (frozen_reference_loss(algorithm, logp + step, logp, logp_old, adv, mask,
                                            el, eh, c)
                      - frozen_reference_loss(algorithm, logp - step, logp, logp_old, adv, mask,
                                              el, eh, c)) / (2 * h)
            np.testing.assert_allclose(grad[idx], ref_fd, rtol=1e-6, atol=1e-9,
                                       err_msg=f"{algorithm}: token {idx} vs frozen-sg reference")
            if algorithm == "ppo":  # no stop-gradient: differentiate the code itself
                own_fd[idx] = (float(loss_fn(jnp.asarray(logp + step)))
                               - float(loss_fn(jnp.asarray(logp - step)))) / (2 * h)
        if algorithm == "ppo":
            np.testing.assert_allclose(grad, own_fd, rtol=1e-6, atol=1e-9)


# Log-ratios (logp - logp_old) far outside every clip region, next to finite ones, in float32: a ratio
# of e^99 overflows to inf, and 0 * inf = NaN in the unselected branch of min / max would poison the step.
EXTREME_LOGP_OLD = np.array([-100.0, -1.0, -16.0, -1.2])
EXTREME_LOGP = np.array([-1.0, -100.0, -1.0, -1.0])  # log r = 99, -99, 15 (finite r = 3.3e6), 0.2 (inside)


@pytest.mark.parametrize("algorithm", TOKEN_SURROGATES)
@pytest.mark.parametrize("dual_clip_c", [C, None])
def test_overflowing_ratio_gets_the_clipped_region_gradient(algorithm, dual_clip_c):
    if algorithm == "cispo" and dual_clip_c is not None:
        pytest.skip("CISPO takes no dual clip")
    logp_old = np.tile(EXTREME_LOGP_OLD, (2, 1))
    logp = np.tile(EXTREME_LOGP, (2, 1))
    adv = np.array([[1.5] * 4, [-0.7] * 4])
    mask = np.ones_like(logp)
    grad = loss_grad(algorithm, logp, logp_old, adv, mask, clip_low=EL, clip_high=EH, dual_clip_c=dual_clip_c)
    assert np.all(np.isfinite(grad)), f"{algorithm}: non-finite gradient {grad}"
    r = np.exp(logp - logp_old)  # float64: e^99 is finite here
    f = expected_weight(algorithm, r, adv, EL, EH, dual_clip_c)
    # The one documented change of the ratio bound (surrogates module doc): an unclipped r A branch
    # with r > e^20 (A < 0, no dual clip) gets weight 0, not r. The token at log r = 15 keeps F = r.
    if algorithm != "cispo":
        f[(r > np.exp(20.0)) & (adv < 0)] = 0.0
    np.testing.assert_allclose(grad, -f * adv / mask.sum(), rtol=2e-5, atol=1e-7,
                               err_msg=f"{algorithm} dual_clip_c={dual_clip_c}")


@pytest.mark.parametrize("dual_clip_c", [C, None])
def test_gspo_overflowing_sequence_ratio_gives_finite_gradients(dual_clip_c):
    logp_old = np.full((2, 3), -100.0)
    logp = np.full((2, 3), -1.0)  # row mean log-ratio 99: s_i = e^99, inf in float32
    adv = np.array([[1.0] * 3, [-1.0] * 3])
    mask = np.ones_like(logp)
    grad = loss_grad("gspo", logp, logp_old, adv, mask, dual_clip_c=dual_clip_c, loss_agg="token_mean")
    assert np.all(np.isfinite(grad)), grad
    np.testing.assert_array_equal(grad[0], 0.0)  # s_i > 1 + eh, A > 0: clipped
    # A < 0: dual clip -> 0; without it the weight is the bounded s_i = e^20 (surrogates module doc).
    weight = 0.0 if dual_clip_c is not None else np.exp(20.0)
    np.testing.assert_allclose(grad[1], weight * -adv[1] / mask.sum(), rtol=2e-5)


def test_clip_bounds_must_stay_below_the_ratio_bound():
    with pytest.raises(ValueError, match="dual_clip_c = 1000000000.0 must be below exp\\(20\\)"):
        loss_config("ppo", dual_clip_c=1e9)
    with pytest.raises(ValueError, match="1 \\+ clip_high"):
        loss_config("aepo", clip_high=1e9)


def test_policy_loss_jits_and_reports_metrics():
    logp, logp_old, adv, _labels = region_grid(seed=8)
    mask = np.ones_like(logp)

    @jax.jit
    def run(lp):
        return policy_loss(loss_config("aepo", clip_low=EL, clip_high=EH, dual_clip_c=C),
                           logp=lp, logp_old=logp_old, advantages=adv, mask=mask)

    loss, metrics = run(jnp.asarray(logp, jnp.bfloat16))
    assert loss.dtype == jnp.float32
    r = np.exp(logp - logp_old)
    n = mask.size
    expect = {
        "clip_frac_upper": np.sum((r > 1 + EH) & (adv > 0)) / n,
        "clip_frac_lower": np.sum((r < 1 - EL) & (adv < 0)) / n,
        "clip_frac_dual": np.sum((r > C) & (adv < 0)) / n,
        "preserved_grad_frac": np.sum((r > 1 + EH) & (adv > 0)) / n,
    }
    for key, value in expect.items():
        assert float(metrics[key]) == pytest.approx(value), key
    # bf16 logp moves r a little; compare the KL/ratio metrics loosely.
    log_r = np.asarray(jnp.asarray(logp, jnp.bfloat16), np.float64) - logp_old
    assert float(metrics["approx_kl_old"]) == pytest.approx(np.mean(-log_r), rel=1e-3)
    assert float(metrics["ratio_mean"]) == pytest.approx(np.mean(np.exp(log_r)), rel=1e-3)
    assert float(metrics["approx_kl_old_k3"]) == pytest.approx(
        np.mean(np.minimum(np.exp(log_r) - log_r - 1, 10.0)), rel=1e-3)


def test_bad_inputs_raise_clear_errors():
    x = np.zeros((2, 3))
    ppo = loss_config("ppo")
    with pytest.raises(ValueError, match="unknown policy-loss algorithm 'ppo2'"):
        loss_config("ppo2")
    with pytest.raises(ValueError, match="unknown loss_agg"):
        loss_config("ppo", loss_agg="mean")
    with pytest.raises(ValueError, match="same \\[B, T\\] shape"):
        policy_loss(ppo, logp=x, logp_old=np.zeros((2, 4)), advantages=x, mask=x)
    with pytest.raises(ValueError, match="CISPO takes no dual clip"):
        loss_config("cispo", dual_clip_c=3.0)
    with pytest.raises(ValueError, match="needs logp_ref"):
        policy_loss(loss_config("ppo", kl_coef=0.1), logp=x, logp_old=x, advantages=x, mask=x)
    with pytest.raises(ValueError, match="clip_low and clip_high must be >= 0"):
        loss_config("ppo", clip_low=-0.1)
    with pytest.raises(ValueError, match="unknown LossConfig fields \\['clip'\\]"):
        loss_config("ppo", clip=0.2)
    with pytest.raises(TypeError, match="takes a LossConfig"):
        policy_loss("ppo", logp=x, logp_old=x, advantages=x, mask=x)
