"""AEPO's pre-monitoring inside the main loop run (`AgentLoop.run(premonitor=...)`, `premonitor_overlap`):
each prompt's rollout starts once its own sample has finished, not once every prompt's has."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from aepo_jax.agent.loop import SCHEDULES, AgentLoop, LoopConfig
from aepo_jax.agent.loop_config import LoopResult, RolloutEvent
from aepo_jax.agent.scripted import ByteTokenizer, ScriptedGenerator, ScriptedSegment
from aepo_jax.rollout.critical_path import ToolCallPath, run_tool_path
from aepo_jax.rollout.strategies import (
    EntropyBranchPolicy,
    RolloutConfig,
    premonitor_budget,
    rollout,
)
from tests.rollout.test_critical_path import branch_with_calls, global_with_calls
from tests.rollout.test_rollout_scripted import (
    EchoTools,
    check_branch_prefix,
    check_masks,
)

TOK = ByteTokenizer()
RESULT = TOK.token_to_id("<result>")


def calls_by_prompt_script(ids, rng):
    """A prompt "q<n>" makes n searches, then answers; the first segment has entropy 1, later ones 3
    (so dH = +2 at every decision). Deterministic: it never reads `rng`."""
    calls_wanted = int(TOK.decode(ids).split("q", 1)[1][0])
    made = ids.count(RESULT)
    body = "<search>s</search>" if made < calls_wanted else "<answer>\\boxed{1}</answer>"
    tokens = TOK.encode("<think>x</think>" + body)
    return ScriptedSegment(tokens, [1.0 if made == 0 else 3.0] * len(tokens), "stop")


def make_loop(schedule: str) -> AgentLoop:
    config = LoopConfig(max_tool_calls=6, max_response_tokens=2000, max_context_len=4000, schedule=schedule)
    return AgentLoop(ScriptedGenerator(calls_by_prompt_script), TOK, EchoTools(), config)


PROMPTS = [TOK.encode("q0"), TOK.encode("q4"), TOK.encode("q1")]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_prompt_starts_its_globals_once_its_own_sample_has_finished(schedule):
    """q0 answers at once, q4 searches four times: q0's globals start in round 1, long before q4's sample
    ends; every prompt's globals start in the round its sample finished, as many as `premonitor` said."""
    asked: list[tuple[int, int, bool]] = []
    more = {0: 2, 1: 1, 2: 3}

    def premonitor(sample):
        asked.append((sample.prompt_index, sample.traj_id, sample.finished))
        return more[sample.prompt_index]

    policy = EntropyBranchPolicy(3, 0.2, 100.0, 2)  # tau above any P: no branches, only the start-up under test
    result = make_loop(schedule).run(PROMPTS, 5, 1, rng=np.random.default_rng(0), key=jax.random.key(0),
                                     policy=policy, premonitor=premonitor)
    samples = {p: result.groups[p][0] for p in range(3)}
    assert sorted(asked) == [(p, samples[p].traj_id, True) for p in range(3)]
    assert [e.kind for e in result.events[:3]] == ["premonitor"] * 3
    initial = {p: [e.round for e in result.events if e.kind == "initial" and e.prompt_index == p] for p in range(3)}
    assert {p: len(r) for p, r in initial.items()} == more
    if schedule == "rounds":  # one decode round per segment: calls + 1 segments
        assert initial == {0: [1] * 2, 1: [5], 2: [2] * 3}
    else:  # a tick ends when its tool results are in or not: only the order is fixed
        assert set(initial[0]) == {1} and len(set(initial[2])) == len(set(initial[1])) == 1
        assert initial[0][0] < initial[2][0] < initial[1][0]
    assert all(len(g) == 5 and all(t.finished for t in g) for g in result.groups)
    assert all(t.tool_steps == [] or t.num_tool_calls == int(TOK.decode(t.prompt_ids)[1]) for g in result.groups
               for t in g)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_sample_makes_no_decision_while_it_samples_and_replays_them_after(schedule):
    """m = 1 for every prompt: each sample is its group's only global and every branch grows from its tree.
    Its decisions are drawn one per tool result from the second round after it finished, none before."""
    k = 6
    policy = EntropyBranchPolicy(3, 0.2, 0.1, 2)  # P >= 0.4 > tau: every decision branches while budget lasts
    finished_round = {}

    def premonitor(sample):
        finished_round[sample.prompt_index] = policy.rounds_ended + 1  # asked in the round it finished
        return 0

    result = make_loop(schedule).run(PROMPTS, k, 1, rng=np.random.default_rng(0), key=jax.random.key(0),
                                     policy=policy, premonitor=premonitor)
    if schedule == "rounds":
        assert finished_round == {0: 1, 1: 5, 2: 2}
    for p, group in enumerate(result.groups):
        sample = group[0]
        made = [d for d in policy.log if d["traj_id"] == sample.traj_id]
        if p == 0:  # no tool call: nothing to branch from, so top-ups fill the group
            assert made == [] and sum(e.kind == "topup" for e in result.events if e.prompt_index == 0) == k - 1
            continue
        # Any other global is a top-up, started only once the sample's tree had no active trajectory left.
        kinds = {e.traj_id: e for e in result.events}
        others = [kinds[t.traj_id] for t in group if t.is_global and t is not sample]
        assert all(e.kind == "topup" and e.round > made[-1]["round"] for e in others)
        assert (p == 1) == (others == [])  # q4's four decisions fill its group; q1's one cannot
        # Its globals' first round is the next one; their first decisions, and its own, come in their second.
        # Under `rounds` one per round from then on; under `continuous`, one per round of the prompt's own,
        # which ends when its rows (the sample's branches) have all reached their next tool result.
        first = finished_round[p] + 2
        rounds = [d["round"] for d in made]
        if schedule == "rounds":
            assert rounds == list(range(first, first + len(made)))
        else:
            assert rounds[0] == first and rounds == sorted(set(rounds))
        assert made and sample.lineage and sample.lineage[0]
        assert any(t.parent_id == sample.traj_id for t in group)
        for child in (t for t in group if t.parent_id == sample.traj_id):
            check_branch_prefix(sample, child)
    check_masks([t for g in result.groups for t in g])


def test_premonitor_rejects_what_it_cannot_run():
    loop = make_loop("continuous")
    policy = EntropyBranchPolicy(3, 0.2, 0.5, 2)
    run = {"rng": np.random.default_rng(0), "key": jax.random.key(0)}
    with pytest.raises(ValueError, match="premonitor needs a policy"):
        loop.run(PROMPTS, 4, 1, **run, premonitor=lambda sample: 1)
    with pytest.raises(ValueError, match="premonitor needs a policy"):
        loop.run(PROMPTS, 4, 2, **run, policy=policy, premonitor=lambda sample: 1)
    with pytest.raises(ValueError, match="asked for 4 more globals for prompt 0 with k=4"):
        loop.run(PROMPTS, 4, 1, **run, policy=policy, premonitor=lambda sample: 4)


def test_overlapped_and_sequential_pre_monitoring_give_the_same_groups_without_chance():
    """With no random choice anywhere (deterministic script, no branch can pass tau), both orders must give
    the same budgets and the same trajectories; only when each prompt's globals start differs."""
    config = RolloutConfig(strategy="aepo", branch_threshold=100.0)
    out = {}
    for overlap in (True, False):
        cfg = RolloutConfig(**{**config.__dict__, "premonitor_overlap": overlap})
        out[overlap] = rollout(PROMPTS, 6, loop=make_loop("continuous"), config=cfg, rng=np.random.default_rng(0),
                               key=jax.random.key(0))
    (groups_a, stats_a), (groups_b, stats_b) = out[True], out[False]
    assert stats_a.global_budgets == stats_b.global_budgets == [
        premonitor_budget(g[0], 6, config.beta) for g in groups_b]
    for a, b in zip(groups_a, groups_b, strict=True):
        assert sorted(t.response_ids for t in a) == sorted(t.response_ids for t in b)
        assert [t.is_global for t in a] == [t.is_global for t in b]
    assert stats_a.tool_calls == stats_b.tool_calls
    # q4's chain (sample, then its one more global and top-ups one after another) is the longest either way.
    assert stats_a.serial_tool_calls == stats_b.serial_tool_calls == 4 + 5 * 4


def test_critical_path_starts_a_prompts_globals_and_its_samples_branches_after_the_sample():
    """Prompt 0: sample S (3 calls), global G (2 calls) started after it: chain 3 + 2; branch B of S after
    its 1st result (1 call) is decided once S finished: chain 3 + 1. Prompt 1: sample of 1 call, no more."""
    s = global_with_calls(0, 0, 3)
    other = global_with_calls(1, 1, 1)
    g = global_with_calls(2, 0, 2)
    b = branch_with_calls(3, s, 1, 1)
    events = [RolloutEvent(0, 0, 0, "premonitor", 0), RolloutEvent(0, 1, 1, "premonitor", 0),
              RolloutEvent(4, 0, 2, "initial", 0), RolloutEvent(5, 0, 3, "branch", 1)]
    assert run_tool_path(LoopResult([[s, g, b], [other]], events)) == ToolCallPath(serial=5, total=3 + 1 + 2 + 1)


def long_segment_script(ids, rng):
    """Four searches, then an answer; every segment is about 230 tokens, longer than a continuous tick's
    chunk, and of one entropy (every decision under tau = 0 branches). Deterministic."""
    body = "<search>q</search>" if ids.count(RESULT) < 4 else "<answer>\\boxed{1}</answer>"
    tokens = TOK.encode("<think>" + "r" * 200 + "</think>" + body)
    return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")


@pytest.mark.parametrize("schedule, overlap", [("rounds", False), ("continuous", False), ("continuous", True)])
def test_a_reused_sample_draws_its_decisions_as_its_prompts_globals_do_with_segments_longer_than_a_tick(
        schedule, overlap):
    """k = 8, m = 5: 3 branches per prompt. Each round, the reused sample decides first, then the four
    globals, so the sample's tree gets 1 of the 3 under `rounds`. Under `continuous` a tick decodes one
    64-token chunk of these 230-token segments; a sample paced by ticks drew all its decisions before
    the globals reached theirs and took all 3 (regression)."""
    config = LoopConfig(max_tool_calls=6, max_response_tokens=4000, max_context_len=6000, schedule=schedule)
    assert config.chunk_tokens < 200
    loop = AgentLoop(ScriptedGenerator(long_segment_script), TOK, EchoTools(), config)
    strategy = RolloutConfig(strategy="aepo", branch_threshold=0.0, entropy_weight=0.0, premonitor_overlap=overlap)
    groups, stats = rollout([TOK.encode(f"question {i}?") for i in range(4)], 8, loop=loop, config=strategy,
                            rng=np.random.default_rng(0), key=jax.random.key(0))
    assert stats.global_budgets == [5] * 4
    for group in groups:
        sample = min(group, key=lambda t: t.traj_id)
        branches = [t for t in group if not t.is_global]
        assert len(group) == 8 and len(branches) == 3
        assert sum(t.root_id == sample.traj_id for t in branches) == 1
    check_masks([t for g in groups for t in g])
