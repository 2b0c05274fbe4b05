"""KL estimators (spec §3.3) and chunked float32 log-probs / entropies (spec §1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax.objectives import (
    entropy_bonus,
    kl_penalty,
    loss_config,
    policy_loss,
    token_logprobs_and_entropy,
)


def test_kl_estimators_match_float64_formulas():
    rng = np.random.default_rng(0)
    logp = rng.uniform(-4, -0.1, size=(3, 5))
    logp_ref = logp + rng.normal(scale=0.7, size=logp.shape)
    d = logp - logp_ref
    np.testing.assert_allclose(np.asarray(kl_penalty(logp, logp_ref, "k1")), d, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(kl_penalty(logp, logp_ref, "k2")), 0.5 * d**2, rtol=1e-5)
    k3 = np.exp(logp_ref - logp) - (logp_ref - logp) - 1
    np.testing.assert_allclose(np.asarray(kl_penalty(logp, logp_ref, "k3")), k3, rtol=1e-4,
                               atol=1e-7)


def test_k3_is_clamped_and_has_finite_gradients_at_extremes():
    logp = jnp.array([[-50.0, -1.0, 0.0, -200.0]])
    logp_ref = jnp.array([[0.0, -1.0, -60.0, 0.0]])
    k3 = np.asarray(kl_penalty(logp, logp_ref, "k3"))
    np.testing.assert_allclose(k3, [[10.0, 0.0, 10.0, 10.0]])
    grad = jax.grad(lambda x: jnp.sum(kl_penalty(x, logp_ref, "k3")))(logp)
    assert np.all(np.isfinite(np.asarray(grad)))
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        kl_penalty(logp, logp_ref, "k4")


def test_kl_and_entropy_terms_enter_the_loss_with_their_coefficients():
    rng = np.random.default_rng(1)
    logp = rng.uniform(-3, -0.5, size=(2, 4))
    logp_ref = logp + rng.normal(scale=0.3, size=logp.shape)
    entropy = rng.uniform(0.5, 2.0, size=logp.shape)
    mask = np.ones_like(logp)
    zeros = np.zeros_like(logp)
    loss, metrics = policy_loss(loss_config("ppo", kl_coef=0.1, entropy_coef=0.01), logp=logp, logp_old=logp,
                                advantages=zeros, mask=mask, logp_ref=logp_ref, entropy=entropy)
    k3 = np.exp(logp_ref - logp) - (logp_ref - logp) - 1
    assert float(loss) == pytest.approx(np.mean(0.1 * k3 - 0.01 * entropy), rel=1e-5)
    assert float(metrics["kl_ref"]) == pytest.approx(np.mean(k3), rel=1e-5)
    assert float(metrics["entropy_mean"]) == pytest.approx(np.mean(entropy), rel=1e-6)
    np.testing.assert_allclose(np.asarray(entropy_bonus(entropy, 0.5)), -0.5 * entropy,
                               rtol=1e-6)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_term_gradient_matches_closed_form(estimator):
    """token_mean: d loss / d logp = kl_coef * dk/dlogp * mask / N; the zero advantages give the surrogate none."""
    rng = np.random.default_rng(4)
    logp = rng.uniform(-3, -0.5, size=(2, 5))
    logp_ref = logp + rng.normal(scale=0.5, size=logp.shape)  # |d| < 2: k3 stays inside its clamp
    mask = np.ones_like(logp)
    mask[1, 3:] = 0.0
    kl_coef = 0.3

    def loss_fn(lp):
        return policy_loss(loss_config("ppo", kl_coef=kl_coef, kl_estimator=estimator), logp=lp,
                           logp_old=logp, advantages=np.zeros_like(logp), mask=mask, logp_ref=logp_ref)[0]

    grad = np.asarray(jax.jit(jax.grad(loss_fn))(jnp.asarray(logp, jnp.float32)))
    d = logp - logp_ref  # float64
    dk = {"k1": np.ones_like(d), "k2": d, "k3": 1.0 - np.exp(-d)}[estimator]
    np.testing.assert_allclose(grad, kl_coef * dk * mask / mask.sum(), rtol=1e-5, atol=1e-8)


def test_entropy_bonus_gradient_through_logits_matches_closed_form():
    """-entropy_coef * H under token_mean, differentiated through the logits at temperature T:
    dH/dz = -p (log p + H) with z = logits / T, so d loss / d logits = coef * p (log p + H) * mask / (N T)."""
    rng = np.random.default_rng(5)
    logits = rng.normal(scale=2.0, size=(2, 4, 7))
    targets = rng.integers(0, 7, size=(2, 4))
    mask = np.ones((2, 4))
    mask[0, 0] = 0.0
    coef, temperature = 0.05, 0.7

    def loss_fn(x):
        logp, entropy = token_logprobs_and_entropy(x, jnp.asarray(targets), temperature=temperature)
        return policy_loss(loss_config("ppo", entropy_coef=coef), logp=logp, logp_old=jax.lax.stop_gradient(logp),
                           advantages=jnp.zeros_like(logp), mask=mask, entropy=entropy)[0]

    grad = np.asarray(jax.jit(jax.grad(loss_fn))(jnp.asarray(logits, jnp.float32)))
    z = logits / temperature  # float64
    log_p = z - z.max(-1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(-1, keepdims=True))
    p = np.exp(log_p)
    entropy = -(p * log_p).sum(-1, keepdims=True)
    expected = coef * p * (log_p + entropy) * mask[..., None] / (mask.sum() * temperature)
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-7)
    assert np.abs(expected).max() > 1e-3  # the bonus has a gradient to check


def numpy_logprobs_entropy(logits, targets, temperature):
    z = logits.astype(np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    logp = np.take_along_axis(logsm, targets[..., None], -1)[..., 0]
    return logp, -(np.exp(logsm) * logsm).sum(-1)


jitted_logprobs = jax.jit(token_logprobs_and_entropy, static_argnames=("temperature", "chunk_size"))


@pytest.mark.parametrize("chunk_size", [3, 7])  # 3: two chunks + ragged tail; 7 >= T: one piece
def test_chunked_logprobs_match_unchunked_and_float64(chunk_size):
    rng = np.random.default_rng(2)
    logits = rng.normal(scale=3.0, size=(2, 7, 50)).astype(np.float32)  # T = 7
    targets = rng.integers(0, 50, size=(2, 7))
    fn = jitted_logprobs
    logp, ent = fn(jnp.asarray(logits), jnp.asarray(targets), temperature=0.7,
                   chunk_size=chunk_size)
    assert logp.dtype == jnp.float32 and ent.dtype == jnp.float32
    ref_logp, ref_ent = numpy_logprobs_entropy(logits, targets, 0.7)
    np.testing.assert_allclose(np.asarray(logp), ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), ref_ent, rtol=1e-5, atol=1e-5)
    base_logp, base_ent = fn(jnp.asarray(logits), jnp.asarray(targets), temperature=0.7,
                             chunk_size=None)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(base_logp), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ent), np.asarray(base_ent), rtol=1e-6, atol=1e-6)


def test_chunked_gradients_match_unchunked_and_bf16_input_gives_float32():
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.normal(size=(2, 6, 16)), jnp.bfloat16)
    targets = jnp.asarray(rng.integers(0, 16, size=(2, 6)))

    def objective(x, chunk_size):
        logp, ent = token_logprobs_and_entropy(x, targets, chunk_size=chunk_size)
        assert logp.dtype == jnp.float32 and ent.dtype == jnp.float32
        return jnp.sum(logp) + 0.3 * jnp.sum(ent)

    grad_fn = jax.jit(jax.grad(objective), static_argnums=1)
    g_full = grad_fn(logits.astype(jnp.float32), None)
    g_chunk = grad_fn(logits.astype(jnp.float32), 4)
    np.testing.assert_allclose(np.asarray(g_chunk), np.asarray(g_full), rtol=1e-6, atol=1e-7)
    ref_logp, _ = numpy_logprobs_entropy(np.asarray(logits.astype(jnp.float32)),
                                         np.asarray(targets), 1.0)
    logp, _ = jitted_logprobs(logits, targets, chunk_size=4)
    np.testing.assert_allclose(np.asarray(logp), ref_logp, rtol=1e-5, atol=1e-5)


def test_logprob_input_errors():
    with pytest.raises(ValueError, match="logits must be \\[B, T, V\\]"):
        token_logprobs_and_entropy(jnp.zeros((2, 3)), jnp.zeros((2,), int))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs_and_entropy(jnp.zeros((1, 2, 3)), jnp.zeros((1, 2), int), temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs_and_entropy(jnp.zeros((1, 2, 3)), jnp.zeros((1, 2), int), chunk_size=0)
