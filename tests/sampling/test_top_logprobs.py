"""The sampler's optional top-k log-probs (the released `top10_sum` entropy reads them)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aepo_jax.sampling import Sampler, SamplingParams
from aepo_jax.sampling.token_distribution import top_logprobs
from tests.sampling.conftest import random_prompts

TEMPERATURE = 0.7
K = 5


def reference_top(logits: np.ndarray, temperature: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 log-softmax at temperature T, sorted descending: the k largest values and their ids."""
    scaled = np.asarray(logits, np.float64) / temperature
    logsm = scaled - scaled.max(-1, keepdims=True)
    logsm = logsm - np.log(np.exp(logsm).sum(-1, keepdims=True))
    order = np.argsort(-logsm, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(logsm, order, axis=-1), order


def test_top_logprobs_equal_float64_log_softmax_then_sort():
    logits = np.random.default_rng(0).normal(0.0, 3.0, size=(4, 300)).astype(np.float32)
    values, ids = top_logprobs(jnp.asarray(logits), TEMPERATURE, 10)
    want_values, want_ids = reference_top(logits, TEMPERATURE, 10)
    np.testing.assert_allclose(np.asarray(values), want_values, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(ids), want_ids)


PROMPTS = random_prompts(21, [5, 8])
BUDGETS = [12, 7]


@pytest.fixture(scope="module")
def sampler(tiny_model):
    _, graphdef, state = tiny_model
    return Sampler(graphdef, state, params=SamplingParams(temperature=TEMPERATURE), max_cache_len=256)


@pytest.fixture(scope="module")
def outputs(sampler):
    """The same rows and key generated twice: without and with top-k log-probs (one shape bucket)."""
    key = jax.random.key(3)
    _, plain = sampler.generate(sampler.prefill(PROMPTS), BUDGETS, rng=key)
    _, with_top = sampler.generate(sampler.prefill(PROMPTS), BUDGETS, rng=key, top_logprobs=K)
    return plain, with_top


def test_sampler_top_logprobs_match_the_logits_each_token_was_drawn_from(outputs, full_logits):
    _, out = outputs
    assert out.top_logprobs.shape == out.top_ids.shape == (2, 12, K)
    for row, prompt in enumerate(PROMPTS):
        n = int(out.num_tokens[row])
        generated = out.row_tokens(row)
        # logits predicting generated token t sit at position len(prompt) + t - 1 of the plain forward
        logits = full_logits(prompt + generated)[len(prompt) - 1 : len(prompt) - 1 + n]  # [n, V]
        want_values, want_ids = reference_top(logits, TEMPERATURE, K)
        np.testing.assert_allclose(out.top_logprobs[row, :n], want_values, atol=2e-4)
        # ids agree wherever the reference order is not a near-tie
        gaps = np.abs(np.diff(want_values, axis=-1))
        clear = np.concatenate([gaps[:, :1], np.minimum(gaps[:, 1:], gaps[:, :-1]), gaps[:, -1:]], axis=-1) > 1e-3
        np.testing.assert_array_equal(out.top_ids[row, :n][clear], want_ids[clear])
        # the sampled token's own log-prob is consistent with the top list
        in_top = out.top_ids[row, :n] == np.asarray(generated)[:, None]  # [n, K]
        np.testing.assert_allclose(out.top_logprobs[row, :n][in_top], np.repeat(out.logp[row, :n], in_top.sum(-1)),
                                   atol=1e-5)
        assert np.all(out.top_logprobs[row, n:] == 0) and np.all(out.top_ids[row, n:] == 0)


def test_asking_for_top_logprobs_does_not_change_the_samples(outputs):
    plain, with_top = outputs
    assert plain.top_logprobs is None and plain.top_ids is None  # off by default
    np.testing.assert_array_equal(plain.tokens, with_top.tokens)
    np.testing.assert_array_equal(plain.logp, with_top.logp)
    np.testing.assert_array_equal(plain.entropy, with_top.entropy)


def test_top_logprobs_out_of_range_is_a_clear_error(sampler):
    with pytest.raises(ValueError, match="top_logprobs must be in"):
        sampler.generate(sampler.prefill(PROMPTS), 4, top_logprobs=-1)
