"""The RL training loop (DESIGN.md, Trainer; spec §2-3).

One step: prompts from the pipeline -> `rollout_fn` with the current
parameters -> rewards -> (DAPO) dynamic sampling -> padded rows -> log-probs
of the training forward (and of the reference model when KL is needed) ->
advantages of the algorithm preset -> `ppo_epochs` passes over mini-batches
of whole groups, each an exact micro-batch gradient accumulation in the
`train.pack` layout ("tree": every shared prefix token computed once,
docs/packing.md; "flat": padded rows; same loss and gradients) -> metrics
and checkpoints. `--resume` restores parameters, optimiser, step, RNG and
data position, so an interrupted run continues exactly.

The rollout is a seam: `rollout_fn(prompts, k, params, key, rng) -> (groups,
stats)` where `groups[i]` holds the `k` finished trajectories of prompt `i`
and `stats` is a mapping (or has `as_dict()`) of tree statistics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from aepo_jax.objectives import compute_advantages, kl_penalty
from aepo_jax.training.batch import select_rows
from aepo_jax.training.build import (
    RunParts,
    build_run,
    data_parallel_size,
    place_batch,
    preset_from,
    row_multiple,
    step_config_from,
    updates_per_step,
)
from aepo_jax.training.packing import (
    DEFAULT_PACK,
    PackingTally,
    make_train_step_for_pack,
    pack_mini_batch,
    place_tree_batch,
    rows_to_sequences,
)
from aepo_jax.training.rollout_batch import build_rollout_rows, rollout_metrics
from aepo_jax.training.step_loop import CheckpointedTrainer
from aepo_jax.training.train_step import make_logprob_fn


class RolloutFn(Protocol):
    def __call__(self, prompts: list[list[int]], k: int, params: Any, key: jax.Array,
                 rng: np.random.Generator) -> tuple[list[list[Any]], Any]: ...


RewardFn = Callable[[Any, Any], float]  # (example, trajectory) -> reward


def _stats_dict(stats: Any) -> dict[str, float]:
    """Numeric entries of rollout stats, for the metrics line."""
    if stats is None:
        return {}
    raw = stats.as_dict() if hasattr(stats, "as_dict") else dict(stats)
    out = {}
    for key, value in raw.items():
        if isinstance(value, (bool, int, float, np.integer, np.floating)):
            out[key] = float(value)
    return out


class RLTrainer(CheckpointedTrainer):
    """Drives RL training for one config; see the module docstring.

    `train()`, `restore_latest()`, `save()` and `close()` come from `CheckpointedTrainer`.

    Args:
      config: the resolved experiment config (configs/base.py layout).
      workdir: run directory (metrics.jsonl, checkpoints/, config.json).
      rollout_fn: the rollout seam (see module docstring).
      pipeline: endless iterator of example batches with `state()`/`restore()`.
      encode_prompt: example -> prompt token ids (chat template applied).
      reward_fn: (example, trajectory) -> float.
      graphdef, params: the initial model (default: built from `config.model`).
      pad_id: token id used for padding rows.
      process_index: this host (only process 0 writes metrics).
    """

    progress_name = "rl"

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        workdir: str,
        *,
        rollout_fn: RolloutFn,
        pipeline: Any,
        encode_prompt: Callable[[Any], list[int]],
        reward_fn: RewardFn,
        graphdef: Any = None,
        params: Any = None,
        pad_id: int = 0,
        process_index: int = 0,
    ):
        self.config = config
        self.workdir = workdir
        self.rollout_fn = rollout_fn
        self.pipeline = pipeline
        self.encode_prompt = encode_prompt
        self.reward_fn = reward_fn
        self.pad_id = pad_id
        self.preset = preset_from(config)
        self.step_config = step_config_from(config, self.preset)
        self.run: RunParts = build_run(config, graphdef, params, updates_per_round=updates_per_step(config))
        self.state = self.run.state
        mesh = self.run.mesh
        self.row_multiple = row_multiple(config.train.micro_batch_size, mesh)
        self.pack = str(config.train.get("pack", DEFAULT_PACK))
        self._train_step = make_train_step_for_pack(
            self.run.graphdef, self.run.tx, self.step_config, self.pack, self.run.schedule,
            self.run.state_sharding,
        )
        self._logprobs = make_logprob_fn(self.run.graphdef, self.step_config)
        self.needs_reference = bool(self.preset.kl_coef > 0 or config.objective.log_kl)
        # The reference model: a frozen copy of the initial parameters (spec §3.3), on the same shards.
        self.reference_params = (
            jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=self.run.state_sharding.params)(
                self.state.params) if self.needs_reference else None
        )
        self._open_outputs(workdir, process_index)

    # -- data position and progress (CheckpointedTrainer hooks) ------------
    def _data_position(self) -> dict:
        return self.pipeline.state() if hasattr(self.pipeline, "state") else {}

    def _restore_data_position(self, position: dict) -> None:
        if hasattr(self.pipeline, "restore"):
            self.pipeline.restore(position)

    def _progress_postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"reward": f"{metrics.get('reward_mean', float('nan')):.3f}",
                "loss": f"{metrics.get('loss', float('nan')):.4f}"}

    # -- one step ----------------------------------------------------------
    def _rollout(self, examples: Sequence[Any], key: jax.Array, rng: np.random.Generator):
        prompts = [list(map(int, self.encode_prompt(ex))) for ex in examples]
        groups, stats = self.rollout_fn(prompts, int(self.config.rollout.k), self.state.params, key, rng)
        if len(groups) != len(examples):
            raise RuntimeError(f"rollout_fn returned {len(groups)} groups for {len(examples)} prompts")
        rewards = [[float(self.reward_fn(ex, traj)) for traj in group] for ex, group in zip(examples, groups)]
        return groups, rewards, stats

    def _collect(self, key: jax.Array, rng: np.random.Generator):
        """Rollouts for one step; DAPO dynamic sampling drops groups whose rewards
        are all equal and rolls out more prompts, at most `max_resample_rounds` times."""
        examples = next(self.pipeline)
        key, sub = jax.random.split(key)
        groups, rewards, stats = self._rollout(examples, sub, rng)
        info = {"resample_rounds": 0.0, "dropped_groups": 0.0}
        if not self.preset.dynamic_sampling:
            return groups, rewards, stats, info
        wanted = len(examples)

        def informative(gs, rs):
            keep = [i for i, r in enumerate(rs) if np.ptp(np.asarray(r)) > 0]
            info["dropped_groups"] += len(rs) - len(keep)
            return [gs[i] for i in keep], [rs[i] for i in keep]

        groups, rewards = informative(groups, rewards)
        rounds = 0
        while len(groups) < wanted and rounds < int(self.config.objective.max_resample_rounds):
            rounds += 1
            key, sub = jax.random.split(key)
            more_groups, more_rewards, _ = self._rollout(next(self.pipeline), sub, rng)
            more_groups, more_rewards = informative(more_groups, more_rewards)
            groups += more_groups[: wanted - len(groups)]
            rewards += more_rewards[: wanted - len(rewards)]
        info["resample_rounds"] = float(rounds)
        info["kept_groups"] = float(len(groups))
        if not groups:  # nothing informative: train on nothing rather than on noise
            info["skipped_update"] = 1.0
        return groups, rewards, stats, info

    def _advantages(self, rows, logp, entropy, logp_ref) -> tuple[np.ndarray, dict[str, float]]:
        batch = rows.batch
        kl = None
        if logp_ref is not None and self.preset.kl_in_reward:
            kl = kl_penalty(jnp.asarray(logp), jnp.asarray(logp_ref), self.preset.kl_estimator)
            kl = kl * jnp.asarray(batch["mask"])
        advantages, metrics = compute_advantages(
            self.preset, rows.rewards, rows.group_ids, batch["mask"], entropy=entropy,
            response_lengths=rows.response_lengths, max_response_len=int(self.config.rollout.max_response_len),
            kl=kl, tokens=batch["input_ids"], step_starts=rows.step_starts,
        )
        return np.asarray(advantages, np.float32), {f"adv/{k}": float(v) for k, v in metrics.items()}

    def _score(self, params: Any, batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        device_batch = place_batch(batch, self.run.mesh)
        logp, entropy = self._logprobs(params, device_batch)
        return np.asarray(logp) * batch["valid"], np.asarray(entropy) * batch["valid"]

    def _mini_batches(self, num_groups: int, group_ids: np.ndarray, rng: np.random.Generator):
        per_mini = max(1, int(self.config.train.mini_batch_prompts))
        rows_per_mini = per_mini * int(self.config.rollout.k)
        rows_per_mini = -(-rows_per_mini // self.row_multiple) * self.row_multiple
        for _ in range(int(self.config.train.ppo_epochs)):
            order = rng.permutation(num_groups)
            for start in range(0, num_groups, per_mini):
                chosen = set(order[start:start + per_mini].tolist())
                rows = np.flatnonzero(np.isin(group_ids, list(chosen)))
                yield rows, rows_per_mini

    def _update_batch(self, batch: dict[str, np.ndarray], row_ids: np.ndarray, rows_per_mini: int,
                      group_ids: np.ndarray, tally: PackingTally) -> dict[str, jax.Array]:
        """The mini-batch `row_ids` of the flat rows, on the mesh in the `train.pack` layout.

        "tree" packs the rows' trajectories with the flat `T` (Dr. GRPO's
        normaliser needs it) into whole-group micro-batches of about the flat
        micro-batch's slots (`pack_mini_batch`).
        """
        length = batch["input_ids"].shape[1]  # T
        flat_slots = rows_per_mini * length
        if self.pack == "flat":
            tally.add_flat(int(batch["valid"][row_ids].sum()), flat_slots)
            return place_batch(_pad_rows(select_rows(batch, row_ids), rows_per_mini), self.run.mesh)
        train = self.config.train
        tree, stats = pack_mini_batch(
            rows_to_sequences(batch, row_ids), group_ids[row_ids], length, row_len=train.get("row_len"),
            micro_batch_size=int(train.micro_batch_size), data_parallel=data_parallel_size(self.run.mesh),
            pad_id=self.pad_id,
        )
        tally.add_tree(stats, flat_slots, tree["mask"].shape[0])
        return place_tree_batch(tree, self.run.mesh)

    def train_step(self) -> dict[str, float]:
        """One RL step; returns the logged metrics."""
        cfg = self.config
        t0 = time.perf_counter()
        step = int(self.state.rounds)
        self.state, key = self.state.next_rng()
        rng = np.random.default_rng([int(cfg.seed), step])
        groups, rewards, stats, info = self._collect(key, rng)
        t_rollout = time.perf_counter()
        metrics: dict[str, float] = {}
        if groups:
            metrics.update(rollout_metrics(groups, rewards))
        metrics.update(info)
        metrics.update({f"rollout/{k}": v for k, v in _stats_dict(stats).items()})
        if "rollout/top3_branch_fraction" in metrics:
            metrics["branch_top3_fraction"] = metrics["rollout/top3_branch_fraction"]
        if "rollout/tool_calls_per_trajectory" in metrics:
            metrics["tool_calls_per_trajectory"] = metrics["rollout/tool_calls_per_trajectory"]
        if not groups:
            self.state = self.state.replace(rounds=self.state.rounds + 1)
            return self._finish_step(metrics, t0, t_rollout, time.perf_counter(), train_tokens=0.0)

        rows = build_rollout_rows(groups, rewards, max_len=int(cfg.train.max_seq_len), pad_id=self.pad_id,
                                  row_multiple=self.row_multiple, length_bucket=int(cfg.train.length_bucket))
        batch = rows.batch
        if cfg.train.recompute_logp_old:
            logp_old, entropy = self._score(self.state.params, batch)
            metrics["logp_old_abs_diff"] = float(
                np.sum(np.abs(logp_old - batch["logp_old"]) * batch["mask"]) / max(batch["mask"].sum(), 1.0))
            batch["logp_old"], batch["entropy"] = logp_old * batch["mask"], entropy * batch["mask"]
        logp_ref = None
        if self.needs_reference:
            logp_ref, _ = self._score(self.reference_params, batch)
            kl_values = np.asarray(kl_penalty(jnp.asarray(batch["logp_old"]), jnp.asarray(logp_ref),
                                              self.preset.kl_estimator))
            metrics["kl_ref_rollout"] = float(np.sum(kl_values * batch["mask"]) / max(batch["mask"].sum(), 1.0))
            if self.step_config.kl_coef > 0:
                batch["logp_ref"] = logp_ref * batch["mask"]
        advantages, adv_metrics = self._advantages(rows, batch["logp_old"], batch["entropy"], logp_ref)
        batch["advantages"] = advantages
        metrics.update(adv_metrics)
        metrics["entropy_mean"] = float(np.sum(batch["entropy"] * batch["mask"]) / max(batch["mask"].sum(), 1.0))

        t_train = time.perf_counter()
        update_metrics: list[dict[str, Any]] = []
        tally = PackingTally()
        for row_ids, rows_per_mini in self._mini_batches(len(groups), rows.group_ids, rng):
            mini = self._update_batch(batch, row_ids, rows_per_mini, rows.group_ids, tally)
            self.state, m = self._train_step(self.state, mini)
            update_metrics.append(m)
        metrics.update(tally.metrics())
        update_metrics = jax.device_get(update_metrics)
        for key_name in update_metrics[0]:
            values = [float(m[key_name]) for m in update_metrics]
            metrics[key_name] = values[-1] if key_name == "learning_rate" else float(np.mean(values))
        metrics["train_tokens"] = float(sum(float(m["train_tokens"]) for m in update_metrics))
        metrics["updates"] = float(len(update_metrics))
        self.state = self.state.replace(rounds=self.state.rounds + 1)
        return self._finish_step(metrics, t0, t_rollout, t_train, metrics["train_tokens"])

    def _finish_step(self, metrics, t0, t_rollout, t_train, train_tokens) -> dict[str, float]:
        now = time.perf_counter()
        metrics["rollout_s"] = t_rollout - t0
        metrics["prepare_s"] = t_train - t_rollout
        metrics["train_s"] = now - t_train
        metrics["step_time_s"] = now - t0
        metrics["tokens_per_s"] = float(train_tokens) / max(now - t0, 1e-9)
        if "rollout/tool_seconds" in metrics:  # reported by rollouts that time their tools
            metrics["tools_s"] = metrics["rollout/tool_seconds"]
        return metrics


def _pad_rows(batch: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Append all-padding rows (mask 0, valid 0) up to `rows` so every mini-batch has one shape."""
    have = next(iter(batch.values())).shape[0]
    if have > rows:
        raise ValueError(f"mini-batch has {have} rows, more than the fixed {rows}")
    if have == rows:
        return dict(batch)
    return {k: np.concatenate([v, np.zeros((rows - have,) + v.shape[1:], v.dtype)]) for k, v in batch.items()}


