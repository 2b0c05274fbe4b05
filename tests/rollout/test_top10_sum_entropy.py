"""`top10_sum` against a plain-Python port of the released measure (docs/fidelity.md).

The reference follows the released rollout step by step: per generated token,
vLLM's `logprobs=10` gives a dict {token id: log-prob} of the top 10 plus the
sampled token; the released code extends one flat list with the dict's
values for the first min(20, n) tokens, then `_calc_entropy` is
`-sum(exp(l) * l)` over that list, divided by `ln V`.
"""

import math

import numpy as np
import pytest

from aepo_jax.agent.entropy import reported_logprobs, top10_sum_entropy

VOCAB = 300


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def released_measure(logp_rows: np.ndarray, sampled: list[int], vocab: int) -> float:
    """The released code's arithmetic, as plain Python over vLLM-style dicts."""
    flat: list[float] = []
    for j in range(min(20, len(sampled))):
        order = sorted(range(vocab), key=lambda v: -logp_rows[j, v])[:10]
        reported = {v: float(logp_rows[j, v]) for v in order}
        reported.setdefault(sampled[j], float(logp_rows[j, sampled[j]]))  # vLLM adds the chosen token
        flat.extend(reported.values())
    return -sum(math.exp(x) * x for x in flat) / math.log(vocab)


@pytest.mark.parametrize("length", [7, 20, 33])
def test_top10_sum_equals_the_released_formula(length):
    rng = np.random.default_rng(length)
    logp = log_softmax64(rng.normal(0.0, 2.5, size=(length, VOCAB)))
    # half the tokens sampled from the top 10, half from the tail (then vLLM reports an 11th entry)
    order = np.argsort(-logp, axis=-1)
    sampled = [int(order[t, t % 10] if t % 2 else order[t, 50 + t]) for t in range(length)]
    top_ids = order[:, :10]
    top = np.take_along_axis(logp, top_ids, axis=-1)
    reported = reported_logprobs(top, top_ids, np.asarray(sampled), logp[np.arange(length), sampled])
    assert reported.shape == (length, 11)
    assert np.isnan(reported[1::2, 10]).all() and not np.isnan(reported[0::2, 10]).any()
    got = top10_sum_entropy(reported, VOCAB, 20)
    assert got == pytest.approx(released_measure(logp, sampled, VOCAB), rel=1e-12)


def test_top10_sum_counts_the_sampled_tail_token_only_once_and_only_when_outside():
    logp = log_softmax64(np.random.default_rng(5).normal(size=(3, VOCAB)))
    order = np.argsort(-logp, axis=-1)
    top_ids, top = order[:, :10], np.take_along_axis(logp, order[:, :10], axis=-1)
    inside = reported_logprobs(top, top_ids, order[:, 0], logp[np.arange(3), order[:, 0]])
    assert top10_sum_entropy(inside, VOCAB) == pytest.approx(top10_sum_entropy(top, VOCAB), rel=1e-12)
    tail = order[:, 100]
    outside = reported_logprobs(top, top_ids, tail, logp[np.arange(3), tail])
    extra = -sum(math.exp(x) * x for x in logp[np.arange(3), tail]) / math.log(VOCAB)
    assert top10_sum_entropy(outside, VOCAB) == pytest.approx(top10_sum_entropy(top, VOCAB) + extra, rel=1e-12)


def test_top10_sum_rejects_bad_input():
    with pytest.raises(ValueError, match="non-empty"):
        top10_sum_entropy(np.zeros((0, 10)), VOCAB)
    with pytest.raises(ValueError, match="vocab_size"):
        top10_sum_entropy(np.zeros((2, 10)), 1)
    with pytest.raises(ValueError, match="num_tokens"):
        top10_sum_entropy(np.zeros((2, 10)), VOCAB, 0)
