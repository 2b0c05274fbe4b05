"""The RL trainer with a real sampling rollout of the tiny model: metrics,
checkpoints, exact resume, DAPO dynamic sampling and the KL path."""

import json
import os

import jax
import numpy as np
import pytest

from aepo_jax.data import PromptPipeline
from aepo_jax.training.rl_trainer import RLTrainer
from configs.aepo_tiny import get_config as aepo_config
from configs.dapo_tiny import get_config as dapo_config
from configs.reinforce_pp_tiny import get_config as reinforce_pp_config
from tests.training.fixtures import tiny_model
from tests.training.sampling_fixture import (
    digit_examples,
    encode_digits,
    low_token_reward,
    make_sampling_rollout,
    sampling_trainer,
    small_rl_config,
)


def _config(factory=aepo_config, total_steps=3):
    return small_rl_config(factory, total_steps)


def _trainer(config, workdir):
    return sampling_trainer(config, workdir)


def test_trainer_writes_metrics_and_checkpoints_and_resumes_exactly(tmp_path):
    full = _trainer(_config(), tmp_path / "full")
    records = full.train()
    full.close()
    assert [r["step"] for r in records] == [1, 2, 3]
    lines = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3
    for key in ("step", "reward_mean", "entropy_mean", "loss", "grad_norm", "learning_rate", "clip_frac_upper",
                "preserved_grad_frac", "tokens_per_s", "rollout_s", "train_s", "tool_calls_mean"):
        assert key in lines[0], key
    assert all(np.isfinite(line["loss"]) for line in lines)
    # the training forward reproduces the sampler's log-probs (same weights, same temperature)
    assert lines[0]["logp_old_abs_diff"] < 1e-4
    assert sorted(os.listdir(tmp_path / "full" / "checkpoints")) == ["2", "3"]  # every 2 steps, and the last

    # Interrupted after the checkpoint at step 2, resumed in a fresh trainer for the last step.
    part = _trainer(_config(), tmp_path / "part")
    part.train(num_steps=2)
    part.close()
    resumed = _trainer(_config(), tmp_path / "part")
    assert resumed.restore_latest()
    assert int(resumed.state.rounds) == 2
    assert int(resumed.state.step) == 4  # two mini-batch updates per RL step
    resumed.train()
    resumed.close()
    for a, b in zip(jax.tree.leaves(resumed.state.params), jax.tree.leaves(full.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(resumed.state.rng), np.asarray(full.state.rng))
    assert resumed.pipeline.state() == full.pipeline.state()
    # and the parameters did move
    initial = tiny_model(seed=0)[1]
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(initial), jax.tree.leaves(full.state.params)))


@pytest.mark.parametrize("factory", [dapo_config, reinforce_pp_config], ids=["dapo", "reinforce_pp"])
def test_one_step_of_other_families(tmp_path, factory):
    trainer = _trainer(_config(factory, total_steps=1), tmp_path)
    (record,) = trainer.train()
    trainer.close()
    assert np.isfinite(record["loss"])
    if factory is dapo_config:
        assert "resample_rounds" in record and "kept_groups" in record
    else:
        assert record["kl_ref_rollout"] == pytest.approx(0.0, abs=1e-6)  # reference == policy at step 0


def test_dapo_dynamic_sampling_drops_equal_reward_groups_and_refills(tmp_path):
    config = _config(dapo_config, total_steps=1)
    constant = {f"q{i}" for i in range(0, 16, 2)}  # every trajectory of these prompts scores 0

    def reward(example, trajectory):
        if example["id"] in constant:
            return 0.0
        return low_token_reward(example, trajectory) + 1e-3 * trajectory.traj_id  # never all equal

    # Expected counts from a replay of the pipeline's batches and the rule of spec (DAPO): drop
    # equal-reward groups, roll out more prompts until a full batch is kept or the rounds run out.
    replay = PromptPipeline(digit_examples(16), config.data.prompts_per_step, seed=config.seed)
    wanted, max_rounds = config.data.prompts_per_step, config.objective.max_resample_rounds
    kept, dropped, rounds = 0, 0, 0
    while True:
        batch = next(replay)
        good = sum(ex["id"] not in constant for ex in batch)
        dropped += len(batch) - good
        kept = min(wanted, kept + good)
        if kept >= wanted or rounds == max_rounds:
            break
        rounds += 1
    assert dropped > 0  # the replayed batches do hold constant groups

    graphdef, params = tiny_model(seed=config.seed)
    pipeline = PromptPipeline(digit_examples(16), config.data.prompts_per_step, seed=config.seed)
    trainer = RLTrainer(config, str(tmp_path), rollout_fn=make_sampling_rollout(graphdef), pipeline=pipeline,
                        encode_prompt=encode_digits, reward_fn=reward, graphdef=graphdef, params=params)
    (record,) = trainer.train()
    trainer.close()
    assert (record["resample_rounds"], record["kept_groups"], record["dropped_groups"]) == (rounds, kept, dropped)
    assert record["trajectories"] == kept * config.rollout.k and np.isfinite(record["loss"])


def test_scoring_and_reference_log_probs_are_at_the_sampling_temperature(tmp_path):
    """Every other trainer test samples at T = 1, where a scoring pass or reference model that ignored the
    temperature would agree with the sampler anyway (at T = 0.7 they differ by up to ~0.9 nats here)."""
    from tests.training.sampling_fixture import make_sampling_rollout, sampling_trainer

    config = _config(total_steps=1)
    config.rollout.temperature = 0.7
    config.objective.log_kl = True  # the reference model is scored too
    graphdef, _ = tiny_model(seed=config.seed)
    trainer = sampling_trainer(config, tmp_path, rollout_fn=make_sampling_rollout(graphdef, temperature=0.7))
    (record,) = trainer.train()
    trainer.close()
    assert record["logp_old_abs_diff"] < 1e-4  # the training forward reproduces the sampler's log-probs at T
    assert abs(record["kl_ref_rollout"]) < 1e-4  # the reference (same initial weights) scores at T as well


def test_mini_batch_plan_uses_each_trajectory_once_per_epoch_in_whole_groups():
    """The plan was only checked for its mini-batch count: 5 groups of 3, 2 prompts per mini-batch, 3 epochs."""
    from types import SimpleNamespace

    plan_of = RLTrainer._mini_batch_plan
    host = SimpleNamespace(local_mini_prompts=2, config=SimpleNamespace(train=SimpleNamespace(ppo_epochs=3)))
    group_ids = np.repeat(np.array([4, 0, 3, 1, 2]), 3)  # the rows of each group are together, ids in any order
    plan = plan_of(host, 5, group_ids, np.random.default_rng(7))
    assert len(plan) == 3
    for epoch in plan:
        assert [len(mini) for mini in epoch] == [6, 6, 3]
        assert sorted(np.concatenate(epoch).tolist()) == list(range(15))  # every row once
        for mini in epoch:  # whole groups only
            groups = set(group_ids[mini].tolist())
            assert sorted(mini.tolist()) == np.flatnonzero(np.isin(group_ids, list(groups))).tolist()
    orders = [tuple(np.concatenate(epoch).tolist()) for epoch in plan]
    assert len(set(orders)) > 1  # a fresh order per epoch
    again = plan_of(host, 5, group_ids, np.random.default_rng(7))
    assert all(np.array_equal(a, b) for x, y in zip(plan, again) for a, b in zip(x, y))  # from the seed alone
