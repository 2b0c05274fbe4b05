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

`train.rollout_ahead` rolls out step s + 1 on a background thread while step
s scores and updates, with the parameters step s started from
(`training/rollout_ahead.py`): each rollout after the first is one update
round stale. Checkpoints then also hold those parameters, so a resumed run
continues exactly too. It needs `train.recompute_logp_old=False`: the ratio's
denominator is then the sampler's log-probs, those of the parameters that
sampled (recomputed, they would be the current parameters', one update newer).

With several processes each holds its own groups; batch statistics of the
advantages (REINFORCE++ whitening, AEPO's batch entropy z-score) are summed
over the processes, so they are the whole step's, as with one process; so are
the `rollout/*` statistics (`training/rollout_step_metrics.py`: the trained
groups' tree statistics, and the work counters of every rollout of the step).

The rollout is a seam: `rollout_fn(prompts, k, params, key, rng) -> (groups,
stats)` where `groups[i]` holds the `k` finished trajectories of prompt `i`
and `stats` is a mapping (or has `as_dict()`) of tree statistics. A rollout
function may also have `place_params(params)`, which the trainer calls on its
own thread, at the same point on every process, to put the parameters where
the rollout samples (the composition root's `AgentRollout` copies them to each
host's own devices), and `samples_on_own_devices = True` when it then runs
only programs on this process's devices: that lets `rollout_ahead` run with
several processes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from aepo_jax.objectives import compute_advantages, kl_penalty
from aepo_jax.parallel.device_turns import off_device_turn
from aepo_jax.parallel.mesh import require_whole_batch_slices
from aepo_jax.parallel.multihost import (
    gather_metrics,
    global_max,
    host_local,
    local_share,
    process_rng,
    process_sum,
    process_sum_fields,
)
from aepo_jax.training.build import (
    RunParts,
    build_run,
    data_parallel_size,
    local_micro_batch_rows,
    mini_batch_prompts,
    preset_from,
    step_config_from,
    updates_per_step,
)
from aepo_jax.training.packing import (
    DEFAULT_PACK,
    PackingTally,
    agree_batch_shapes,
    build_train_batch,
    make_logprob_fn_for_pack,
    make_train_step_for_pack,
    per_sequence_values,
    place_train_batch,
)
from aepo_jax.training.process_metric_weights import (
    SUMMED_METRICS,
    process_metric_weights,
)
from aepo_jax.training.rollout_ahead import Collected, RolloutAhead
from aepo_jax.training.rollout_batch import (
    RolloutSequences,
    rollout_metric_sums,
    rollout_sequences,
)
from aepo_jax.training.rollout_step_metrics import (
    rollout_step_metrics,
    step_rollout_stats,
)
from aepo_jax.training.step_loop import CheckpointedTrainer, require_micro_batch_size
from aepo_jax.training.update_metrics import step_update_metrics


class RolloutFn(Protocol):
    def __call__(self, prompts: list[list[int]], k: int, params: Any, key: jax.Array,
                 rng: np.random.Generator) -> tuple[list[list[Any]], Any]: ...


def _host_key(key: jax.Array) -> jax.Array:
    """`key` as a key this process holds by itself (same value): drawing from it launches no program
    over other processes' devices."""
    return jax.random.wrap_key_data(np.asarray(jax.random.key_data(key)))


RewardFn = Callable[[Any, Any], float]  # (example, trajectory) -> reward


def check_rl_config(config: ml_collections.ConfigDict) -> None:
    """A ValueError for settings that would fail only after a rollout, or train on wrong numbers."""
    rollout, train = config.rollout, config.train
    if int(rollout.k) < 1:
        raise ValueError(f"rollout.k={int(rollout.k)}: every prompt needs at least one trajectory (k >= 1)")
    updates_per_step(config)  # at least 1 prompt per mini-batch and 1 epoch
    require_micro_batch_size(config)
    longest = int(rollout.max_prompt_len) + int(rollout.max_response_len)
    if longest > int(train.max_seq_len):
        raise ValueError(f"rollout.max_prompt_len + rollout.max_response_len = {int(rollout.max_prompt_len)} + "
                         f"{int(rollout.max_response_len)} = {longest} exceeds train.max_seq_len="
                         f"{int(train.max_seq_len)}: a trajectory that long would be refused only after its whole "
                         "rollout; raise train.max_seq_len or lower the rollout limits")
    if bool(train.get("rollout_ahead", False)) and bool(train.recompute_logp_old):
        raise ValueError("train.rollout_ahead=True with train.recompute_logp_old=True: each rollout after the first "
                         "samples with the parameters one update older than the ones that would recompute its "
                         "logp_old, so the policy ratio would have no correction for that staleness; set "
                         "train.recompute_logp_old=False (the sampler's log-probs are then the ratio's denominator)")


def process_shares(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, process_index: int,
                   process_count: int) -> tuple[int, int, int]:
    """(prompts of a step, prompts of a mini-batch, batch slices of the mesh) that process `process_index`
    of `process_count` takes: the config's sizes are global, and each must divide by the processes
    (`local_share`, a ValueError naming it). With several processes, DAPO's dynamic sampling (a
    data-dependent number of groups per process) is refused, and the process's batch slices must be whole
    and one contiguous run (`require_whole_batch_slices`). `launch.run_setup.check_before_start` runs it
    before anything is built; the trainer again on its own mesh."""
    prompts = local_share(int(config.data.prompts_per_step), process_count, "data.prompts_per_step")
    mini_prompts = local_share(mini_batch_prompts(config), process_count, "train.mini_batch_prompts")
    if process_count > 1 and preset_from(config).dynamic_sampling:
        raise ValueError("DAPO dynamic sampling keeps a data-dependent number of groups per process; "
                         "it is not supported with several processes")
    data_parallel = local_share(data_parallel_size(mesh), process_count, "the mesh's data x fsdp devices")
    if process_count > 1:
        require_whole_batch_slices(mesh, process_index, data_parallel)
    return prompts, mini_prompts, data_parallel


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
      mesh: the run's mesh, when the composition root built it for the rollout
        sampler too (default: from `config.mesh`).
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
        graphdef: Any = None, params: Any = None, pad_id: int = 0, process_index: int = 0,
        mesh: jax.sharding.Mesh | None = None,
    ):
        check_rl_config(config)
        self.rollout_ahead = bool(config.train.get("rollout_ahead", False))
        if self.rollout_ahead and jax.process_count() > 1 and not getattr(rollout_fn, "samples_on_own_devices", False):
            raise ValueError(f"train.rollout_ahead with {jax.process_count()} processes needs a rollout function "
                             "that samples on this process's own devices (`samples_on_own_devices`, as the "
                             "composition root's AgentRollout does): a background rollout launching programs over "
                             "several hosts could launch them in another order than the train step on another host")
        self.config = config
        self.workdir = workdir
        self.rollout_fn = rollout_fn
        self.pipeline = pipeline
        self.encode_prompt = encode_prompt
        self.reward_fn = reward_fn
        self.pad_id = pad_id
        self.preset = preset_from(config)
        self.run: RunParts = build_run(config, graphdef, params, updates_per_round=updates_per_step(config),
                                       mesh=mesh)
        self.step_config = step_config_from(config, self.preset, self.run.mesh)
        self.state = self.run.state
        self.pack = str(config.train.get("pack", DEFAULT_PACK))
        self._train_step = make_train_step_for_pack(
            self.run.graphdef, self.run.tx, self.step_config, self.pack, self.run.schedule,
            self.run.state_sharding,
        )
        # Scores come back with the batch's rows over the mesh, so each process reads its own back.
        self._logprobs = make_logprob_fn_for_pack(self.run.graphdef, self.step_config, self.pack, self.run.mesh)
        # Multi-host: config sizes are global, this process rolls out and packs its share.
        self.process_count = jax.process_count()
        self.local_prompts, self.local_mini_prompts, self.local_data_parallel = process_shares(
            config, self.run.mesh, jax.process_index(), self.process_count)
        # This process's rows of one micro-batch: its share of the step's (a tree micro-batch is packed here,
        # per process; `train.micro_batch_size` is global, as the flat step splits it).
        self.local_micro_rows = local_micro_batch_rows(self.step_config.micro_batch_size, self.local_data_parallel,
                                                       data_parallel_size(self.run.mesh))
        multiple = math.lcm(int(config.train.micro_batch_size), data_parallel_size(self.run.mesh))
        self.rows_per_mini = -(-self.local_mini_prompts * int(config.rollout.k) // multiple) * multiple
        self.needs_reference = bool(self.preset.kl_coef > 0 or config.objective.log_kl)
        # The reference model: a frozen copy of the initial parameters (spec §3.3), on the same shards.
        # A copy of the parameters on their shards: the reference model's and rollout_ahead's (the train step
        # donates its state).
        self._copy_params = jax.jit(lambda p: jax.tree.map(jnp.copy, p),
                                    out_shardings=self.run.state_sharding.params)
        self.reference_params = self._copy_params(self.state.params) if self.needs_reference else None
        # rollout_ahead: the background rollout, the parameters the next step's rollout samples with (a
        # copy: the train step donates its state; None: the current ones) and the data position before
        # the rollout in flight drew its prompts (what a checkpoint saves while it runs).
        self._ahead = RolloutAhead() if self.rollout_ahead else None
        self._next_rollout_params = None
        self._position_before_ahead: dict = {}
        self._open_outputs(workdir, process_index)

    # -- data position and progress (CheckpointedTrainer hooks) ------------
    def _data_position(self) -> dict:
        if self._ahead is not None and self._ahead.pending_step is not None:
            return self._position_before_ahead  # the rollout in flight is redone after a resume
        return self.pipeline.state() if hasattr(self.pipeline, "state") else {}

    def _restore_data_position(self, position: dict) -> None:
        if hasattr(self.pipeline, "restore"):
            self.pipeline.restore(position)

    def _progress_postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        return {"reward": f"{metrics.get('reward_mean', float('nan')):.3f}",
                "loss": f"{metrics.get('loss', float('nan')):.4f}"}

    # -- one step ----------------------------------------------------------
    def _rollout(self, examples: Sequence[Any], key: jax.Array, rng: np.random.Generator, params: Any):
        prompts = [list(map(int, self.encode_prompt(ex))) for ex in examples]
        if self.process_count > 1:  # every process samples its own prompts with its own key (already local)
            key = jax.random.fold_in(key, jax.process_index())
        groups, stats = self.rollout_fn(prompts, int(self.config.rollout.k), params, key, rng)
        if len(groups) != len(examples):
            raise RuntimeError(f"rollout_fn returned {len(groups)} groups for {len(examples)} prompts")
        with off_device_turn():  # rewards launch no device program (a judge may take seconds)
            rewards = [[float(self.reward_fn(ex, traj)) for traj in group] for ex, group in zip(examples, groups)]
        return groups, rewards, stats

    def _collect(self, key: jax.Array, rng: np.random.Generator, params: Any):
        """Rollouts for one step with `params`; DAPO dynamic sampling drops groups whose rewards
        are all equal and rolls out more prompts, at most `max_resample_rounds` times. The stats are
        this process's part (`StepRolloutStats`): tree sums of the kept groups, work of every rollout."""
        examples = next(self.pipeline)
        key, sub = jax.random.split(key)
        groups, rewards, stats = self._rollout(examples, sub, rng, params)
        # Structural stats are of the groups kept and trained (made from `groups`); work counters (tokens,
        # tool calls made, rounds, seconds) are summed over every rollout of the step, resample rounds included.
        every_stats = [stats]
        info = {"resample_rounds": 0.0, "dropped_groups": 0.0}
        if not self.preset.dynamic_sampling:
            return groups, rewards, step_rollout_stats(groups, every_stats), info
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
            more_groups, more_rewards, more_stats = self._rollout(next(self.pipeline), sub, rng, params)
            every_stats.append(more_stats)
            more_groups, more_rewards = informative(more_groups, more_rewards)
            groups += more_groups[: wanted - len(groups)]
            rewards += more_rewards[: wanted - len(rewards)]
        info["resample_rounds"] = float(rounds)
        info["kept_groups"] = float(len(groups))
        if not groups:  # nothing informative: train on nothing rather than on noise
            info["skipped_update"] = 1.0
        return groups, rewards, step_rollout_stats(groups, every_stats), info

    def _collect_step(self, step: int, key: jax.Array, params: Any, stale: bool) -> Collected:
        """Step `step`'s rollout with `params` (on the caller's thread), and the step's numpy generator."""
        if not key.is_fully_addressable:  # drawing from it would launch a program over other processes' devices
            raise RuntimeError(f"step {step}'s rollout got a key that spans other processes' devices; the trainer "
                               "makes it process-local on its own thread (_local_key)")
        # This process's own stream (branch decisions differ between hosts); the mini-batch plan draws from it
        # too, which needs no agreement: every process's plan has the same mini-batch count and sizes.
        rng = process_rng(int(self.config.seed), step)
        start = time.perf_counter()
        groups, rewards, stats, info = self._collect(key, rng, params)
        return Collected(groups, rewards, stats, info, rng, time.perf_counter() - start, stale)

    def _step_rollout(self, step: int, key: jax.Array) -> tuple[Collected, float]:
        """(step `step`'s rollout, seconds the step waited for it). With `rollout_ahead`, also starts
        step `step + 1`'s rollout in the background with a copy of the parameters this step starts from."""
        taken = self._ahead.take(step, key) if self._ahead is not None else None
        if taken is None:
            stale = self._next_rollout_params is not None
            params = self._place_params(self._next_rollout_params if stale else self.state.params)
            collected = self._collect_step(step, self._local_key(key), params, stale)
            taken = collected, collected.seconds
        if self._ahead is not None:
            self._next_rollout_params = self._copy_params(self.state.params)
            end = self._run_end if self._run_end is not None else int(self.config.train.total_steps)
            if step + 1 < end:
                self._position_before_ahead = self.pipeline.state() if hasattr(self.pipeline, "state") else {}
                _, next_key = self.state.next_rng()  # the key step + 1 draws (the train step keeps the RNG)
                # Every program over several processes is launched here, on this thread: the background
                # rollout gets parameters already placed and a key this process holds.
                params, local_key = self._place_params(self._next_rollout_params), self._local_key(next_key)
                self._ahead.launch(step + 1, next_key, lambda: self._collect_step(step + 1, local_key, params, True))
        return taken

    def _place_params(self, params: Any) -> Any:
        """`params` where the rollout samples (`rollout_fn.place_params`; as they are without one)."""
        place = getattr(self.rollout_fn, "place_params", None)
        return params if place is None else place(params)

    def _local_key(self, key: jax.Array) -> jax.Array:
        return _host_key(key) if self.process_count > 1 else key

    def _advantages(self, seqs: RolloutSequences, logp_ref: np.ndarray | None) -> dict[str, float]:
        """Token advantages of the preset into every sequence (`advantages`); returns their metrics."""
        padded = seqs.padded(self.pad_id)  # [N, T]: the estimators' layout
        kl = None
        if logp_ref is not None and self.preset.kl_in_reward:
            kl = kl_penalty(jnp.asarray(padded["logp_old"]), jnp.asarray(logp_ref), self.preset.kl_estimator)
            kl = kl * jnp.asarray(padded["mask"])
        advantages, metrics = compute_advantages(
            self.preset, seqs.rewards, seqs.group_ids, padded["mask"], entropy=padded["entropy"],
            response_lengths=seqs.response_lengths, max_response_len=int(self.config.rollout.max_response_len),
            kl=kl, tokens=padded["input_ids"], step_starts=seqs.step_starts,
            shared_prefix_len=seqs.shared_prefix_len,
            batch_total=process_sum if self.process_count > 1 else None,  # this process's groups are a part
        )
        seqs.set_per_token("advantages", np.asarray(advantages, np.float32))
        return {f"adv/{k}": float(v) for k, v in metrics.items()}

    def _mini_batch_plan(self, num_groups: int, group_ids: np.ndarray,
                         rng: np.random.Generator) -> list[list[np.ndarray]]:
        """Per PPO epoch, the sequence indices of each mini-batch (whole groups, a fresh
        order per epoch). The scoring pass uses the first epoch's mini-batches."""
        per_mini = self.local_mini_prompts
        epochs = []
        for _ in range(int(self.config.train.ppo_epochs)):
            order = rng.permutation(num_groups)
            epochs.append([np.flatnonzero(np.isin(group_ids, order[start:start + per_mini]))
                           for start in range(0, num_groups, per_mini)])
        return epochs

    def _batch(self, seqs: RolloutSequences, index: np.ndarray):
        """The one batch builder call: sequences `index` in the `train.pack` layout, shapes
        agreed with the other processes, placed on the mesh as global arrays."""
        if self._ahead is not None:  # between mini-batches: the rollout in flight launches its waiting programs
            self._ahead.offer_devices()
        train = self.config.train
        batch, stats = build_train_batch(
            [seqs.sequences[i] for i in index], self.pack, group_ids=seqs.group_ids[index], length=seqs.length,
            rows=self.rows_per_mini, micro_batch_size=self.local_micro_rows,
            data_parallel=self.local_data_parallel, row_len=train.get("row_len"), pad_id=self.pad_id,
        )
        batch, stats = agree_batch_shapes(batch, stats, self.pack, self.pad_id)
        return batch, stats, place_train_batch(batch, self.pack, self.run.mesh)

    def _score(self, params: Any, seqs: RolloutSequences,
               mini_batches: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(logp, entropy) `[N, T]` of every sequence in input order, 0 past its end.

        One micro-batched forward per mini-batch, through the same batch builder and
        scorer layout as the update, so memory is that of the update's micro-batches
        (not one forward over all the step's rows)."""
        logp = np.zeros((len(seqs), seqs.length), np.float32)
        entropy = np.zeros_like(logp)
        for index in mini_batches:
            batch, _, device_batch = self._batch(seqs, index)
            values = [host_local(x) for x in self._logprobs(params, device_batch)]
            logp[index], entropy[index] = (per_sequence_values(v, batch, self.pack, len(index)) for v in values)
        valid = np.arange(seqs.length)[None, :] < np.asarray([len(s["tokens"]) for s in seqs.sequences])[:, None]
        return logp * valid, entropy * valid

    def train_step(self) -> dict[str, float]:
        """One RL step; returns the logged metrics."""
        cfg = self.config
        t0 = time.perf_counter()
        step = int(self.state.rounds)
        self.state, key = self.state.next_rng()
        collected, waited = self._step_rollout(step, key)
        groups, rewards, stats, info, rng = (collected.groups, collected.rewards, collected.stats, collected.info,
                                             collected.rng)
        t_rollout = time.perf_counter()
        metrics: dict[str, float] = {"rollout_s": collected.seconds, "rollout_wait_s": waited}
        if self._ahead is not None:
            metrics["rollout_stale_params"] = float(collected.stale_params)
        metrics.update(info)
        # The whole step's rollout metrics, from every process's counts (a collective): merged after
        # `gather_metrics`, which would average them.
        step_stats = rollout_step_metrics(stats, rollout_metric_sums(groups, rewards))
        if not groups:
            self.state = self.state.replace(rounds=self.state.rounds + 1)
            return self._finish_step({**metrics, **step_stats}, t0, t_rollout, time.perf_counter(), train_tokens=0.0)

        seqs = rollout_sequences(groups, rewards, max_len=int(cfg.train.max_seq_len),
                                 length_bucket=int(cfg.train.length_bucket))
        seqs.length = global_max(seqs.length)  # one T for the step on every process
        plan = self._mini_batch_plan(len(groups), seqs.group_ids, rng)
        padded = seqs.padded(self.pad_id)
        mask, tokens = padded["mask"], max(float(padded["mask"].sum()), 1.0)
        if cfg.train.recompute_logp_old:
            logp_old, entropy = self._score(self.state.params, seqs, plan[0])
            metrics["logp_old_abs_diff"] = float(np.sum(np.abs(logp_old - padded["logp_old"]) * mask) / tokens)
            seqs.set_per_token("logp_old", logp_old * mask)
            seqs.set_per_token("entropy", entropy * mask)
        logp_ref = None
        if self.needs_reference:
            logp_ref, _ = self._score(self.reference_params, seqs, plan[0])
            logp_old = seqs.padded(self.pad_id)["logp_old"]
            kl_values = np.asarray(kl_penalty(jnp.asarray(logp_old), jnp.asarray(logp_ref), self.preset.kl_estimator))
            metrics["kl_ref_rollout"] = float(np.sum(kl_values * mask) / tokens)
            if self.step_config.loss.kl_coef > 0:
                seqs.set_per_token("logp_ref", logp_ref * mask)
        metrics.update(self._advantages(seqs, logp_ref))
        metrics["entropy_mean"] = float(np.sum(seqs.padded(self.pad_id)["entropy"] * mask) / tokens)

        t_train = time.perf_counter()
        update_metrics: list[dict[str, Any]] = []
        tally = PackingTally()
        for epoch in plan:
            for index in epoch:
                batch, pack_stats, device_batch = self._batch(seqs, index)
                if pack_stats is None:
                    tally.add_flat(sum(len(seqs.sequences[i]["tokens"]) for i in index), batch["mask"].size)
                else:
                    tally.add_tree(pack_stats, self.rows_per_mini * seqs.length, batch["mask"].shape[0])
                self.state, m = self._train_step(self.state, device_batch)
                update_metrics.append(m)
        weights = process_metric_weights(metrics, mask)  # what this process's means weigh
        tally = process_sum_fields(tally)  # the step's counts: its ratios are the whole step's
        metrics = {**gather_metrics(metrics, SUMMED_METRICS, weights), **tally.metrics(), **step_stats}
        # Replicated scalars, readable on every process; token means weighted by each update's tokens.
        metrics.update(step_update_metrics(jax.device_get(update_metrics)))
        self.state = self.state.replace(rounds=self.state.rounds + 1)
        return self._finish_step(metrics, t0, t_rollout, t_train, metrics["train_tokens"])

    def _finish_step(self, metrics, t0, t_rollout, t_train, train_tokens) -> dict[str, float]:
        now = time.perf_counter()
        metrics.setdefault("rollout_s", t_rollout - t0)
        metrics["prepare_s"] = t_train - t_rollout
        metrics["train_s"] = now - t_train
        metrics["step_time_s"] = now - t0
        metrics["tokens_per_s"] = float(train_tokens) / max(now - t0, 1e-9)
        if "rollout/tool_seconds" in metrics:  # reported by rollouts that time their tools
            metrics["tools_s"] = metrics["rollout/tool_seconds"]
        return metrics

    # -- checkpoints with rollout_ahead ------------------------------------
    def save(self, force: bool = False) -> None:
        """Checkpoint the state and data position, plus (rollout_ahead) the next rollout's parameters."""
        self.checkpointer.save(int(self.state.rounds), self.state, self._saved_position(), force=force,
                               rollout_params=self._next_rollout_params)

    def restore_latest(self) -> bool:
        """Continue from the newest complete checkpoint. With rollout_ahead, the next rollout samples with
        the parameters the checkpoint saved for it; a checkpoint without them (saved without
        rollout_ahead) leaves it the current parameters."""
        if self._ahead is not None and self._ahead.pending_step is not None:
            raise RuntimeError("restore_latest: a rollout is in flight; restore before training")
        if not super().restore_latest():
            return False
        step = int(self.state.rounds)  # the step restored (saved under its rounds), the same on every process
        self._next_rollout_params = None
        if self._ahead is not None and self.checkpointer.has_rollout_params(step):
            self._next_rollout_params = self.checkpointer.restore_rollout_params(
                self.state.params, step, shardings=self.run.state_sharding.params)
        return True

    def close(self) -> None:
        """Wait for a rollout in flight (rollout_ahead), then close the checkpointer and the logs."""
        if self._ahead is not None:
            self._ahead.close()
        super().close()
