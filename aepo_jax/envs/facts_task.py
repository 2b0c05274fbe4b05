"""The demo task on disk: generated env files, its prompts and its tokenizer (DESIGN.md, embedded default).

Everything an agent run over the synthetic facts environment needs besides
the model: `write_task` generates the corpus and question splits and writes
them as JSONL; `demo_prompt_config` is the short system prompt the demo's
rollouts and its SFT data share (the default agent prompt costs ~330 tokens
of a small vocabulary, longer than a whole demo trajectory);
`tokenizer_texts` is the text a SentencePiece tokenizer is trained on:
system prompt, corpus, questions, and scripted trajectories with their tool
results rendered the way the tools render them.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

from aepo_jax.agent.prompts import PromptConfig
from aepo_jax.agent.protocol import format_tool_result
from aepo_jax.envs.synthetic_facts import (
    DEFAULT_KINDS,
    FactsEnv,
    Question,
    build_env,
    invent_names,
    scripted_segments,
)

DEMO_SYSTEM_PROMPT = (
    "Search each town, compute with python, answer in \\boxed{}."
)


def demo_prompt_config(system_prompt: str = DEMO_SYSTEM_PROMPT) -> PromptConfig:
    """The prompt every demo stage renders (SFT data, rollouts, evaluation): one place, one text."""
    return PromptConfig(system_prompt=system_prompt)


@dataclasses.dataclass(frozen=True)
class TaskFiles:
    """A generated task: the environment and the paths of its JSONL files."""

    env: FactsEnv
    corpus: Path
    train: Path
    heldout: Path

    @property
    def towns_by_name(self) -> dict:
        return {t.name: t for t in self.env.towns}


def write_task(directory: str | Path, *, seed: int, n_towns: int, n_train: int, n_heldout: int,
               n_distractors: int, hops: int = 2, kinds: tuple[str, ...] = DEFAULT_KINDS,
               heldout_fraction: float = 0.25, max_syllables: int = 2) -> TaskFiles:
    """Generate the environment (`build_env`) with questions of `kinds` and write it to `directory`.

    `kinds` is a difficulty knob: `years_since` needs one search and copies one
    4-digit number, `years_between` two searches and two numbers, the population
    kinds two 6-digit numbers. Many towns with few questions each
    keep a small model from memorising facts: copying from the tool results
    is then the only way to answer, and that is what transfers to held-out towns.
    """
    env = build_env(seed=seed, n_towns=n_towns, n_train=n_train, n_heldout=n_heldout, hops=hops,
                    n_distractors=n_distractors, heldout_fraction=heldout_fraction, max_syllables=max_syllables,
                    kinds=tuple(kinds))
    paths = env.write(directory)
    return TaskFiles(env, paths["corpus"], paths["train"], paths["heldout"])


def question_example(question: Question) -> dict:
    """The project's example dict (docs/interfaces.md, Data) for one question."""
    return {"id": question.id, "question": question.question, "answers": [question.answer],
            "data_source": "synthetic_facts"}


def _passage(doc: dict[str, str], number: int) -> str:
    title, _, body = doc["contents"].partition("\n")
    return f"Doc {number} (Title: {title.strip()}) {body.strip()}"


def tokenizer_texts(task: TaskFiles, system_prompt: str, seed: int, num_scripts: int = 300,
                    max_syllables: int = 2) -> list[str]:
    """Training text for the demo tokenizer: prompt, corpus, questions, scripted trajectories, names masked.

    Tool results inside the scripts are rendered like the search tool's passages
    and python's printed output, so the pieces the model reads at run time exist.
    """
    rng = np.random.default_rng(seed)
    towns = task.towns_by_name
    docs_by_title = {d["contents"].partition("\n")[0]: d for d in task.env.corpus}
    texts = [system_prompt]
    texts += [d["contents"] for d in task.env.corpus]
    texts += [q.question for q in task.env.train]
    for q in task.env.train[:num_scripts]:
        segments = scripted_segments(q, towns, rng, skip_python_prob=0.5)
        pieces = []
        for seg in segments:
            pieces.append(seg)
            if seg.endswith("</search>"):
                name = next(n for n in q.towns if seg.endswith(f" {n}</search>"))
                pieces.append(format_tool_result(_passage(docs_by_title[name], 1)))
            elif seg.endswith("</python>"):
                pieces.append(format_tool_result(q.answer))
        texts.append("".join(pieces))
    # Every town name is replaced by a fresh invented name each time it occurs, so no
    # name becomes one piece but its syllables do: a held-out town then spells with the
    # same sub-word pieces as the training towns, which a small model can copy (a
    # whole-name piece it never produced in training it cannot).
    names = sorted((t.name for t in task.env.towns), key=len, reverse=True)
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    fresh = iter(invent_names(sum(len(pattern.findall(t)) for t in texts) + 1, seed + 7919, max_syllables))
    return [pattern.sub(lambda _: next(fresh), text) for text in texts]
