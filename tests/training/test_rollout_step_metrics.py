"""The `rollout/*` metrics of an RL step are those of the whole step: with several processes each
statistic is what `compute_stats` gives on the union of every process's groups (not a mean of the
processes' statistics); with DAPO dynamic sampling the tree statistics are those of the groups kept
and trained, the work counters those of every rollout of the step."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from aepo_jax.agent.loop import AgentLoop, LoopConfig
from aepo_jax.agent.scripted import ByteTokenizer, ScriptedGenerator, tool_use_script
from aepo_jax.agent.trajectory import Segment
from aepo_jax.data import PromptPipeline
from aepo_jax.rollout.stats import STRUCTURE_STATS, compute_stats
from aepo_jax.rollout.strategies import RolloutConfig, rollout
from aepo_jax.training.rl_trainer import RLTrainer
from aepo_jax.training.rollout_step_metrics import (
    DEPTH_COUNTERS,
    combine_step_stats,
    numeric_stats,
    rollout_step_metrics,
    step_rollout_stats,
)
from configs.dapo_tiny import get_config as dapo_config
from tests.training.fixtures import tiny_model
from tests.training.sampling_fixture import (
    digit_examples,
    encode_digits,
    low_token_reward,
    make_sampling_rollout,
    small_rl_config,
)

TOK = ByteTokenizer()


class EchoTools:
    def run_many(self, calls):
        return [SimpleNamespace(text=f"{c.tag} says {c.content}", ok=True) for c in calls]


def scripted_rollout(prompts, k, seed, tau=0.3):
    """A real ARPO rollout of the scripted agent (branches at tool results whose entropy rose by `tau`)."""
    loop = AgentLoop(ScriptedGenerator(tool_use_script(TOK, 0.9, max_calls=4), seed=seed), TOK, EchoTools(),
                     LoopConfig(max_tool_calls=4, max_response_tokens=2000, max_context_len=4000))
    return rollout(prompts, k, loop=loop, config=RolloutConfig(strategy="arpo", branch_threshold=tau),
                   rng=np.random.default_rng(seed), key=jax.random.key(seed))


def structure(groups) -> dict[str, float]:
    """`rollout/*` of the tree statistics `compute_stats` gives on `groups`."""
    return {f"rollout/{k}": v for k, v in numeric_stats(compute_stats(groups)).items() if k in STRUCTURE_STATS}


def assert_same(got: dict[str, float], want: dict[str, float]) -> None:
    for key, value in want.items():
        assert key in got, key
        if math.isnan(value):  # a logged record names it "nan"
            assert got[key] == "nan" or math.isnan(got[key]), (key, got[key])
        else:
            assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-12), (key, got[key], value)


def test_processes_parts_combine_to_the_stats_of_all_their_groups():
    """Three processes' rollouts of their own prompts (the last made no branch): every statistic of the
    combined parts is that of one process holding all the groups; work counters add up."""
    rollouts = [scripted_rollout([TOK.encode(f"p{seed}-{i}") for i in range(2)], 8, seed, tau)
                for seed, tau in ((1, 0.3), (2, 0.3), (3, 5.0))]
    assert [s.num_branch > 0 for _, s in rollouts] == [True, True, False]
    got = combine_step_stats([step_rollout_stats(groups, [stats]) for groups, stats in rollouts])

    assert_same(got, structure([g for groups, _ in rollouts for g in groups]))
    works = [{k: v for k, v in numeric_stats(s).items() if k not in STRUCTURE_STATS} for _, s in rollouts]
    for key in ("forward_tokens", "decode_tokens", "tool_calls", "trajectory_tokens", "branch_prefix_tokens",
                "num_topups"):
        assert got[f"rollout/{key}"] == sum(w[key] for w in works), key
    for key in DEPTH_COUNTERS:  # chains of one process after another's: processes run side by side
        assert got[f"rollout/{key}"] == max(w[key] for w in works), key
    assert got["rollout/forward_to_trajectory_ratio"] == pytest.approx(
        sum(w["forward_tokens"] for w in works) / sum(w["trajectory_tokens"] for w in works))
    assert got["branch_top3_fraction"] == got["rollout/top3_branch_fraction"]
    assert got["tool_calls_per_trajectory"] == got["rollout/tool_calls_per_trajectory"]


def test_one_process_one_rollout_reports_its_rollout_stats():
    """Without DAPO and with one process the metrics are the rollout's own statistics, every one of them."""
    groups, stats = scripted_rollout([TOK.encode(f"q{i}") for i in range(3)], 6, seed=4)
    got = rollout_step_metrics(step_rollout_stats(groups, [stats]))
    assert_same(got, {f"rollout/{k}": v for k, v in numeric_stats(stats).items()})
    assert set(got) == {f"rollout/{k}" for k in numeric_stats(stats)} | {"branch_top3_fraction",
                                                                         "tool_calls_per_trajectory"}


def test_no_kept_groups_give_zero_counts_and_nan_ratios():
    got = combine_step_stats([step_rollout_stats([], [{"forward_tokens": 7.0}])])
    assert got["rollout/num_prompts"] == got["rollout/num_branch"] == got["rollout/longest_branch_run"] == 0
    assert math.isnan(got["rollout/trajectories_per_prompt"]) and math.isnan(got["rollout/top3_branch_fraction"])
    assert got["rollout/forward_tokens"] == 7.0


def _dapo_trainer(tmp_path, config, rollout_fn, reward_fn, pipeline, encode_prompt) -> RLTrainer:
    """A DAPO trainer of the tiny model; `rollout_fn(graphdef)` makes its rollout function."""
    graphdef, params = tiny_model(seed=config.seed)
    return RLTrainer(config, str(tmp_path), rollout_fn=rollout_fn(graphdef), pipeline=pipeline,
                     encode_prompt=encode_prompt, reward_fn=reward_fn, graphdef=graphdef, params=params)


def test_dapo_step_logs_the_kept_groups_tree_stats_and_every_rollouts_work(tmp_path):
    """A DAPO step through `train()`: dropped groups and resample rounds. The tree statistics are those of
    the groups trained on; forward tokens, tool calls, rounds and seconds add up over every rollout."""
    constant = {f"q{i}" for i in range(0, 16, 2)}  # every trajectory of these prompts scores 0
    ids = {tuple(encode_digits(ex)): ex["id"] for ex in digit_examples(16)}
    calls = []  # (groups, stats) of every rollout call

    def reward(example, trajectory):
        return 0.0 if example["id"] in constant else low_token_reward(example, trajectory) + 1e-3 * trajectory.traj_id

    def rollout_fn(graphdef):
        sample = make_sampling_rollout(graphdef)

        def fn(prompts, k, params, key, rng):
            groups, _ = sample(prompts, k, params, key, rng)
            for traj in (t for g in groups for t in g):  # one segment each: a per-group segment entropy
                traj.segments.append(Segment(0, len(traj.response_ids), float(np.mean(traj.entropy[:5])), False))
            stats = compute_stats(groups).as_dict()
            stats.update(forward_tokens=float(sum(len(t.response_ids) for g in groups for t in g) + 100 * len(calls)),
                         tool_calls=1.0 + len(calls), rounds=3.0, tool_seconds=0.25)
            calls.append((groups, stats))
            return groups, stats

        return fn

    config = small_rl_config(dapo_config, 1)
    pipeline = PromptPipeline(digit_examples(16), config.data.prompts_per_step, seed=config.seed)
    trainer = _dapo_trainer(tmp_path, config, rollout_fn, reward, pipeline, encode_digits)
    (record,) = trainer.train()
    trainer.close()

    informative = [g for groups, _ in calls for g in groups if ids[tuple(g[0].prompt_ids)] not in constant]
    kept = informative[: config.data.prompts_per_step]
    assert len(calls) > 1 and record["dropped_groups"] > 0 and record["kept_groups"] == len(kept)
    assert_same(record, structure(kept))
    first = structure(calls[0][0])
    assert first["rollout/mean_segment_entropy"] != record["rollout/mean_segment_entropy"]  # the test can tell
    for key in ("forward_tokens", "tool_calls", "rounds", "tool_seconds", "trajectory_tokens"):
        assert record[f"rollout/{key}"] == pytest.approx(sum(s[key] for _, s in calls)), key
    assert record["tools_s"] == record["rollout/tool_seconds"]
    assert record["rollout/forward_to_trajectory_ratio"] == pytest.approx(
        record["rollout/forward_tokens"] / record["rollout/trajectory_tokens"])


def test_dapo_collect_with_branching_rollouts(tmp_path):
    """`_collect` over real ARPO rollouts (branches, tool calls, the loop's own counters): half the groups
    of every batch are dropped, so a resample round runs."""
    seeds = itertools.count()
    made = []

    def rollout_fn(graphdef):
        def fn(prompts, k, params, key, rng):
            out = scripted_rollout(prompts, k, next(seeds))
            made.append(out[1])
            return out

        return fn

    def reward(example, trajectory):  # groups -0 and -1 of every batch informative, -2 and -3 all equal
        return float(trajectory.traj_id % 2) if example["q"].endswith(("-0", "-1")) else 0.0

    batches = iter([[{"q": f"b{b}-{i}"} for i in range(4)] for b in range(10)])
    trainer = _dapo_trainer(tmp_path, small_rl_config(dapo_config, 1), rollout_fn, reward, batches,
                            lambda ex: TOK.encode(ex["q"]))
    try:
        groups, _, stats, info = trainer._collect(jax.random.key(0), np.random.default_rng(0), None)
    finally:
        trainer.close()
    got = rollout_step_metrics(stats)
    assert info["resample_rounds"] == 1 and len(made) == 2 and len(groups) == 4
    assert_same(got, structure(groups))
    for key in ("forward_tokens", "tool_calls", "serial_tool_calls", "rounds", "trajectory_tokens"):
        assert got[f"rollout/{key}"] == sum(getattr(s, key) for s in made), key
