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
    """-1 bad format, else the judge's verdict (1.0 correct, 0.0 wrong or no verdict) on the boxed answer.

    HTTP failures of the judge propagate (`aepo_jax.tools.http_client.HttpError`):
    an unreachable judge is a configuration problem, not a wrong answer.

    Args:
      judge: an `aepo_jax.tools.LLMJudgeClient` (or anything with its `judge(question, gold, prediction)`).
      question: the question text, shown to the judge.
    """
    if judge is None:
        raise ValueError(
            "reward 'llm_judge' needs judge=<aepo_jax.tools.LLMJudgeClient> "
            "(a run builds it from reward.judge_url and reward.judge_model)"
        )
    answer = graded_answer(response_text, require_format)
    if answer is None:
        return FORMAT_PENALTY
    gold = [answers] if isinstance(answers, str) else list(answers)
    verdict = judge.judge(question=question, gold=gold, prediction=answer)
    return 1.0 if verdict else 0.0  # a reply with no verdict (None) scores as wrong
