"""Scoring the `n` sampled responses to one question for evaluation (spec §6).

Turns response texts into a `QuestionResult`: per sample, whether it is
correct (exact match for QA sources, math equivalence for math sources, the
judge elsewhere, as chosen by `reward_for_source`) and the token F1 of its
boxed answer (0 when the format is invalid), plus tool calls and length,
the reward that decided correctness and how many sympy checks timed out (a
timed-out check counts as wrong, so the count says how far to trust it).
The evaluation driver calls this once per question.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aepo_jax.data.records import Example
from aepo_jax.evaluation.metrics import QuestionResult
from aepo_jax.rewards import (
    compute_reward,
    count_tool_calls,
    graded_answer,
    reward_for_source,
    token_f1,
)
from aepo_jax.rewards.math_equiv import count_timeouts

# Correctness of one sample for each reward family; QA sources count an exact match.
_CORRECTNESS_REWARD = {"qa_f1": "exact_match"}


def correctness_reward(example: Example, reward: str | None = None) -> str:
    """The reward deciding whether a sample of `example` is correct: `reward`'s family (None or
    `"auto"`: by the example's data source), with exact match standing in for QA F1."""
    family = reward_for_source(example["data_source"]) if reward in (None, "auto") else reward
    return _CORRECTNESS_REWARD.get(family, family)


def training_reward(reward_name: str, text: str, example: Example, trajectory: Any,
                    judge: Any = None) -> tuple[float, bool]:
    """(spec §5 reward, correct as evaluation decides) of one training response.

    The multi-tool bonus reads the calls the loop ran (`executed_tool_calls`: malformed closings and
    tags only written do not count; a record without tool steps falls back to the text's tags).
    Correct is exact match where the reward is QA F1 (`correctness_reward`), else the reward's own
    result reaching 1, so no math or judge call is made twice.
    """
    from aepo_jax.rewards.answer_rewards import executed_tool_calls

    answers, source = example["answers"], example.get("data_source", "")
    calls = executed_tool_calls(trajectory)
    reward = compute_reward(reward_name, text, answers, data_source=source, judge=judge,
                            question=example.get("question", ""), **({} if calls is None else {"tool_calls": calls}))
    family = reward_for_source(source) if reward_name == "auto" else reward_name
    judged_by = correctness_reward({"data_source": source}, reward_name)
    correct = reward >= 1.0 if judged_by == family else compute_reward(judged_by, text, answers) >= 1.0
    return reward, correct


def score_question(
    example: Example,
    responses: Sequence[str],
    response_lengths: Sequence[int],
    *,
    tool_calls: Sequence[int] | None = None,
    reward: str | None = None,
    require_format: bool = True,
    **reward_kw,
) -> QuestionResult:
    """Score the sampled responses to one example.

    Args:
      example: the question with its gold `answers` and `data_source`.
      responses: the `n` response texts (agent trajectories, tool results included).
      response_lengths: generated tokens per response.
      tool_calls: tool calls per response (counted from the text when omitted).
      reward: reward family deciding correctness (None or "auto": by data source).
      require_format: apply the spec §5 format gate (False for plain-text models).
      **reward_kw: options for the rewards (e.g. `pool=`, `judge=`); each reward gets the ones it takes.
    """
    if len(responses) != len(response_lengths):
        raise ValueError(
            f"{len(responses)} responses but {len(response_lengths)} lengths"
        )
    correctness = correctness_reward(example, reward)
    reward_kw.setdefault("question", example["question"])  # shown to a judge; other rewards take no question
    answers = example["answers"]
    correct, f1 = [], []
    with count_timeouts() as timeouts:
        for text in responses:
            score = compute_reward(
                correctness, text, answers, require_format=require_format, **reward_kw
            )
            correct.append(score >= 1.0)
            answer = graded_answer(text, require_format)
            f1.append(0.0 if answer is None else token_f1(answer, answers))
    if tool_calls is None:
        tool_calls = [sum(count_tool_calls(text).values()) for text in responses]
    return QuestionResult(
        question_id=example["id"],
        data_source=example["data_source"],
        correct=correct,
        f1=f1,
        tool_calls=list(tool_calls),
        response_length=list(response_lengths),
        correctness=correctness,
        math_timeouts=timeouts.count,
    )
