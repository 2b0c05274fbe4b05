"""SFT cold-start data: scripted trajectories executed with the real tools, token-in/token-out.

Each scripted solution (`synthetic_facts.scripted_segments`) is played
segment by segment against the live tools (search through the server,
python in the sandbox), and tokenised exactly as the agent loop will later
see it (spec §4, DESIGN.md "Agent loop"): the prompt rendered with the
rollout's chat template and system prompt, every generated segment encoded
on its own (mask 1), every tool result formatted with `format_tool_result`
and encoded on its own (mask 0). The flaw of the scripts (skipping python)
is kept, so SFT copies it and RL has something to remove. Under a chat
template whose generation prompt opens a think block (ends in `<think>`), the first
segment closes it with an empty block, as RL's `response_text` reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aepo_jax.agent.prompts import prompt_opens_think
from aepo_jax.agent.protocol import format_tool_result, parse_last_tool_call
from aepo_jax.agent.tags import THINK_CLOSE, THINK_OPEN
from aepo_jax.envs.synthetic_facts import Question, Town, scripted_segments

# Closes the think block a thinking template's generation prompt opens: after its `<think>\n`, an empty
# block `<think>\n\n</think>\n\n` (what Qwen3 writes when it does not think); the scripts have no reasoning.
_CLOSE_OPENED_THINK = "\n" + THINK_CLOSE + "\n\n"


@dataclass
class SFTSequence:
    """One executed scripted trajectory as the trainer sees it."""

    question_id: str
    tokens: list[int]  # prompt + response ids
    mask: list[int]  # 1 on generated segments, 0 on prompt and tool results
    used_python: bool
    tool_failures: int

    def as_row(self) -> dict[str, list[int]]:
        return {"tokens": self.tokens, "mask": self.mask}


def build_sft_sequences(
    questions: Sequence[Question],
    towns_by_name: dict[str, Town],
    tokenizer: Any,
    tools: Any,
    encode_prompt: Callable[[str], list[int]],
    rng: np.random.Generator,
    skip_python_prob: float,
    script: Callable[[Any, dict, np.random.Generator, float], list[str]] | None = None,
) -> list[SFTSequence]:
    """Execute one scripted trajectory per question with `tools.run_many` (one batch of calls per step).

    Args:
      questions: questions to script.
      towns_by_name: the environment's facts (the scripts are written from them).
      tokenizer: encodes segments and tool results (no BOS/EOS added).
      tools: a `ToolRegistry` (or anything with `run_many(calls)`).
      encode_prompt: question text -> prompt ids (chat template + system prompt of the rollout).
      rng: drives the scripts' flaw.
      skip_python_prob: probability a script answers without the python step.
      script: writes one question's segments, `(question, towns_by_name, rng, flaw_prob)`;
        default `synthetic_facts.scripted_segments` (another task brings its own).
    """
    if not 0.0 <= skip_python_prob <= 1.0:
        raise ValueError(f"skip_python_prob must be in [0, 1], got {skip_python_prob}")
    script = script or scripted_segments
    opened = prompt_opens_think(tokenizer)
    scripts = [_fit_to_prompt(script(q, towns_by_name, rng, skip_python_prob), opened) for q in questions]
    sequences = []
    for q, segments in zip(questions, scripts, strict=True):
        prompt = list(encode_prompt(q.question))
        sequences.append(SFTSequence(q.id, prompt, [0] * len(prompt),
                                     any("<python>" in s for s in segments), 0))
    for step in range(max(len(s) for s in scripts)):
        active = [i for i, s in enumerate(scripts) if step < len(s)]
        calls = []
        for i in active:
            segment = scripts[i][step]
            ids = list(tokenizer.encode(segment))
            sequences[i].tokens += ids
            sequences[i].mask += [1] * len(ids)
            calls.append(parse_last_tool_call(segment) if step < len(scripts[i]) - 1 else None)
        wanted = [(i, c) for i, c in zip(active, calls, strict=True) if c is not None]
        results = tools.run_many([c for _, c in wanted]) if wanted else []
        for (i, _), result in zip(wanted, results, strict=True):
            ids = list(tokenizer.encode(format_tool_result(str(result.text))))
            sequences[i].tokens += ids
            sequences[i].mask += [0] * len(ids)
            sequences[i].tool_failures += 0 if result.ok else 1
    return sequences


def _fit_to_prompt(segments: list[str], opened: bool) -> list[str]:
    """`segments` as the response to a prompt that `opened` a think block: a script that opens its own
    loses that `<think>` (a second one leaves the tags unbalanced), any other first closes the prompt's
    block, so that the trajectory passes RL's format check instead of scoring -1."""
    if not opened or not segments:
        return segments
    first = segments[0].lstrip()
    first = first[len(THINK_OPEN):].lstrip() if first.startswith(THINK_OPEN) else _CLOSE_OPENED_THINK + segments[0]
    return [first, *segments[1:]]
