"""Rewards of spec §5: format gate, QA F1 / exact match, math equivalence, LLM judge, registry."""

from aepo_jax.rewards.answer_rewards import (
    count_tool_calls,
    exact_match_reward,
    graded_answer,
    last_boxed,
    math_equiv_reward,
    qa_f1_reward,
)
from aepo_jax.rewards.judge import llm_judge_reward
from aepo_jax.rewards.math_equiv import (
    SympyWorkerPool,
    default_sympy_pool,
    math_equal,
    math_equal_any,
)
from aepo_jax.rewards.math_normalize import normalize_math_answer
from aepo_jax.rewards.qa import exact_match, normalize_answer, token_f1
from aepo_jax.rewards.registry import (
    REWARDS,
    compute_reward,
    compute_rewards,
    get_reward,
    reward_for_source,
    rewards_for,
)

__all__ = [
    "REWARDS",
    "SympyWorkerPool",
    "compute_reward",
    "compute_rewards",
    "count_tool_calls",
    "default_sympy_pool",
    "exact_match",
    "exact_match_reward",
    "get_reward",
    "graded_answer",
    "last_boxed",
    "llm_judge_reward",
    "math_equal",
    "math_equal_any",
    "math_equiv_reward",
    "normalize_answer",
    "normalize_math_answer",
    "qa_f1_reward",
    "reward_for_source",
    "rewards_for",
    "token_f1",
]
