"""The composition root's tools: the config's python sandbox, search and browse tools and LLM judge
(`aepo_jax.experiment` builds the run from them)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import ml_collections

# `deterministic` runs: the python tool's wall-clock backstop, in multiples of its CPU-time limit.
DETERMINISTIC_WALL_FACTOR = 10
# The python sandbox keeps an idle worker per tool call the registry runs at once, up to this many (each
# holds an interpreter and the preload modules: about 7 MiB bare, 50 MiB with numpy and sympy).
MAX_PYTHON_POOL = 32


def python_pool_size(cfg: ml_collections.ConfigDict) -> int:
    """Idle python workers: one per call in flight (`rollout.tool_concurrency`), at most `MAX_PYTHON_POOL`.
    A call that finds no idle worker waits for one to start (with numpy and sympy preloaded, about a second)."""
    from aepo_jax.tools.registry import DEFAULT_MAX_WORKERS

    return max(1, min(int(cfg.rollout.get("tool_concurrency", DEFAULT_MAX_WORKERS)), MAX_PYTHON_POOL))


def python_preload(cfg: ml_collections.ConfigDict) -> tuple[str, ...]:
    """`rollout.python_preload` as module names ("numpy,sympy" from the command line is two), each one this
    Python can import: a worker that fails to import one dies, and every python call of the run would then
    come back "killed"."""
    import importlib.util

    value = cfg.rollout.get("python_preload", ()) or ()
    names = [part.strip() for item in ([value] if isinstance(value, str) else value)
             for part in str(item).split(",") if part.strip()]
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package that is not there, or an empty / relative name
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise ValueError(f"rollout.python_preload names modules this Python cannot import: {missing}")
    return tuple(names)


def sandbox_limits(cfg: ml_collections.ConfigDict) -> Any:
    """The python tool's `SandboxLimits`: `rollout.tool_timeout_s` of wall clock, or with
    `cfg.deterministic` of CPU time (counted by the kernel, so a loaded machine cannot turn
    a call that fits into a timeout) under a backstop of `DETERMINISTIC_WALL_FACTOR` times it."""
    from aepo_jax.tools import SandboxLimits

    seconds = float(cfg.rollout.tool_timeout_s)
    if not cfg.get("deterministic", False):  # CPU time up to the same limit (the sandbox's default is 10 s)
        return SandboxLimits(wall_seconds=seconds, cpu_seconds=max(1, math.ceil(seconds)))
    return SandboxLimits(wall_seconds=DETERMINISTIC_WALL_FACTOR * seconds, cpu_seconds=max(1, math.ceil(seconds)))


def tools_from(cfg: ml_collections.ConfigDict, corpus_path: str | None, tokenizer: Any = None
               ) -> tuple[Any, list[Callable[[], None]]]:
    """(tool registry, closers): search (`data.search_url`, else a server started over `corpus_path`,
    else none) with browse over the same server, and the python sandbox, with the config's timeout, result size and search top-k.
    `rollout.tool_latency_ms` > 0 makes the started search server and the sandbox answer no sooner
    than that (benchmarks of tool latency; an external `data.search_url` keeps its own).
    `rollout.tool_concurrency` is how many calls the registry runs at once (and sizes the python pool,
    `python_pool_size`); `rollout.python_preload` (default none) names modules every python worker imports
    before it gets code. Search and browse end by `rollout.tool_timeout_s`, retries included. `tokenizer`:
    the policy's; its added-token strings (`text_control_tokens`, where it has them) are made inert in every
    result (`ToolRegistry`), so a tool's text never becomes a control id (SmolLM2's `<filename>`, ...)."""
    from aepo_jax.servers.process import start_search_server
    from aepo_jax.tools import (
        BrowseTool,
        PythonSandbox,
        PythonTool,
        SearchTool,
        ToolRegistry,
    )
    from aepo_jax.tools.http_client import budget_within
    from aepo_jax.tools.registry import DEADLINE_GRACE_S, DEFAULT_MAX_WORKERS

    closers: list[Callable[[], None]] = []
    tools: dict[str, Any] = {}
    latency_ms = float(cfg.rollout.get("tool_latency_ms", 0))
    search_url = cfg.data.get("search_url") or ""
    if not search_url and corpus_path:
        server = start_search_server(str(corpus_path), latency_ms=latency_ms)
        closers.append(server.stop)
        search_url = server.url
    if search_url:
        http = budget_within(float(cfg.rollout.tool_timeout_s))
        tools["search"] = SearchTool(search_url, topk=int(cfg.rollout.search_topk),
                                     max_result_chars=int(cfg.rollout.max_result_chars), timeout=http.timeout,
                                     retries=http.retries, total_seconds=http.total_seconds)
        # A search result's document, read whole by its id from the same server (`GET /doc/{id}`), and with
        # `rollout.browse_urls` any http(s) page (that needs internet).
        result_chars = int(cfg.rollout.max_result_chars)  # the window shown is the whole result, not its start
        tools["browse"] = BrowseTool(search_url, window_chars=result_chars, max_result_chars=result_chars,
                                     allow_urls=bool(cfg.rollout.get("browse_urls", False)), timeout=http.timeout,
                                     retries=http.retries, deadline_seconds=http.total_seconds)
    limits = sandbox_limits(cfg)
    sandbox = PythonSandbox(limits, pool_size=python_pool_size(cfg),
                            preload=python_preload(cfg),
                            latency_seconds=latency_ms / 1000.0)
    closers.append(sandbox.close)
    tools["python"] = PythonTool(sandbox, max_result_chars=int(cfg.rollout.max_result_chars))
    # The tools' own limits come first (the sandbox's wall clock, search's read timeouts); the registry's
    # deadline is the backstop for a call stuck past them (a server trickling bytes), so no call hangs a rollout.
    # It waits past the longest of them: with `deterministic` the sandbox's wall clock is a backstop of
    # DETERMINISTIC_WALL_FACTOR x the timeout, which a deadline of timeout + grace cut short.
    longest_s = max(float(cfg.rollout.tool_timeout_s), float(limits.wall_seconds)) + latency_ms / 1000.0
    registry = ToolRegistry(tools, max_workers=int(cfg.rollout.get("tool_concurrency", DEFAULT_MAX_WORKERS)),
                            deadline_s=longest_s + DEADLINE_GRACE_S, inert_tokens=inert_tokens(tokenizer))
    closers.append(registry.close)
    return registry, closers


def judge_from(cfg: ml_collections.ConfigDict) -> Any:
    """The `llm_judge` reward's judge (spec §5), or None when `reward.judge_url` is empty.

    An `aepo_jax.tools.LLMJudgeClient` on `reward.judge_url` asking `reward.judge_model`, with
    `reward.judge_max_tokens`; its API key is read from the environment variable that
    `reward.judge_api_key_env` names (the config, saved with every run, holds only that name).
    """
    from aepo_jax.tools import LLMJudgeClient
    from aepo_jax.tools.llm_judge import DEFAULT_MAX_TOKENS

    r = cfg.reward
    url = r.get("judge_url", "") or ""
    if not url:
        return None
    model = r.get("judge_model", "") or ""
    if not model:
        raise ValueError(f"reward.judge_url={url!r} needs reward.judge_model (the model name the server serves)")
    key_name = r.get("judge_api_key_env", "") or ""
    api_key = os.environ.get(key_name) if key_name else None
    if key_name and not api_key:
        raise ValueError(f"reward.judge_api_key_env={key_name!r}: the environment variable {key_name} that "
                         "should hold the judge's API key is not set")
    return LLMJudgeClient(url, model, api_key=api_key,
                          max_tokens=int(r.get("judge_max_tokens", DEFAULT_MAX_TOKENS)))


def inert_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's added-token strings (`HFTokenizer.text_control_tokens`); none for one without them
    (SentencePiece keeps typed special tokens as text)."""
    control_tokens = getattr(tokenizer, "text_control_tokens", None)
    return tuple(control_tokens()) if control_tokens is not None else ()
