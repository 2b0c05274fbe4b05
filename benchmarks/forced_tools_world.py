"""The agentic setting the rollout benchmarks share: a tiny random model whose tool calls are forced
(`ToolForcingGenerator`), a tokenizer trained on a small town corpus, and the real tools (search server
on loopback, python sandbox), which can be made slow."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flax import nnx

from aepo_jax.agent.tags import AGENT_SPECIAL_TOKENS
from aepo_jax.models import Decoder, get_preset
from aepo_jax.servers import start_search_server
from aepo_jax.tokenizers import train_sentencepiece
from aepo_jax.tools import (
    PythonSandbox,
    PythonTool,
    SandboxLimits,
    SearchTool,
    ToolRegistry,
)

TOWNS = ["Brindle", "Ostwick", "Marrow", "Kelby", "Tarn", "Dunmore", "Fallow", "Harrow"]
SYSTEM = "Think, then use <search>query</search> or <python>code</python>; answer as <answer>\\boxed{x}</answer>."
# What each trajectory's segments end with, in order: two searches and a python call, then the answer.
PLAN_TEXTS = ("<think>look</think><search>Brindle people</search>", "<python>print(6 * 7)</python>",
              "<search>Marrow founded</search>", "<answer>\\boxed{42}</answer>")


@dataclasses.dataclass
class World:
    """Questions, their corpus, a tokenizer for both, a random model over it and the forced plan."""

    questions: list[str]
    corpus: dict[str, str]
    tokenizer: Any
    graphdef: Any
    params: Any
    plan: list[list[int]]


def build_world(prompts: int, preset: str = "tiny") -> World:
    """`prompts` town questions, the tokenizer trained on them and a random `preset` model over it."""
    corpus = {t.lower(): f"{t}\n{t} is a town of {1000 + 37 * i} people founded in {1800 + 7 * i}."
              for i, t in enumerate(TOWNS)}
    questions = [f"How many people live in {TOWNS[i % len(TOWNS)]} (case {i})?" for i in range(prompts)]
    tok = train_sentencepiece(list(corpus.values()) + questions + [SYSTEM, "print(6 * 7)"] * 3, vocab_size=400,
                              special_tokens=AGENT_SPECIAL_TOKENS)
    graphdef, params = nnx.split(Decoder(get_preset(preset, vocab_size=tok.vocab_size), rngs=nnx.Rngs(0)))
    return World(questions, corpus, tok, graphdef, params, [tok.encode(text) for text in PLAN_TEXTS])


@contextlib.contextmanager
def live_tools(corpus: dict[str, str], latency_ms: float, concurrency: int) -> Iterator[ToolRegistry]:
    """A registry over a real search server and python sandbox that answer no sooner than `latency_ms`
    after each call, running at most `concurrency` calls at once; everything is shut down on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        path.write_text("".join(json.dumps({"id": k, "contents": v}) + "\n" for k, v in corpus.items()))
        limits = SandboxLimits(wall_seconds=5.0, cpu_seconds=2, memory_bytes=256 << 20)
        with (start_search_server(str(path), latency_ms=latency_ms) as server,
              PythonSandbox(limits, pool_size=4, latency_seconds=latency_ms / 1000.0) as sandbox):
            registry = ToolRegistry({"search": SearchTool(server.url, topk=1, max_result_chars=120),
                                     "python": PythonTool(sandbox)}, max_workers=concurrency)
            try:
                yield registry
            finally:
                registry.close()
