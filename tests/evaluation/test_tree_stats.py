"""The evaluation's tree statistics (`driver._tree_stats`) on scripted ARPO rollouts: the `all` row carries the
rollout calls' counters (tool calls made and their serial chain included), the per-source rows leave them out."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from aepo_jax.agent.loop import AgentLoop, LoopConfig
from aepo_jax.agent.scripted import ByteTokenizer, ScriptedGenerator, tool_use_script
from aepo_jax.evaluation.driver import _tree_stats
from aepo_jax.rollout.stats import compute_stats
from aepo_jax.rollout.strategies import RolloutConfig, rollout

TOK = ByteTokenizer()
# What only the rollout calls know: groups alone would give 0 (or None).
RUN_COUNTERS = {"tool_calls", "serial_tool_calls", "forward_tokens", "decode_tokens", "prefill_tokens",
                "append_tokens", "rounds", "repacks", "branch_decisions", "num_topups", "forward_to_trajectory_ratio",
                "global_budgets"}


class EchoTools:
    def run_many(self, calls):
        return [SimpleNamespace(text=f"{c.tag} says {c.content}", ok=True) for c in calls]


def arpo_batch(num_prompts: int, seed: int):
    loop = AgentLoop(ScriptedGenerator(tool_use_script(TOK, 0.9, max_calls=4), seed=seed), TOK, EchoTools(),
                     LoopConfig(max_tool_calls=4, max_response_tokens=2000, max_context_len=4000))
    return rollout([TOK.encode(f"q{i}") for i in range(num_prompts)], 4, loop=loop,
                   config=RolloutConfig(strategy="arpo", branch_threshold=0.3), rng=np.random.default_rng(seed),
                   key=jax.random.key(seed))


@pytest.fixture(scope="module")
def two_batches():
    return [arpo_batch(3, seed=0), arpo_batch(2, seed=1)]


def test_the_all_row_sums_the_tool_calls_the_batches_made(two_batches):
    (groups, stats), _ = two_batches
    out = _tree_stats([{"data_source": "hotpot"}] * 3, groups, [(0, 0, stats)])
    assert stats.tool_calls > 0 and stats.serial_tool_calls > 0
    assert out["all"]["tool_calls"] == stats.tool_calls
    assert out["all"]["serial_tool_calls"] == stats.serial_tool_calls
    assert out["all"]["forward_tokens"] == stats.forward_tokens > 0


def test_serial_calls_add_up_over_batches_and_take_the_longest_of_a_batchs_parts(two_batches):
    (g0, s0), (g1, s1) = two_batches
    part = dataclasses.replace(s1, serial_tool_calls=s0.serial_tool_calls + 5)  # batch 0's other process
    out = _tree_stats([{"data_source": "hotpot"}] * 5, g0 + g1, [(0, 0, s0), (0, 1, part), (1, 0, s1)])
    assert out["all"]["tool_calls"] == s0.tool_calls + part.tool_calls + s1.tool_calls
    assert out["all"]["serial_tool_calls"] == part.serial_tool_calls + s1.serial_tool_calls


def test_per_source_rows_hold_the_structure_of_their_groups_and_no_counters(two_batches):
    (g0, s0), (g1, s1) = two_batches
    examples = [{"data_source": "hotpot"}] * 3 + [{"data_source": "musique"}] * 2
    out = _tree_stats(examples, g0 + g1, [(0, 0, s0), (1, 0, s1)])
    assert set(out) == {"hotpot", "musique", "all"}
    for name, groups in (("hotpot", g0), ("musique", g1)):
        row = out[name]
        assert RUN_COUNTERS.isdisjoint(row)  # not zeros: they are left out
        want = compute_stats(groups).as_dict()
        np.testing.assert_equal(row, {key: want[key] for key in row})  # NaN where nothing branched
        assert row["num_prompts"] == len(groups) and row["tool_calls_per_trajectory"] > 0
    assert RUN_COUNTERS <= set(out["all"])
