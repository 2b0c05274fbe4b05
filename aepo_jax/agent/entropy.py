"""Segment entropy, the signal every branching decision reads (spec section 1).

`exact_mean` (default): the mean of the sampler's exact full-vocabulary token
entropies `H_t` over the first K tokens of the segment.
`top10_sum` (released-code reproduction): the sum over the first K tokens of
`-sum p log p` restricted to the top-10 log-probs (plus the sampled token when
it is not among them, as vLLM reports it), divided by `ln V`. It needs the
per-token top-10 log-probs: the agent loop asks the sampler for them
(`generate(..., top_logprobs=10)`) only under this measure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

ENTROPY_MEASURES = ("exact_mean", "top10_sum")


def segment_entropy(token_entropy: Sequence[float], num_tokens: int = 20) -> float:
    """Mean of the first `num_tokens` token entropies (fewer if the segment is shorter).

    Raises:
      ValueError: on an empty segment (there is no entropy to measure).
    """
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    head = np.asarray(token_entropy[:num_tokens], np.float64)
    if head.size == 0:
        raise ValueError("segment_entropy of an empty segment")
    return float(head.mean())


TOP_LOGPROBS = 10  # k of the released code's vLLM `logprobs=10`


def top10_sum_entropy(top_logprobs: np.ndarray, vocab_size: int, num_tokens: int = 20) -> float:
    """Released-code segment entropy (spec section 1; docs/fidelity.md).

    `sum_t -sum_j p_tj log p_tj / ln V` over the first `num_tokens` tokens,
    `j` running over every log-prob reported for token `t`: the released
    `_calc_entropy` sums over all entries of vLLM's `logprobs=10` output
    (see `reported_logprobs`).

    Args:
      top_logprobs: float[N, M] log-probs reported at each of the segment's
        first N generated positions (M = 10, or 11 with the sampled token's
        column from `reported_logprobs`); NaN marks an absent entry.
      vocab_size: V, for the `ln V` normalisation (the released code uses the
        tokenizer's vocabulary size).
      num_tokens: how many leading tokens to sum over (20 in the released code).
    """
    top = np.asarray(top_logprobs, np.float64)
    if top.ndim != 2 or top.shape[0] == 0:
        raise ValueError(f"top_logprobs must be a non-empty [N, M] array, got shape {top.shape}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    head = top[:num_tokens]  # [n, M]
    terms = np.where(np.isnan(head), 0.0, -np.exp(head) * np.nan_to_num(head))  # [n, M]
    return float(terms.sum() / math.log(vocab_size))


def reported_logprobs(top_logprobs: np.ndarray, top_ids: np.ndarray, sampled_ids: np.ndarray,
                      sampled_logp: np.ndarray) -> np.ndarray:
    """What vLLM's `logprobs=k` reports per generated token: the top k, plus the sampled token when outside them.

    Args:
      top_logprobs, top_ids: float[..., k] / int[..., k] from the sampler.
      sampled_ids, sampled_logp: int[...] / float[...] the generated tokens and their log-probs.

    Returns:
      float64[..., k + 1]: the top k log-probs, then the sampled token's
      log-prob where its id is not among the top k, NaN where it is.
    """
    inside = np.any(np.asarray(top_ids) == np.asarray(sampled_ids)[..., None], axis=-1)  # [...]
    extra = np.where(inside, np.nan, np.asarray(sampled_logp, np.float64))  # [...]
    return np.concatenate([np.asarray(top_logprobs, np.float64), extra[..., None]], axis=-1)
