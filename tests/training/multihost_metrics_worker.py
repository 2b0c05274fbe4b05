"""One process of the two-process metrics test (`test_multihost_metrics.py`): one RL step of
`configs/aepo_tiny.py` on a mesh spanning both processes, where the processes' trajectories call
different tools (as when each host's policy samples its own prompts): process 0's call search and
python, both working; process 1's call python twice, both failing. Prints the step's logged metrics,
`rollout_metrics` of both processes' groups together, and the first numbers the rollout's numpy
generator (the branch decisions') would draw.

Run as `python -m tests.training.multihost_metrics_worker WORKDIR` with `JAX_COORDINATOR_ADDRESS`,
`JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` and `XLA_FLAGS=--xla_force_host_platform_device_count=4`.
"""

from __future__ import annotations

import copy
import json
import sys

from aepo_jax.parallel.distributed import maybe_initialize_distributed

TOOL_CALLS = {0: [("search", True), ("python", True)], 1: [("python", False), ("python", False)]}


def main(workdir: str) -> None:
    index, count = maybe_initialize_distributed("auto")
    import jax
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    from aepo_jax.agent.trajectory import ToolStep
    from aepo_jax.data import PromptPipeline
    from aepo_jax.parallel.multihost import gather_objects
    from aepo_jax.training.rl_trainer import RLTrainer
    from aepo_jax.training.rollout_batch import rollout_metrics
    from tests.training.sampling_fixture import (
        digit_examples,
        encode_digits,
        low_token_reward,
        make_sampling_rollout,
        two_process_config,
    )

    cfg = two_process_config(total_steps=1, fsdp=1)
    cfg.checkpoint.every = 0

    trainer_graphdef = None
    rolled = []  # this process's groups
    draws = []  # per rollout, the first numbers its numpy generator would give

    def rollout_fn(prompts, k, params, key, rng):
        draws.append(copy.deepcopy(rng).random(3).tolist())  # a copy: the trainer's draws stay as they were
        local = jax.tree.map(jnp.asarray, multihost_utils.process_allgather(params, tiled=True))
        groups, stats = make_sampling_rollout(trainer_graphdef, int(cfg.rollout.max_response_len))(
            prompts, k, local, key, rng)
        for group in groups:
            for traj in group:
                traj.tool_steps = [ToolStep(tag, "x", "r", ok, 1, 2) for tag, ok in TOOL_CALLS[index]]
        rolled.extend(groups)
        return groups, stats

    pipeline = PromptPipeline(digit_examples(16), int(cfg.data.prompts_per_step), seed=int(cfg.seed),
                              process_index=index, process_count=count)
    trainer = RLTrainer(cfg, workdir, rollout_fn=rollout_fn, pipeline=pipeline, encode_prompt=encode_digits,
                        reward_fn=low_token_reward, process_index=index)
    trainer_graphdef = trainer.run.graphdef
    try:
        (record,) = trainer.train()
    finally:
        trainer.close()
    everyone = [g for part in gather_objects(rolled) for g in part]
    expected = rollout_metrics(everyone, [[low_token_reward(None, t) for t in g] for g in everyone])
    print("RESULT " + json.dumps({
        "process": index, "draws": draws, "expected": expected,
        "record": {k: v for k, v in record.items() if isinstance(v, float) and not k.endswith("_s")},
    }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
