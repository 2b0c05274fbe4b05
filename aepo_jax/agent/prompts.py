"""Agent prompts: the system prompt that explains the tags, rendered with the model's chat template.

Both the system prompt text and whether one is used at all are configurable;
the rendering goes through the tokenizer's own `apply_chat_template`, so the
ids are exactly what the model sees (spec section 4).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aepo_jax.agent.tags import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    RESULT_CLOSE,
    RESULT_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_TAGS,
)

# The default system prompt's line for each tool, offered only when the run has that tool.
TOOL_INSTRUCTIONS = {
    "search": "To search the knowledge corpus, write <search>your query</search>.\n",
    "python": "To run Python (print what you need), write <python>your code</python>.\n",
    "browse": "To read a whole document, write <browse>document id or url</browse>.\n",
}


def system_prompt_for_tools(tools: Iterable[str] = TOOL_TAGS) -> str:
    """The default system prompt, offering only the tools in `tools` (a run's registered tool names),
    so the policy is not told to call a tool that would answer "unknown tool"."""
    unknown = sorted(set(tools) - set(TOOL_INSTRUCTIONS))
    if unknown:
        raise ValueError(f"no system prompt line for tools {unknown}; known: {sorted(TOOL_INSTRUCTIONS)}")
    offered = set(tools)
    return (
        "You are a research assistant that answers questions by reasoning and using tools.\n"
        f"Think inside {THINK_OPEN} ... {THINK_CLOSE}.\n"
        + "".join(TOOL_INSTRUCTIONS[tag] for tag in TOOL_TAGS if tag in offered)
        + f"Each tool's output comes back inside {RESULT_OPEN} ... {RESULT_CLOSE}.\n"
        "Call one tool at a time and wait for its result.\n"
        f"When you know the answer, write {ANSWER_OPEN}\\boxed{{your answer}}{ANSWER_CLOSE}."
    )


DEFAULT_SYSTEM_PROMPT = system_prompt_for_tools()  # every tool


class ChatTokenizer(Protocol):
    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class PromptConfig:
    """`system_prompt=None` renders the user turn alone (for templates without a system role)."""

    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    question_template: str = "{question}"

    def __post_init__(self) -> None:
        if "{question}" not in self.question_template:
            raise ValueError(f"question_template must contain '{{question}}', got {self.question_template!r}")


def build_messages(question: str, config: PromptConfig = PromptConfig()) -> list[dict[str, str]]:
    """Chat messages for one question: optional system turn, then the user turn."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question must be a non-empty string, got {question!r}")
    messages = []
    if config.system_prompt:
        messages.append({"role": "system", "content": config.system_prompt})
    messages.append({"role": "user", "content": config.question_template.format(question=question)})
    return messages


def render_prompt(tokenizer: ChatTokenizer, question: str, config: PromptConfig = PromptConfig()) -> list[int]:
    """Prompt token ids: the chat template applied to `build_messages`, with the generation prompt."""
    return list(tokenizer.apply_chat_template(build_messages(question, config), add_generation_prompt=True))


def render_prompts(
    tokenizer: ChatTokenizer, questions: Sequence[str], config: PromptConfig = PromptConfig()
) -> list[list[int]]:
    """`render_prompt` for a batch of questions."""
    return [render_prompt(tokenizer, q, config) for q in questions]


def response_text(tokenizer: ChatTokenizer, response_ids: Sequence[int]) -> str:
    """A trajectory's response as text, what rewards and the format check read. A chat format whose
    generation prompt opens a think block (a thinking template's `<|im_start|>assistant\\n<think>\\n`)
    starts the response inside it: that opening is put back in front, so the response's `</think>`
    closes a block."""
    text = tokenizer.decode(response_ids)
    if prompt_opens_think(tokenizer):
        return THINK_OPEN + _generation_prompt(tokenizer).rpartition(THINK_OPEN)[2] + text
    return text


def _generation_prompt(tokenizer: Any) -> str:
    return getattr(getattr(tokenizer, "chat_format", None), "generation_prompt", "") or ""


def prompt_opens_think(tokenizer: Any) -> bool:
    """Whether the tokenizer's generation prompt ends inside an open think block (a thinking template's
    `<|im_start|>assistant\\n<think>\\n`): its responses start inside that block (`response_text`, and the
    SFT sequences that teach them)."""
    prompt = _generation_prompt(tokenizer)
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)
