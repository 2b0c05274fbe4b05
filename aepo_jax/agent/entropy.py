"""Segment entropy, the signal every branching decision reads (spec section 1).

`exact_mean` (default): the mean of the sampler's exact full-vocabulary token
entropies `H_t` over the first K tokens of the segment.
`top10_sum` (released-code reproduction): the sum over the first K tokens of
`-sum p log p` restricted to the top-10 log-probs, divided by `ln V`. It needs
the per-token top-10 log-probs, which the sampler must return for it.
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


def top10_sum_entropy(top_logprobs: np.ndarray, vocab_size: int, num_tokens: int = 20) -> float:
    """Released-code segment entropy from top-10 log-probs (spec section 1).

    Args:
      top_logprobs: float[N, 10] log-probs of the 10 most likely tokens at each
        of the segment's first N generated positions.
      vocab_size: V of the model, for the `ln V` normalisation.
      num_tokens: how many leading tokens to sum over (20 in the released code).
    """
    top = np.asarray(top_logprobs, np.float64)
    if top.ndim != 2 or top.shape[0] == 0:
        raise ValueError(f"top_logprobs must be a non-empty [N, 10] array, got shape {top.shape}")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    head = top[:num_tokens]  # [n, 10]
    per_token = -(np.exp(head) * head).sum(axis=-1)  # [n]
    return float(per_token.sum() / math.log(vocab_size))
