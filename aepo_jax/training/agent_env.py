"""Config -> the real agentic rollout the RL trainer drives (DESIGN.md flow):
dataset, tokenizer, tools (local search server over the corpus, python
sandbox), KV-cache sampler, agent loop and rollout strategy, plus the prompt
encoder and reward function. Everything here is host-side wiring.

With `data.path == ""` the embedded synthetic tool-use task is generated
(`aepo_jax.envs.synthetic_facts`) and, without `tokenizer.path`, a
SentencePiece tokenizer is trained on its text and kept in the workdir so a
resumed run reuses the same vocabulary.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_collections

from aepo_jax.agent.loop import AgentLoop, LoopConfig, agent_stop_sequences, cache_slots
from aepo_jax.agent.prompts import DEFAULT_SYSTEM_PROMPT, render_prompt
from aepo_jax.rewards import compute_reward


@dataclass
class AgentEnvironment:
    """The host-side pieces of an RL run; call `close()` to stop the tool processes."""

    tokenizer: Any
    examples: list[dict]
    corpus_path: str | None
    encode_prompt: Callable[[dict], list[int]]
    reward_fn: Callable[[dict, Any], float]
    tools: Any
    closers: list[Callable[[], None]] = field(default_factory=list)
    task: Any = None  # the generated `FactsEnv` of the synthetic task (None for data.path runs)

    def make_rollout_fn(self, cfg: ml_collections.ConfigDict, graphdef: Any, params: Any, mesh: Any = None):
        """`rollout_fn(prompts, k, params, key, rng)` over a sampler that starts from `params`."""
        from aepo_jax.rollout.strategies import RolloutConfig, rollout
        from aepo_jax.sampling import Sampler, SamplingParams

        r = cfg.rollout
        loop_config = LoopConfig(
            max_tool_calls=int(r.max_tool_calls), max_response_tokens=int(r.max_response_len),
            max_context_len=int(r.max_prompt_len) + int(r.max_response_len), entropy_tokens=int(r.entropy_tokens),
            entropy_measure=r.entropy_measure,
        )
        sampler = Sampler(
            graphdef, params, eos_ids=[self.tokenizer.eos_id], pad_id=self.tokenizer.pad_id,
            stop_sequences=agent_stop_sequences(self.tokenizer),
            params=SamplingParams(temperature=float(r.temperature), top_k=int(r.top_k), top_p=float(r.top_p)),
            # Room for a repacked context plus a whole segment after it (see `cache_slots`); the loop's
            # max_context_len still bounds the real tokens.
            max_cache_len=cache_slots(loop_config),
            mesh=mesh,
            seed=int(cfg.seed),
        )
        timed_tools = _TimedTools(self.tools)
        loop = AgentLoop(sampler, self.tokenizer, timed_tools, loop_config)
        strategy = RolloutConfig(
            strategy=r.strategy, initial_rollouts=int(r.initial_rollouts), entropy_weight=float(r.entropy_weight),
            branch_threshold=float(r.branch_threshold), branch_width=int(r.branch_width),
            entropy_tokens=int(r.entropy_tokens), entropy_measure=r.entropy_measure,
            dynamic_budget=bool(r.dynamic_budget), beta=float(r.beta), premonitor_reuse=bool(r.premonitor_reuse),
            penalty_slope=float(r.penalty_slope), penalty_scope=r.penalty_scope,
        )

        def rollout_fn(prompts, k, params, key, rng):
            sampler.set_params(params)
            groups, stats = rollout(prompts, k, loop=loop, config=strategy, rng=rng, key=key)
            stats = stats.as_dict()
            stats["tool_seconds"] = timed_tools.take_seconds()  # wall time spent waiting on tools
            return groups, stats

        return rollout_fn

    def close(self) -> None:
        for close in reversed(self.closers):
            close()
        self.closers.clear()


class _TimedTools:
    """Forwards `run_many` to a tool registry and adds up the wall time spent in it."""

    def __init__(self, tools: Any):
        self.tools, self.seconds = tools, 0.0

    def run_many(self, calls):
        start = time.perf_counter()
        try:
            return self.tools.run_many(calls)
        finally:
            self.seconds += time.perf_counter() - start

    def take_seconds(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def _synthetic_task(cfg: ml_collections.ConfigDict, directory: str) -> tuple[list[dict], str, Any]:
    from aepo_jax.envs.synthetic_facts import build_env

    env = build_env(seed=int(cfg.seed), n_train=int(cfg.data.get("num_examples", 256)))
    paths = env.write(directory)
    examples = [{"id": q.id, "question": q.question, "answers": [q.answer], "data_source": "synthetic_facts"}
                for q in env.train]
    return examples, str(paths["corpus"]), env


def _tokenizer(cfg: ml_collections.ConfigDict, workdir: str, texts: list[str]) -> Any:
    from aepo_jax.tokenizers import load_tokenizer
    from aepo_jax.tokenizers.sentencepiece_tokenizer import (
        SentencePieceTokenizer,
        train_sentencepiece,
    )

    if cfg.tokenizer.path:
        return load_tokenizer(cfg.tokenizer.path, add_agent_tokens=True)
    prefix = os.path.join(workdir, "tokenizer")
    if os.path.exists(prefix + ".model"):
        return SentencePieceTokenizer(prefix + ".model")
    return train_sentencepiece(texts, int(cfg.tokenizer.vocab_size), model_prefix=prefix)


# `deterministic` runs: the python tool's wall-clock backstop, in multiples of its CPU-time limit.
DETERMINISTIC_WALL_FACTOR = 10


def sandbox_limits(cfg: ml_collections.ConfigDict) -> Any:
    """The python tool's `SandboxLimits`: `rollout.tool_timeout_s` of wall clock, or with
    `cfg.deterministic` of CPU time (counted by the kernel, so a loaded machine cannot turn
    a call that fits into a timeout) under a backstop of `DETERMINISTIC_WALL_FACTOR` times it."""
    from aepo_jax.tools import SandboxLimits

    seconds = float(cfg.rollout.tool_timeout_s)
    if not cfg.get("deterministic", False):
        return SandboxLimits(wall_seconds=seconds)
    return SandboxLimits(wall_seconds=DETERMINISTIC_WALL_FACTOR * seconds, cpu_seconds=max(1, math.ceil(seconds)))


def build_agent_environment(cfg: ml_collections.ConfigDict, workdir: str) -> AgentEnvironment:
    """Dataset, tokenizer and tools for `cfg` (see the module docstring)."""
    from aepo_jax.servers.process import start_search_server
    from aepo_jax.tools import (
        PythonSandbox,
        PythonTool,
        SearchTool,
        ToolRegistry,
    )

    os.makedirs(workdir, exist_ok=True)
    closers: list[Callable[[], None]] = []
    corpus_path, task = None, None
    if cfg.data.path:
        from aepo_jax.data import load_local_examples

        examples = load_local_examples(cfg.data.path, os.path.join(workdir, "tfds"))
        corpus_path = cfg.data.get("corpus_path") or None
    elif cfg.data.name == "synthetic_facts":
        examples, corpus_path, task = _synthetic_task(cfg, os.path.join(workdir, "task"))
    else:
        raise ValueError(f"data.name {cfg.data.name!r} needs data.path (only 'synthetic_facts' is generated)")

    texts = [DEFAULT_SYSTEM_PROMPT] + [ex["question"] for ex in examples]
    if corpus_path:
        with open(corpus_path, encoding="utf-8") as f:
            texts += [line for line in f]
    tokenizer = _tokenizer(cfg, workdir, texts)

    tools: dict[str, Any] = {}
    search_url = cfg.data.get("search_url") or ""
    if not search_url and corpus_path:
        server = start_search_server(corpus_path)
        closers.append(server.stop)
        search_url = server.url
    if search_url:
        tools["search"] = SearchTool(search_url, topk=2, max_result_chars=int(cfg.rollout.max_result_chars))
    sandbox = PythonSandbox(sandbox_limits(cfg), pool_size=2)
    if hasattr(sandbox, "close"):
        closers.append(sandbox.close)
    tools["python"] = PythonTool(sandbox)
    registry = ToolRegistry(tools)
    if hasattr(registry, "close"):
        closers.append(registry.close)

    max_prompt = int(cfg.rollout.max_prompt_len)

    def encode_prompt(example: dict) -> list[int]:
        ids = render_prompt(tokenizer, example["question"])
        if len(ids) > max_prompt:
            raise ValueError(f"example {example.get('id')}: prompt has {len(ids)} tokens > rollout.max_prompt_len="
                             f"{max_prompt}")
        return ids

    reward_name = cfg.reward.name

    def reward_fn(example: dict, trajectory: Any) -> float:
        text = tokenizer.decode(trajectory.response_ids)
        return compute_reward(reward_name, text, example["answers"], data_source=example.get("data_source", ""))

    return AgentEnvironment(tokenizer, list(examples), corpus_path, encode_prompt, reward_fn, registry, closers, task)


def pipeline_for(cfg: ml_collections.ConfigDict, examples: list[dict], process_index: int, process_count: int):
    """The prompt pipeline for this host's shard of `examples`."""
    from aepo_jax.data import PromptPipeline

    return PromptPipeline(examples, int(cfg.data.prompts_per_step), seed=int(cfg.seed),
                          process_index=process_index, process_count=process_count, shuffle=bool(cfg.data.shuffle))



