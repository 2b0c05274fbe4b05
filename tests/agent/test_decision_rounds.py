"""Branch decisions under `continuous` come in the lockstep rounds they would fall in: a row whose tool is
slow neither loses the prompt's branch budget to faster rows nor freezes the prompt-scope counter."""

from __future__ import annotations

import hashlib
import itertools
import time
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from aepo_jax.agent.loop import AgentLoop, LoopConfig
from aepo_jax.agent.scripted import ByteTokenizer, ScriptedGenerator, ScriptedSegment
from aepo_jax.rollout.strategies import EntropyBranchPolicy

TOK = ByteTokenizer()
RESULT = TOK.token_to_id("<result>")
SLOW_SECONDS = 0.3


class SearchTool:
    """Answers every search at once except `slow`, which takes SLOW_SECONDS."""

    max_workers = 8

    def run_many(self, calls):
        for call in calls:
            if call.content == "slow":
                time.sleep(SLOW_SECONDS)
        return [SimpleNamespace(text="found", ok=True) for _ in calls]


def segment(text: str, entropy: float) -> ScriptedSegment:
    ids = TOK.encode(text)
    return ScriptedSegment(ids, [entropy] * len(ids), "stop")


def script_for(fast_root_answers_at_once: bool):
    """Root 0 searches `fast`, root 1 `slow`; then every row searches `fast` until its fourth result and
    answers. Entropy 0 before the first result (H_init) and 1 after, so a decision branches with a
    probability set by its uniform draw: the decisions' order decides who branches."""
    first = itertools.count()

    def script(ids: list[int], rng: np.random.Generator) -> ScriptedSegment:
        results = ids.count(RESULT)
        if results == 0:
            return segment(f"<think>a</think><search>{'fast' if next(first) == 0 else 'slow'}</search>", 0.0)
        if results >= 4 or (fast_root_answers_at_once and "fast</search>" in TOK.decode(ids[:ids.index(RESULT)])):
            return segment("<think>b</think><answer>\\boxed{1}</answer>", 1.0)
        return segment("<think>b</think><search>fast</search>", 1.0)

    return script


def run(schedule: str, scope: str, fast_root_answers_at_once: bool):
    policy = EntropyBranchPolicy(1, 0.2, 0.5, 2, 0.05, scope)
    config = LoopConfig(max_tool_calls=6, max_response_tokens=2000, max_context_len=4000, schedule=schedule,
                        chunk_tokens=64, entropy_tokens=8)
    loop = AgentLoop(ScriptedGenerator(script_for(fast_root_answers_at_once)), TOK, SearchTool(), config)
    result = loop.run([TOK.encode("q?")], 16, 2, rng=np.random.default_rng(3), key=jax.random.key(0), policy=policy)
    decisions = [(d["traj_id"], d["consecutive"], round(d["probability"], 9), d["branched"]) for d in policy.log]
    (group,) = result.groups
    per_root = {root: sum(1 for t in group if not t.is_global and t.root_id == root) for root in (0, 1)}
    return decisions, per_root, len(group)


@pytest.mark.parametrize("scope", ["lineage", "prompt"])
@pytest.mark.parametrize("fast_root_answers_at_once", [False, True])
def test_continuous_draws_the_decisions_rounds_draws_whatever_the_tool_latency(scope, fast_root_answers_at_once):
    """Same decisions in the same order (same uniforms, counters, branches) as the lockstep rounds, although
    root 1's first search returns SLOW_SECONDS after root 0's (and, in one case, root 0 has already
    answered: its decision waits with its finished row)."""
    rounds = run("rounds", scope, fast_root_answers_at_once)
    continuous = run("continuous", scope, fast_root_answers_at_once)
    assert continuous == rounds
    decisions, per_root, size = continuous
    assert size == 16 and per_root[1] > 0
    assert any(traj_id == 1 for traj_id, *_ in decisions[:2])  # the slow root decides in the first round
    if scope == "prompt":
        assert max(consecutive for _, consecutive, _, _ in decisions) >= 2  # the counter moves


class HashedLatencyTool:
    """Searches that take 0-24 ms, fixed by their query."""

    max_workers = 4

    def run_many(self, calls):
        for call in calls:
            time.sleep((int(hashlib.md5(call.content.encode()).hexdigest(), 16) % 7) * 0.004)
        return [SimpleNamespace(text="r" * (len(call.content) % 5 + 1), ok=True) for call in calls]


def hashed_script(ids: list[int], rng: np.random.Generator) -> ScriptedSegment:
    """Each row's next segment fixed by its ids: thoughts of 1-11 letters, searches or an answer."""
    draw = np.random.default_rng(int(hashlib.md5(str((16, ids)).encode()).hexdigest(), 16) % 2**32)
    think = "<think>" + "t" * int(draw.integers(1, 12)) + "</think>"
    entropy = float(draw.uniform(0, 2))
    if ids.count(RESULT) < 5 and draw.uniform() < 0.75:
        return segment(f"{think}<search>q{int(draw.integers(100))}</search>", entropy)
    return segment(think + "<answer>\\boxed{1}</answer>", entropy)


def test_a_top_up_starts_after_the_round_its_prompts_last_row_finished_in():
    """k = 4 from one global in a 40-token budget: each top-up is made once the last row has finished, which
    can be after that round's decisions were drawn (they need only K tokens). The prompt-scope counter reads
    the same at every top-up's decision as under `rounds` (found by a randomised comparison of the two
    schedules: it read one round ahead, 1 where `rounds` reads 0)."""
    decisions = {}
    for schedule in ("rounds", "continuous"):
        policy = EntropyBranchPolicy(1, 0.2, 0.5, 2, 0.05, "prompt")
        config = LoopConfig(max_tool_calls=2, max_response_tokens=40, max_context_len=46, schedule=schedule,
                            chunk_tokens=8, entropy_tokens=4)
        loop = AgentLoop(ScriptedGenerator(hashed_script), TOK, HashedLatencyTool(), config)
        loop.run([TOK.encode("q1?")], 4, 1, rng=np.random.default_rng(16), key=jax.random.key(0), policy=policy)
        decisions[schedule] = [(d["traj_id"], d["consecutive"], round(d["probability"], 9), d["branched"])
                               for d in policy.log]
    assert decisions["continuous"] == decisions["rounds"]
    assert len(decisions["rounds"]) >= 2 and {traj_id for traj_id, *_ in decisions["rounds"]} != {0}
