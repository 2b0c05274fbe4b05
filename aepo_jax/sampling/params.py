"""Sampling parameters: a small hashable dataclass that jit treats as static."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How the next token is drawn from the logits (spec section 1).

    Attributes:
      temperature: divides the logits before softmax; log-probs and entropies
        are reported at this temperature even when `greedy` is set.
      top_k: keep the k most likely tokens; 0 disables. Tokens tied with the k-th
        are kept too (`token_distribution.truncate_logits`).
      top_p: keep the smallest set of most likely tokens whose probability
        reaches top_p (after top-k); 1.0 disables. Tokens tied with the last one
        kept are kept too.
      greedy: take the argmax instead of sampling.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.temperature < float("inf"):  # inf made every logit 0: uniform sampling, silently
            raise ValueError(f"SamplingParams.temperature must be a finite number > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0 disables), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")

    @property
    def truncates(self) -> bool:
        """True when top-k or top-p removes part of the vocabulary (needs a sort or top_k)."""
        return self.top_k > 0 or self.top_p < 1.0
