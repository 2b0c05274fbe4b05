"""Budget invariants, the AEPO penalty and the branch-concentration claim, driven by scripted entropy streams."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aepo_jax.agent.loop import SCHEDULES, AgentLoop, LoopConfig
from aepo_jax.agent.scripted import (
    ByteTokenizer,
    ScriptedGenerator,
    ScriptedSegment,
    tool_use_script,
)
from aepo_jax.agent.trajectory import Trajectory
from aepo_jax.rollout.branching import (
    branch_probability,
    consecutive_branch_penalty,
    decide_branch,
)
from aepo_jax.rollout.budget import global_sample_budget, premonitor_tool_entropy
from aepo_jax.rollout.strategies import (
    EntropyBranchPolicy,
    RolloutConfig,
    premonitor_budget,
    rollout,
)
from tests.property_budget import examples

TOK = ByteTokenizer()


class EchoTools:
    """Answers every call with its own content (the loop's bookkeeping is what is under test here)."""

    def run_many(self, calls):
        return [SimpleNamespace(text=f"{c.tag} says {c.content}", ok=True) for c in calls]


def make_loop(script, seed=0, **limits) -> AgentLoop:
    config = LoopConfig(**{"max_tool_calls": 6, "max_response_tokens": 2000, "max_context_len": 4000, **limits})
    return AgentLoop(ScriptedGenerator(script, seed=seed), TOK, EchoTools(), config)


def prompts(n: int) -> list[list[int]]:
    return [TOK.encode(f"question number {i}?") for i in range(n)]


# ----- the pre-monitoring budget formula ------------------------------------------------------


def reference_budget(k, h_root, h_tool, beta):
    sig = 1.0 / (1.0 + np.exp(-np.float64(beta * (h_root - h_tool))))
    return int(np.clip(np.floor(k * sig) + 1, 1, k))


@given(
    k=st.integers(1, 64),
    h_root=st.floats(0, 12),
    h_tool=st.floats(0, 12),
    beta=st.floats(0.01, 5),
)
def test_global_budget_matches_float64_reference(k, h_root, h_tool, beta):
    assert global_sample_budget(k, h_root, h_tool, beta) == reference_budget(k, h_root, h_tool, beta)


@pytest.mark.parametrize("k", [1, 2, 7, 12, 16])
def test_global_budget_at_its_edges(k):
    # Equal entropies: sigmoid(0) = 1/2.
    assert global_sample_budget(k, 1.3, 1.3) == min(k // 2 + 1, k)
    # Much more uncertainty in the question: all k global.
    assert global_sample_budget(k, 1e6, 0.0) == k
    assert global_sample_budget(k, 60.0, 0.0) == k
    # Much more uncertainty in tool feedback: one global, k - 1 branch budget.
    assert global_sample_budget(k, 0.0, 1e6) == 1
    # No tool call in the pre-monitoring trajectory: H_tool_mean = H_root.
    assert premonitor_tool_entropy(0.7, []) == 0.7
    assert global_sample_budget(k, 0.7, premonitor_tool_entropy(0.7, [])) == min(k // 2 + 1, k)
    with pytest.raises(ValueError, match="k must be"):
        global_sample_budget(0, 1.0, 1.0)
    with pytest.raises(ValueError, match="finite"):
        global_sample_budget(k, float("nan"), 1.0)


@pytest.mark.parametrize("field, value, message", [
    ("beta", float("inf"), "beta must be a finite number"),  # inf * 0 was NaN and crashed mid-rollout
    ("beta", -0.5, "beta must be >= 0"),  # reversed the budget's direction silently
    ("entropy_weight", float("nan"), "entropy_weight must be a finite number"),
    ("entropy_weight", -0.2, "entropy_weight must be >= 0"),  # reversed the branching direction silently
    ("branch_threshold", float("inf"), "branch_threshold must be a finite number"),
    ("penalty_slope", float("nan"), "penalty_slope must be a finite number"),
])
def test_rollout_config_refuses_budget_and_branch_weights_out_of_range(field, value, message):
    with pytest.raises(ValueError, match=message):
        RolloutConfig(**{field: value})


def test_premonitor_budget_reads_root_and_tool_segments():
    script_entropies = iter([3.0, 1.0, 0.5, 2.0])  # root segment, then three tool-result segments

    def script(ids, rng):
        calls = ids.count(TOK.token_to_id("<result>"))
        text = "<search>x</search>" if calls < 3 else "<answer>\\boxed{1}</answer>"
        tokens = TOK.encode(text)
        return ScriptedSegment(tokens, [next(script_entropies)] * len(tokens), "stop")

    loop = make_loop(script)
    (traj,), = loop.run(prompts(1), 1, 1, rng=np.random.default_rng(0), key=jax.random.key(0)).groups
    assert [s.entropy for s in traj.segments] == [3.0, 1.0, 0.5, 2.0]
    assert [s.after_tool for s in traj.segments] == [False, True, True, True]
    expected = reference_budget(12, 3.0, (1.0 + 0.5 + 2.0) / 3, 0.5)
    assert premonitor_budget(traj, 12, 0.5) == expected


# ----- budget invariants over random entropy streams and parameters ---------------------------


@settings(max_examples=examples(60), suppress_health_check=[HealthCheck.too_slow])
@given(
    strategy=st.sampled_from(["arpo", "aepo"]),
    num_prompts=st.integers(1, 3),
    k=st.integers(1, 12),
    width=st.integers(2, 4),
    tau=st.floats(0.0, 1.2),
    gamma=st.floats(0.0, 2.0),
    reuse=st.booleans(),
    scope=st.sampled_from(["lineage", "prompt"]),
    tool_probability=st.floats(0.0, 1.0),
    entropy_scale=st.floats(0.0, 6.0),
    seed=st.integers(0, 2**16),
    schedule=st.sampled_from(SCHEDULES),
)
def test_budget_invariants(strategy, num_prompts, k, width, tau, gamma, reuse, scope, tool_probability,
                           entropy_scale, seed, schedule):
    script = tool_use_script(TOK, tool_probability, max_calls=4, entropy=lambda r: r.uniform(0, entropy_scale + 1e-9))
    loop = make_loop(script, seed=seed, schedule=schedule)
    config = RolloutConfig(strategy=strategy, branch_width=width, branch_threshold=tau, entropy_weight=gamma,
                           premonitor_reuse=reuse, penalty_scope=scope)
    groups, stats = rollout(prompts(num_prompts), k, loop=loop, config=config, rng=np.random.default_rng(seed),
                            key=jax.random.key(seed))
    assert len(groups) == num_prompts
    for i, group in enumerate(groups):
        assert len(group) == k and all(t.finished for t in group)
        assert all(t.prompt_index == i for t in group)
        m = stats.global_budgets[i] if strategy == "aepo" else config.initial_for(k)
        branches = [t for t in group if not t.is_global]
        assert len(branches) <= k - m
        ids = {t.traj_id: t for t in group}
        assert len(ids) == k
        for child in branches:
            check_branch_prefix(ids[child.parent_id], child)
    check_masks([t for g in groups for t in g])
    assert stats.num_global + stats.num_branch == num_prompts * k
    assert stats.trajectories_per_prompt == k


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_topups_start_only_when_a_prompt_has_no_active_trajectory(schedule):
    # tau > 1 + gamma * max dH: never branch, so a prompt with m < k must be topped up.
    script = tool_use_script(TOK, 0.8, max_calls=3)
    loop = make_loop(script, seed=3, schedule=schedule)
    config = RolloutConfig(strategy="arpo", initial_rollouts=2, branch_threshold=100.0)
    _, stats = rollout(prompts(3), 6, loop=loop, config=config, rng=np.random.default_rng(3),
                      key=jax.random.key(3))
    assert stats.num_branch == 0 and stats.num_topups == 3 * 4
    # Replay with the loop directly to see the events.
    main = make_loop(script, seed=3, schedule=schedule).run(
        prompts(3), 6, 2, rng=np.random.default_rng(3), key=jax.random.key(3), policy=EntropyBranchPolicy(3, 0.2, 100.0, 2))
    topups = [e for e in main.events if e.kind == "topup"]
    assert len(topups) == 12 and all(e.active_before == 0 for e in topups)
    # One new global per prompt per round at most.
    rounds = [(e.round, e.prompt_index) for e in topups]
    assert len(rounds) == len(set(rounds))


def check_branch_prefix(parent: Trajectory, child: Trajectory) -> None:
    bp = child.branch_point
    assert bp in parent.tool_result_ends
    assert child.prompt_ids == parent.prompt_ids and child.root_id == parent.root_id
    assert child.response_ids[:bp] == parent.response_ids[:bp]
    assert child.mask[:bp] == parent.mask[:bp]
    assert child.logp_old[:bp] == parent.logp_old[:bp]
    assert child.entropy[:bp] == parent.entropy[:bp]
    assert child.h_init == parent.h_init
    # The child's decisions are the parent's up to the branch point, ending with the fork it was born from
    # (spec 2.3: the penalty counts along the chain of branch points from the root).
    prefix = [d for d in parent.decisions if d[0] <= bp]
    assert prefix and prefix[-1] == (bp, True), (parent.decisions, bp)
    assert child.decisions[:len(prefix)] == prefix, (child.decisions, prefix)


def check_masks(trajs: list[Trajectory]) -> None:
    """mask 0 exactly on tool-result spans, which decode to formatted results; 1 elsewhere."""
    for t in trajs:
        expected = [1] * len(t.response_ids)
        for step in t.tool_steps:
            expected[step.result_start:step.result_end] = [0] * (step.result_end - step.result_start)
            text = TOK.decode(t.response_ids[step.result_start:step.result_end])
            assert text == " <result>\n" + step.result_text + "\n</result>"
        assert t.mask == expected
        assert len(t.logp_old) == len(t.entropy) == len(t.response_ids)
        assert all(t.logp_old[i] == 0.0 for i, m in enumerate(t.mask) if m == 0)


# ----- the consecutive-branch penalty ---------------------------------------------------------


def test_penalty_formula_values():
    for l in range(30):
        assert consecutive_branch_penalty(l, 0.05) == pytest.approx(max(0.0, 1 - 0.05 * l))
    assert branch_probability(0.3, 0.5, 0.2, 4, 0.05) == pytest.approx((0.3 + 0.1) * 0.8)
    assert branch_probability(0.3, 0.5, 0.2) == pytest.approx(0.4)  # ARPO
    with pytest.raises(ValueError, match="consecutive"):
        consecutive_branch_penalty(-1, 0.05)


def test_a_probability_equal_to_the_threshold_branches():
    """Spec 2.2: "branch iff P >= tau" (the boundary, not P > tau)."""
    alpha = float(np.random.default_rng(3).uniform(0.0, 1.0))
    p = branch_probability(alpha, 0.5, 0.2, 2, 0.05)
    assert decide_branch(np.random.default_rng(3), 0.5, 0.2, p, 2, 0.05) == (True, p)
    assert decide_branch(np.random.default_rng(3), 0.5, 0.2, np.nextafter(p, 2.0), 2, 0.05) == (False, p)


def test_arpo_starts_half_the_budget_as_global_samples_by_default():
    """Spec 2.2: "`initial_rollouts`, default `k/2`" (at least one); every config sets it explicitly."""
    assert [RolloutConfig(strategy="arpo").initial_for(k) for k in (1, 2, 3, 8, 9, 16)] == [1, 1, 1, 4, 4, 8]
    assert RolloutConfig(strategy="arpo", initial_rollouts=3).initial_for(8) == 3


def rising_entropy_script(max_calls: int):
    """First segment entropy 0, every later segment 10: dH = +10 at every decision."""

    def script(ids, rng):
        calls = ids.count(TOK.token_to_id("<result>"))
        text = "<search>q</search>" if calls < max_calls else "<answer>\\boxed{1}</answer>"
        tokens = TOK.encode(text)
        return ScriptedSegment(tokens, [0.0 if calls == 0 else 10.0] * len(tokens), "stop")

    return script


def test_lineage_penalty_equals_formula_at_each_consecutive_branching():
    # gamma * dH = 2, so P = (alpha + 2) * max(0, 1 - 0.3 l) >= 0.5 for l <= 2 and < 0.5 at l = 3:
    # the root's decisions must read branch, branch, branch, no-branch, branch, ...
    slope, gamma, tau, seed = 0.3, 0.2, 0.5, 11
    loop = make_loop(rising_entropy_script(8), max_tool_calls=8)
    config = RolloutConfig(strategy="aepo", dynamic_budget=False, initial_rollouts=1, penalty_slope=slope,
                           entropy_weight=gamma, branch_threshold=tau)
    policy_rng = np.random.default_rng(seed)
    groups, stats = rollout(prompts(1), 64, loop=loop, config=config, rng=policy_rng, key=jax.random.key(0))
    root = next(t for t in groups[0] if t.is_global and t.traj_id == 0)
    assert root.lineage == [True, True, True, False, True, True, True, False]
    # Every logged decision's P equals the formula with the replayed alpha draws.
    alphas = np.random.default_rng(seed).uniform(0.0, 1.0, size=stats.branch_decisions)
    log = loop_decisions(loop, config, seed)
    assert len(log) == stats.branch_decisions
    for alpha, d in zip(alphas, log, strict=True):
        assert d["entropy_change"] == 10.0
        assert d["probability"] == pytest.approx((alpha + gamma * 10.0) * max(0.0, 1 - slope * d["consecutive"]))
        assert d["branched"] == (d["probability"] >= tau)
    assert stats.longest_branch_run == 3


def loop_decisions(loop, config, seed):
    """Re-run the same rollout through the loop with a policy object we keep, to read its log."""
    policy = EntropyBranchPolicy(1, config.entropy_weight, config.branch_threshold, config.branch_width,
                                 config.penalty_slope, config.penalty_scope)
    fresh = make_loop(rising_entropy_script(8), max_tool_calls=8)
    fresh.run(prompts(1), 64, 1, rng=np.random.default_rng(seed), key=jax.random.key(0), policy=policy)
    return policy.log


def test_prompt_scope_counts_rounds_with_new_trajectories():
    policy = EntropyBranchPolicy(1, 0.2, 0.5, 2, 0.3, "prompt")
    loop = make_loop(rising_entropy_script(6), max_tool_calls=6)
    result = loop.run(prompts(1), 64, 1, rng=np.random.default_rng(5), key=jax.random.key(0), policy=policy)
    rounds_with_new = {e.round for e in result.events if e.round >= 1}
    assert policy.log
    for d in policy.log:
        expected, r = 0, d["round"] - 1
        while r >= 1 and r in rounds_with_new:
            expected, r = expected + 1, r - 1
        assert d["consecutive"] == expected
        assert d["probability"] <= (1.0 + 2.0) * max(0.0, 1 - 0.3 * expected) + 1e-12
    assert max(d["consecutive"] for d in policy.log) >= 2


def test_prompt_scope_counter_counts_a_top_up_round():
    """Spec 2.3, prompt scope: "+1 after each round in which the prompt got any new trajectory, top-ups
    included". One global at a time and tau = 100 (never a branch): the only new trajectories are top-ups,
    and with decisions drawn before the call (the release variant) one follows a top-up round directly.
    The earlier test's rounds all had branches, so a counter blind to top-ups passed it. (`before_call` runs
    under the rounds schedule only; the continuous schedule's counter is checked equal to it elsewhere.)"""
    def script(ids, rng):
        body = "<search>s</search>" if ids.count(TOK.token_to_id("<result>")) < 2 else "<answer>\\boxed{1}</answer>"
        tokens = TOK.encode("<think>x</think>" + body)
        return ScriptedSegment(tokens, [1.0] * len(tokens), "stop")

    policy = EntropyBranchPolicy(1, 0.2, 100.0, 2, 0.05, "prompt")
    loop = make_loop(script, max_tool_calls=6, decision_entropy="before_call")
    result = loop.run(prompts(1), 3, 1, rng=np.random.default_rng(0), key=jax.random.key(0), policy=policy)
    top_up_rounds = {e.round for e in result.events if e.kind == "topup"}
    assert top_up_rounds and not any(d["branched"] for d in policy.log)
    for d in policy.log:
        assert d["consecutive"] == (1 if d["round"] - 1 in top_up_rounds else 0), (d, top_up_rounds)
    assert any(d["consecutive"] == 1 for d in policy.log)


def long_rising_entropy_script(max_calls: int):
    """`rising_entropy_script` with every segment about 130 tokens: longer than a continuous tick's chunk."""

    def script(ids, rng):
        calls = ids.count(TOK.token_to_id("<result>"))
        body = "<search>q</search>" if calls < max_calls else "<answer>\\boxed{1}</answer>"
        tokens = TOK.encode("<think>" + "r" * 100 + "</think>" + body)
        return ScriptedSegment(tokens, [0.0 if calls == 0 else 10.0] * len(tokens), "stop")

    return script


@pytest.mark.parametrize("schedule, max_segment_tokens", [("rounds", None), ("rounds", 40), ("continuous", None)])
def test_prompt_scope_counter_grows_while_every_round_branches_even_when_a_segment_spans_ticks(
        schedule, max_segment_tokens):
    """One root, P = (alpha + 2)(1 - 0.05 l) >= 0.5 always (l <= 6 here), so every decision branches and
    every round of the prompt gets new trajectories: the counter never resets. Under `continuous` a
    segment spans two or three ticks, and under `rounds` with 40-token segments, rounds; a counter ended
    at each of them reset to 0 after those that made no branch (regression: l read 0, 0, 1, 0, 0, ...)."""
    policy = EntropyBranchPolicy(1, 0.2, 0.5, 2, 0.05, "prompt")
    loop = make_loop(long_rising_entropy_script(4), max_tool_calls=4, max_response_tokens=4000,
                     max_context_len=6000, schedule=schedule, max_segment_tokens=max_segment_tokens)
    loop.run(prompts(1), 16, 1, rng=np.random.default_rng(5), key=jax.random.key(0), policy=policy)
    counters = [d["consecutive"] for d in policy.log]
    assert all(d["branched"] for d in policy.log) and len(counters) == 15
    assert counters[0] == 0 and counters == sorted(counters) and counters[-1] >= 4


def test_reused_premonitoring_trajectory_branches_like_a_global():
    """Rising entropy gives m = 1: the reused pre-monitoring sample is the only global, so every branch
    must grow from it, its decisions drawn one per tool result (regression: it could never branch, and
    a top-up global started at once)."""
    k = 8
    config = RolloutConfig(strategy="aepo", premonitor_reuse=True)
    groups, stats = rollout(prompts(2), k, loop=make_loop(rising_entropy_script(3), max_tool_calls=3), config=config,
                            rng=np.random.default_rng(0), key=jax.random.key(0))
    assert stats.global_budgets == [1, 1]
    for group in groups:
        reused = min(group, key=lambda t: t.traj_id)
        assert reused.is_global and reused.num_tool_calls == 3
        assert reused.lineage and reused.lineage[0]  # it was asked at its first tool result, and forked
        assert [d[0] for d in reused.decisions] == reused.tool_result_ends[: len(reused.decisions)]
        assert any(t.parent_id == reused.traj_id for t in group)
        assert all(t.root_id == reused.root_id for t in group if not t.is_global)
        for child in (t for t in group if t.parent_id == reused.traj_id):
            check_branch_prefix(reused, child)
    main_events = [e for e in loop_events(config, k) if e.round == 0]
    assert all(e.kind == "initial" for e in main_events)  # no top-up before the reused global had its say


def loop_events(config, k):
    """The main run's events of the rollout above, replayed through the loop with the same pre-run."""
    loop = make_loop(rising_entropy_script(3), max_tool_calls=3)
    pre = loop.run(prompts(2), 1, 1, rng=np.random.default_rng(0), key=jax.random.key(1))
    policy = EntropyBranchPolicy(2, config.entropy_weight, config.branch_threshold, config.branch_width,
                                 config.penalty_slope, config.penalty_scope)
    return loop.run(prompts(2), k, 0, rng=np.random.default_rng(0), key=jax.random.key(2), policy=policy,
                    existing=pre.groups).events


# ----- the paper's diagnosis: a few lineages stay uncertain (benchmarks.branch_scenarios) ----------


def test_few_uncertain_lineages_scenario_and_what_the_penalty_does_there():
    """Seeded groups of k = 16 where a quarter of the roots meet consecutive high-entropy tool steps.

    The scenario is what the paper diagnoses (checked: P is not saturated, and
    uncertain trees take more than their share of ARPO's branches). At equal
    budget (m = k/2), the lineage-scope penalty at slope 0.3 shortens the runs
    of consecutive branchings and spreads branches over more roots; the margins
    asserted are about half of what 24 seeds measure (benchmarks/branch_scenario.py,
    docs/demo.md). At the spec's slope 0.05 the penalty changes almost nothing
    here, so nothing is asserted for it.
    """
    from benchmarks.branch_scenarios import Scenario, measure

    seeds, half = 6, "aepo penalty only (lineage, slope 0.3)"
    results = measure(seeds, k=16, num_prompts=4, names=["arpo", half])
    arpo, penalty = results["arpo"], results[half]
    assert 0.35 < np.mean(arpo["branch_rate"]) < 0.75  # P is not saturated
    assert np.mean(arpo["uncertain_tree_share"]) > Scenario().uncertain_fraction + 0.05
    assert arpo["num_branch"] == penalty["num_branch"] == [8.0] * seeds  # equal budget, all of it used
    run = np.subtract(penalty["mean_lineage_branch_run"], arpo["mean_lineage_branch_run"])
    spread = np.subtract(penalty["effective_branch_roots"], arpo["effective_branch_roots"])
    assert run.mean() < -0.03 and spread.mean() > 0.1


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_aepo_with_pre_monitoring_ignores_a_fixed_initial_rollouts_above_k(schedule):
    """Pre-monitoring sets m, so the fixed m (the base config's 6) is unused and must not stop a run with
    k = 4 (regression: "initial_rollouts=6 exceeds k=4"); without pre-monitoring it is the m, and too many."""
    loop = make_loop(rising_entropy_script(2), schedule=schedule)
    run = {"loop": loop, "rng": np.random.default_rng(0), "key": jax.random.key(0)}
    groups, stats = rollout(prompts(2), 4, config=RolloutConfig(strategy="aepo", initial_rollouts=6), **run)
    assert [len(g) for g in groups] == [4, 4] and all(1 <= m <= 4 for m in stats.global_budgets)
    with pytest.raises(ValueError, match="initial_rollouts=6 exceeds k=4"):
        rollout(prompts(2), 4, config=RolloutConfig(strategy="aepo", initial_rollouts=6, dynamic_budget=False), **run)


def segment_numbered_entropy_script(max_calls: int):
    """Segment j of a row (j tool results before it) has entropy 1 + j on every token."""
    result_id = TOK.token_to_id("<result>")

    def script(ids, rng):
        calls = ids.count(result_id)
        body = "<search>q</search>" if calls < max_calls else "<answer>\\boxed{1}</answer>"
        tokens = TOK.encode("<think>r</think>" + body)
        return ScriptedSegment(tokens, [1.0 + calls] * len(tokens), "stop")

    return script


@pytest.mark.parametrize("decision_entropy", ["after_result", "before_call"])
def test_decision_entropy_reads_the_segment_after_the_result_or_the_one_that_made_the_call(decision_entropy):
    """Spec 2.2 reads the K tokens generated after tool result j (segment j + 1); the released code (spec 7.1)
    reads the segment that ended with the call (segment j), in the round of the call, and its branches start
    in the next round beside their parent. The root's H_init is its segment 0 (entropy 1)."""
    policy = EntropyBranchPolicy(1, 0.2, 0.5, 2)
    loop = make_loop(segment_numbered_entropy_script(4), max_tool_calls=4, decision_entropy=decision_entropy)
    result = loop.run(prompts(1), 64, 1, rng=np.random.default_rng(3), key=jax.random.key(0), policy=policy)
    root = [d for d in policy.log if d["traj_id"] == 0]
    assert len(root) == 4  # one decision per tool result
    offset = 1 if decision_entropy == "after_result" else 0
    assert [d["entropy_change"] for d in root] == [float(j + offset) for j in range(4)]
    # Result j of the root is appended in round j + 1; its decision comes one round later after the result.
    assert [d["round"] for d in root] == [j + 1 + offset for j in range(4)]
    trajs = {t.traj_id: t for t in result.groups[0]}
    for event in result.events:
        if event.kind == "branch" and trajs[event.traj_id].parent_id == 0:
            child, parent = trajs[event.traj_id], trajs[0]
            assert child.response_ids[: child.branch_point] == parent.response_ids[: child.branch_point]
            assert child.branch_point in {s.result_end for s in parent.tool_steps}


def test_before_call_decisions_and_batch_counters_run_under_rounds_only():
    with pytest.raises(ValueError, match="decision_entropy='before_call'.*schedule='rounds' only"):
        LoopConfig(decision_entropy="before_call", schedule="continuous")
    loop = make_loop(segment_numbered_entropy_script(2), schedule="continuous")
    config = RolloutConfig(strategy="aepo", dynamic_budget=False, counter_updates="batch_branched")
    with pytest.raises(ValueError, match="counter_updates='batch_branched'.*schedule='rounds' only"):
        rollout(prompts(1), 4, loop=loop, config=config, rng=np.random.default_rng(0), key=jax.random.key(0))
    with pytest.raises(ValueError, match="unknown counter_updates"):
        RolloutConfig(counter_updates="sometimes")


def test_batch_branched_counters_hold_through_rounds_in_which_no_prompt_got_a_trajectory():
    """The released code moves the prompt counters only `if new_inputs:` (spec 7.1): a round in which no
    prompt of the batch got a trajectory leaves every counter as it was, where every round resets it to 0."""
    every = EntropyBranchPolicy(2, 0.2, 0.5, 2, 0.05, "prompt")
    released = EntropyBranchPolicy(2, 0.2, 0.5, 2, 0.05, "prompt", counter_updates="batch_branched")
    for new in ([1, 1], [1, 0], [0, 0], [2, 0], [None, 0], [0, 0]):
        every.end_round(new)
        released.end_round(new)
        if new == [1, 0]:
            assert every.prompt_counters == released.prompt_counters == [2, 0]
    assert every.prompt_counters == [0, 0]
    # [0, 0] held both; [2, 0] moved them (prompt 0 up, prompt 1 reset); [None, 0] held (no prompt grew).
    assert released.prompt_counters == [3, 0]
    assert every.rounds_ended == released.rounds_ended == 6
