"""Aggregation modes against hand-computed values, and exact micro-batch accumulation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax.objectives import (
    LOSS_AGG_MODES,
    aggregate,
    loss_config,
    loss_denominator,
    policy_loss,
)
from aepo_jax.objectives.surrogates import get_surrogate

VALUES = np.array([[1.0, 2.0, 3.0, 4.0],
                   [5.0, 6.0, 7.0, 8.0],
                   [9.0, 9.0, 9.0, 9.0]])
MASK = np.array([[1.0, 1.0, 0.0, 0.0],
                 [1.0, 1.0, 1.0, 0.0],
                 [0.0, 0.0, 0.0, 0.0]])  # an all-padding row counts for nothing


@pytest.mark.parametrize(
    "mode, max_len, loss, numerator, denominator",
    [
        ("token_mean", None, 21 / 5, 21.0, 5.0),
        ("seq_mean_token_mean", None, (1.5 + 6.0) / 2, 7.5, 2.0),
        ("seq_mean_token_sum_norm", None, (3 / 4 + 18 / 4) / 2, 21 / 4, 2.0),
        ("seq_mean_token_sum_norm", 10, (3 / 10 + 18 / 10) / 2, 2.1, 2.0),
    ],
)
def test_aggregation_matches_hand_computed(mode, max_len, loss, numerator, denominator):
    out = aggregate(jnp.asarray(VALUES), jnp.asarray(MASK), mode, max_len=max_len)
    assert float(out.loss) == pytest.approx(loss)
    assert float(out.numerator) == pytest.approx(numerator)
    assert float(out.denominator) == pytest.approx(denominator)
    assert float(loss_denominator(MASK, mode)) == denominator


def random_batch(seed, batch=6, length=7):
    rng = np.random.default_rng(seed)
    logp_old = rng.uniform(-3, -0.5, size=(batch, length))
    logp = logp_old + rng.normal(scale=0.4, size=(batch, length))
    adv = rng.normal(size=(batch, length))
    mask = (rng.uniform(size=(batch, length)) > 0.3).astype(np.float32)
    mask[:, 0] = 1.0
    lengths = rng.integers(2, length + 1, size=batch)
    mask *= np.arange(length)[None, :] < lengths[:, None]  # ragged rows
    return logp, logp_old, adv, mask


@pytest.mark.parametrize("algorithm", ["aepo", "gspo", "cispo"])
def test_micro_batch_accumulation_equals_full_batch(algorithm):
    logp, logp_old, adv, mask = random_batch(seed=len(algorithm))
    extra = {"dual_clip_c": None} if algorithm == "cispo" else {}

    @jax.jit
    def losses_and_grads(lp, lo, a, m, global_dens):
        """For every mode: (loss, grad, parts) with the given global denominator."""
        out = {}
        for mode in LOSS_AGG_MODES:
            def loss_fn(x, mode=mode):
                loss, _, parts = policy_loss(loss_config(algorithm, loss_agg=mode, **extra), logp=x,
                                             logp_old=lo, advantages=a, mask=m, max_len=7,
                                             global_denominator=global_dens[mode],
                                             return_parts=True)
                return loss, parts
            (loss, parts), grad = jax.value_and_grad(loss_fn, has_aux=True)(lp)
            out[mode] = (loss, grad, parts)
        return out

    global_dens = {mode: loss_denominator(mask, mode) for mode in LOSS_AGG_MODES}
    full = losses_and_grads(logp, logp_old, adv, mask, global_dens)
    halves = [losses_and_grads(logp[rows], logp_old[rows], adv[rows], mask[rows], global_dens)
              for rows in (slice(0, 3), slice(3, 6))]
    for mode in LOSS_AGG_MODES:
        full_loss, full_grad, full_parts = full[mode]
        assert float(full_parts.denominator) == float(global_dens[mode]), mode
        total_loss = sum(float(h[mode][0]) for h in halves)
        numerators = sum(float(h[mode][2].numerator) for h in halves)
        np.testing.assert_allclose(total_loss, float(full_loss), rtol=1e-5, err_msg=mode)
        np.testing.assert_allclose(numerators / float(global_dens[mode]), float(full_loss),
                                   rtol=1e-5, err_msg=mode)
        np.testing.assert_allclose(np.concatenate([np.asarray(h[mode][1]) for h in halves]),
                                   np.asarray(full_grad), rtol=1e-5, atol=1e-8, err_msg=mode)


def test_seq_mean_token_mean_weights_each_token_by_its_row_length():
    logp, logp_old, adv, mask = random_batch(seed=11)
    config = loss_config("ppo", loss_agg="seq_mean_token_mean")
    grad = jax.jit(jax.grad(lambda x: policy_loss(config, logp=x, logp_old=logp_old, advantages=adv,
                                                  mask=mask)[0]))(logp)
    # seq_mean_token_mean: token weight is 1 / (tokens in its row * number of rows)
    r = np.exp(logp - logp_old)
    inside = (r > 0.8) & (r < 1.2)
    per_row = mask.sum(1, keepdims=True) * (mask.sum(1) > 0).sum()
    expected = -r * adv * mask / per_row
    np.testing.assert_allclose(np.asarray(grad)[inside], expected[inside], rtol=1e-5)


def test_dr_grpo_train_step_loss_does_not_depend_on_the_steps_padded_length():
    """The trainer's Dr. GRPO divides by the config's constant (rollout.max_response_len), not by the
    padded T of the step, so the same trajectories padded to 8 or 256 columns (two steps whose longest
    sequences fall in different length buckets) give the same loss and gradient, equal to float64 numpy."""
    from aepo_jax.training.batch import pad_sequences
    from aepo_jax.training.build import preset_from, step_config_from
    from aepo_jax.training.train_step import rl_loss_fn
    from configs.base import get_base_config, shrink_to_tiny

    cfg = shrink_to_tiny(get_base_config("dr_grpo"))
    lmax = int(cfg.rollout.max_response_len)
    step_cfg = step_config_from(cfg, preset_from(cfg))
    assert step_cfg.loss.loss_agg == "seq_mean_token_sum_norm" and step_cfg.loss_max_len == lmax

    rng = np.random.default_rng(12)
    sequences = []
    for prompt, response in ((2, 5), (3, 4), (1, 7), (4, 2)):
        n = prompt + response
        sequences.append({"tokens": np.arange(n), "mask": np.r_[np.zeros(prompt), np.ones(response)],
                          "logp_old": rng.uniform(-3, -0.5, n), "advantages": np.full(n, rng.normal())})

    def shifted_logprobs(graphdef, theta, mb, *args):  # logp = logp_old + theta: every ratio is e^theta
        return mb["logp_old"] + theta, jnp.zeros_like(mb["logp_old"])

    loss_fn = rl_loss_fn(None, step_cfg, shifted_logprobs)
    theta = 0.05  # r = e^0.05, inside the clip range: F = r
    got = {}
    for length in (8, 256):
        batch = {k: jnp.asarray(v) for k, v in pad_sequences(sequences, max_len=length, length_multiple=length).items()}
        assert batch["mask"].shape[1] == length
        denominator = loss_denominator(batch["mask"], step_cfg.loss.loss_agg)
        loss, grad = jax.value_and_grad(lambda t, b=batch, d=denominator: loss_fn(t, b, d)[0])(theta)
        got[length] = (float(loss), float(grad))
    token_sums = [np.sum(s["advantages"] * s["mask"]) for s in sequences]  # float64
    want = -np.exp(theta) * np.sum(token_sums) / (lmax * len(sequences))  # loss; d loss / d theta is the same
    for length, (loss, grad) in got.items():
        assert loss == pytest.approx(want, rel=1e-5), length
        assert grad == pytest.approx(want, rel=1e-5), length


def test_unknown_mode_and_bad_max_len_raise():
    with pytest.raises(ValueError, match="unknown loss_agg 'sum'"):
        aggregate(jnp.ones((2, 2)), jnp.ones((2, 2)), "sum")
    with pytest.raises(ValueError, match="max_len must be positive"):
        aggregate(jnp.ones((2, 2)), jnp.ones((2, 2)), "seq_mean_token_sum_norm", max_len=0)


@pytest.mark.parametrize("surrogate", ["ppo", "gppo", "aepo", "cispo", "gspo"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_garbage_at_masked_positions_leaves_loss_and_metrics_as_with_zeros(surrogate, mode):
    # Spec §3: sums run over mask == 1 only. NaN / inf advantages or entropy where mask == 0 (NaN * 0
    # is NaN) must give the loss, gradient and metrics of zeros there.
    garbage = np.where(MASK > 0, 0.0, np.array([np.nan, np.inf, -np.inf, np.nan])).astype(np.float32)
    logp = np.array([[-1.0, -0.5, -2.0, -1.0], [-0.3, -1.2, -0.8, -1.0], [-1.0] * 4], np.float32)
    adv = np.array([[1.0, -0.5, 0.0, 0.0], [0.3, 2.0, -1.0, 0.0], [0.0] * 4], np.float32)
    entropy = np.array([[0.4, 1.1, 0.0, 0.0], [0.9, 0.2, 0.5, 0.0], [0.0] * 4], np.float32)
    extra = {"dual_clip_c": None} if surrogate == "cispo" else {}
    config = loss_config(surrogate, loss_agg=mode, entropy_coef=0.01, **extra)

    def run(advantages, entropy):
        def loss(x):
            return policy_loss(config, logp=x, logp_old=logp - 0.1, advantages=advantages, mask=MASK,
                               entropy=entropy)
        (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(logp))
        return float(value), {k: float(v) for k, v in metrics.items()}, np.asarray(grad)

    dirty_agg = aggregate(jnp.asarray(VALUES + garbage), jnp.asarray(MASK), mode)
    assert float(dirty_agg.loss) == float(aggregate(jnp.asarray(VALUES), jnp.asarray(MASK), mode).loss)
    surrogate_fn, clips = get_surrogate(surrogate), (config.clip_low, config.clip_high, config.dual_clip_c)
    clean_s = surrogate_fn(logp, logp - 0.1, adv, MASK, *clips).surrogate
    np.testing.assert_array_equal(np.asarray(surrogate_fn(logp, logp - 0.1, adv + garbage, MASK, *clips).surrogate),
                                  np.asarray(clean_s))
    clean, dirty = run(adv, entropy), run(adv + garbage, entropy + garbage)
    assert np.isfinite(clean[0]) and clean[0] == dirty[0]
    assert dirty[1] == clean[1]
    np.testing.assert_array_equal(dirty[2], clean[2])
