"""LLM-as-judge reward through the tools package's judge client (spec §5).

The client (`aepo_jax.tools.LLMJudgeClient`) talks to an OpenAI-compatible
endpoint; this module only applies the format gate and turns its verdict
into a reward. The caller passes the client as `judge=`, so no connection
is opened implicitly.
"""

from __future__ import annotations

from collections.abc import Sequence

from aepo_jax.rewards.answer_rewards import FORMAT_PENALTY, graded_answer


def llm_judge_reward(
    response_text: str,
    answers: str | Sequence[str],
    *,
    judge=None,
    question: str = "",
    require_format: bool = True,
) -> float:
    """-1 bad format, else the judge's verdict (1.0 correct, 0.0 wrong) on the boxed answer.

    Args:
      judge: an `aepo_jax.tools.LLMJudgeClient` (anything with the same `judge` method).
      question: the question text, shown to the judge.
    """
    if judge is None:
        raise ValueError(
            "reward 'llm_judge' needs judge=<aepo_jax.tools.LLMJudgeClient>"
        )
    answer = graded_answer(response_text, require_format)
    if answer is None:
        return FORMAT_PENALTY
    gold = [answers] if isinstance(answers, str) else list(answers)
    return float(judge.judge(question=question, prediction=answer, answers=gold))
