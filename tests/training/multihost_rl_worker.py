"""One process of the two-process RL test (`test_multihost_rl.py`): `configs/aepo_tiny.py` on a mesh
spanning both processes, 2 RL steps, then a digest of this process's own parameter shards, and per
step the logged `rollout/*` metrics beside `compute_stats` of both processes' groups together.

Run as `python -m tests.training.multihost_rl_worker WORKDIR` with `JAX_COORDINATOR_ADDRESS`,
`JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` and `XLA_FLAGS=--xla_force_host_platform_device_count=4`.
"""

from __future__ import annotations

import json
import math
import sys

from aepo_jax.parallel.distributed import maybe_initialize_distributed
from tests.training.param_digest import shard_digest


def main(workdir: str) -> None:
    index, count = maybe_initialize_distributed("auto")
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    from aepo_jax.data import PromptPipeline
    from aepo_jax.parallel.multihost import gather_objects
    from aepo_jax.rollout.stats import compute_stats
    from aepo_jax.training.rl_trainer import RLTrainer
    from tests.training.sampling_fixture import (
        digit_examples,
        encode_digits,
        low_token_reward,
        make_sampling_rollout,
        two_process_config,
    )

    cfg = two_process_config(total_steps=2, fsdp=2)  # 4 x 2 over the 8 devices of both processes
    cfg.checkpoint.every = 2

    trainer_graphdef = None
    step_groups = []  # this process's groups of each step

    def rollout_fn(prompts, k, params, key, rng):
        # The sampler of this test runs on this process's devices: gather the global weights to it.
        local = jax.tree.map(jnp.asarray, multihost_utils.process_allgather(params, tiled=True))
        sample = make_sampling_rollout(trainer_graphdef, int(cfg.rollout.max_response_len))
        groups, _ = sample(prompts, k, local, key, rng)
        step_groups.append(groups)
        return groups, compute_stats(groups).as_dict()  # as the composition root's rollout reports them

    def whole_step_stats(groups) -> dict:
        """`rollout/*` of `compute_stats` on every process's groups of a step, NaN written as a record does."""
        stats = compute_stats(groups).as_dict()
        return {f"rollout/{k}": (float(v) if math.isfinite(v) else "nan") for k, v in stats.items()
                if isinstance(v, (int, float))}

    pipeline = PromptPipeline(digit_examples(16), int(cfg.data.prompts_per_step), seed=int(cfg.seed),
                              process_index=index, process_count=count)
    trainer = RLTrainer(cfg, workdir, rollout_fn=rollout_fn, pipeline=pipeline, encode_prompt=encode_digits,
                        reward_fn=low_token_reward, process_index=index)
    trainer_graphdef = trainer.run.graphdef
    initial = shard_digest(trainer.state.params)
    records = trainer.train()
    trainer.close()
    everyone = gather_objects(step_groups)  # [process][step] -> groups
    expected = [whole_step_stats([g for part in everyone for g in part[step]]) for step in range(len(records))]
    print("RESULT " + json.dumps({
        "process": index, "processes": count, "devices": jax.device_count(),
        "local_devices": jax.local_device_count(), "initial": initial, "final": shard_digest(trainer.state.params),
        "steps": [r["step"] for r in records], "loss": [r["loss"] for r in records],
        "trajectories": [r["trajectories"] for r in records], "rounds": int(trainer.state.rounds),
        "local_micro_rows": trainer.local_micro_rows, "expected_rollout": expected,
        "rollout": [{k: v for k, v in r.items() if k.startswith("rollout/")} for r in records],
    }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
