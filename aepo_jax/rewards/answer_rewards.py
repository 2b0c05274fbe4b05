"""The per-response rewards of spec §5: format gate, then a score of the boxed answer.

Every reward here has the signature `(response_text, answers, **kw) -> float`
and starts with the same gate: a response whose format is invalid (spec §5,
`aepo_jax.agent.protocol.validate_format`) scores `-1`. Pass
`require_format=False` to score the last `\\boxed{}` anywhere in the model's
own text instead (plain reasoning outputs without agent tags), or that whole
text when there is no box; tool result blocks are never read as the answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from aepo_jax.agent.protocol import extract_boxed_answer, model_text, validate_format
from aepo_jax.agent.tags import ANSWER_CLOSE, ANSWER_OPEN, open_tag
from aepo_jax.rewards.math_equiv import SympyWorkerPool, math_equal_any
from aepo_jax.rewards.qa import exact_match, token_f1
from aepo_jax.rollout.critical_path import NO_CALL_TAG

FORMAT_PENALTY = -1.0
MULTI_TOOL_BONUS = 0.1


def last_boxed(text: str) -> str | None:
    """The last `\\boxed{...}` anywhere in `text` (nested braces), through the protocol's extractor."""
    return extract_boxed_answer(
        ANSWER_OPEN + text.replace(ANSWER_OPEN, "").replace(ANSWER_CLOSE, "")
    )


def graded_answer(response_text: str, require_format: bool = True) -> str | None:
    """The answer string to score, or None when the format gate fails (reward -1).

    With the gate: the box of the model's one `<answer>`; without: the last box of the model's own text,
    else that whole text. Tool results are left out either way, so a `\\boxed{42}` (or an `<answer>`)
    in a fetched page is not the model's answer.
    """
    text = model_text(response_text)
    if require_format:
        ok, _ = validate_format(response_text)
        return extract_boxed_answer(text) if ok else None
    boxed = last_boxed(text)
    return text.strip() if boxed is None else boxed


def count_tool_calls(response_text: str) -> dict[str, int]:
    """Opening tool tags in the model's text (tool results excluded), by tag name.

    Written, not necessarily run: a tag mentioned inside `<think>` or a call left unclosed counts too.
    Rewards read it only for a text without a record of the calls the agent loop ran (`executed_tool_calls`).
    """
    text = model_text(response_text)
    return {tag: text.count(open_tag(tag)) for tag in ("search", "python", "browse")}


def executed_tool_calls(trajectory: Any) -> dict[str, int] | None:
    """Tool calls the agent loop ran for `trajectory`, by tag: its tool steps (a branch's inherited ones
    included, since its text holds them) less the malformed closings the loop answered itself
    (`NO_CALL_TAG`, no tool ran). None when `trajectory` has no `tool_steps` record (text only)."""
    steps = getattr(trajectory, "tool_steps", None)
    if steps is None:
        return None
    return dict(Counter(step.tag for step in steps if step.tag != NO_CALL_TAG))


def _as_answers(answers: str | Sequence[str]) -> list[str]:
    answers = [answers] if isinstance(answers, str) else [str(a) for a in answers]
    if not answers:
        raise ValueError("gold answers list is empty")
    return answers


def qa_f1_reward(
    response_text: str,
    answers: str | Sequence[str],
    *,
    require_format: bool = True,
    tool_calls: Mapping[str, int] | None = None,
) -> float:
    """Default deep-research reward (spec §5): -1 bad format, else F1 (+0.1 if both search and python ran).

    Args:
      tool_calls: calls per tool tag that the agent loop ran (`executed_tool_calls`); the bonus
        reads them whenever given. Only when omitted (a text without a record of its calls) are
        the opening tags of the text counted instead (`count_tool_calls`), mentions included.
    """
    answer = graded_answer(response_text, require_format)
    if answer is None:
        return FORMAT_PENALTY
    f1 = token_f1(answer, _as_answers(answers))
    calls = count_tool_calls(response_text) if tool_calls is None else tool_calls
    used_both = calls.get("search", 0) > 0 and calls.get("python", 0) > 0
    return f1 + (MULTI_TOOL_BONUS if f1 > 0 and used_both else 0.0)


def exact_match_reward(
    response_text: str, answers: str | Sequence[str], *, require_format: bool = True
) -> float:
    """-1 bad format, else 1 if the normalised boxed answer equals a gold answer."""
    answer = graded_answer(response_text, require_format)
    return (
        FORMAT_PENALTY if answer is None else exact_match(answer, _as_answers(answers))
    )


def math_equiv_reward(
    response_text: str,
    answers: str | Sequence[str],
    *,
    require_format: bool = True,
    pool: SympyWorkerPool | None = None,
    timeout_s: float | None = None,
) -> float:
    """-1 bad format, else 1 if the boxed answer is mathematically equivalent to a gold answer."""
    answer = graded_answer(response_text, require_format)
    if answer is None:
        return FORMAT_PENALTY
    return float(
        math_equal_any(answer, _as_answers(answers), pool=pool, timeout_s=timeout_s)
    )
