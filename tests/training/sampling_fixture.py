"""A real (not mocked) rollout for trainer tests: a jitted sampling loop over the
tiny decoder that returns `Trajectory` objects with the sampled tokens, their
log-probs and entropies at the sampling temperature."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from aepo_jax.agent.trajectory import END_LENGTH, Trajectory
from aepo_jax.objectives import token_logprobs_and_entropy


@partial(jax.jit, static_argnums=(0, 3, 4))
def _sample(graphdef, params, prompts, new_tokens: int, temperature: float, key):
    """prompts int32[B, L] -> (tokens [B, N], logp [B, N], entropy [B, N])."""
    model = nnx.merge(graphdef, params)
    batch, length = prompts.shape
    buffer = jnp.concatenate([prompts, jnp.zeros((batch, new_tokens), jnp.int32)], axis=1)  # [B, L+N]

    def body(i, carry):
        buffer, logps, entropies = carry
        logits = model(buffer)[:, length + i - 1]  # [B, V]: causal, so the zeros ahead do not matter
        token = jax.random.categorical(jax.random.fold_in(key, i), logits / temperature)  # [B]
        logp, entropy = token_logprobs_and_entropy(logits[:, None], token[:, None], temperature=temperature)
        buffer = buffer.at[:, length + i].set(token)
        return buffer, logps.at[:, i].set(logp[:, 0]), entropies.at[:, i].set(entropy[:, 0])

    zeros = jnp.zeros((batch, new_tokens), jnp.float32)
    buffer, logps, entropies = jax.lax.fori_loop(0, new_tokens, body, (buffer, zeros, zeros))
    return buffer[:, length:], logps, entropies


def make_sampling_rollout(graphdef, new_tokens: int = 8, temperature: float = 1.0):
    """`rollout_fn(prompts, k, params, key, rng) -> (groups, stats)` for `RLTrainer`."""

    def rollout_fn(prompts, k, params, key, rng):
        del rng  # independent sampling makes no host-side decisions
        prompt_array = jnp.asarray(np.repeat(np.asarray(prompts, np.int32), k, axis=0))  # [P*k, L]
        tokens, logp, entropy = jax.device_get(_sample(graphdef, params, prompt_array, new_tokens, temperature, key))
        groups = []
        for p, prompt in enumerate(prompts):
            group = []
            for j in range(k):
                row = p * k + j
                traj = Trajectory(traj_id=row, prompt_index=p, prompt_ids=list(prompt), root_id=row)
                traj.add_generated(tokens[row].tolist(), logp[row].tolist(), entropy[row].tolist())
                traj.stop_reason = END_LENGTH
                group.append(traj)
            groups.append(group)
        return groups, {"trajectories_per_prompt": float(k), "tool_calls_per_trajectory": 0.0}

    return rollout_fn


def digit_examples(n: int, prompt_len: int = 6, vocab: int = 64, seed: int = 0) -> list[dict]:
    """Examples whose question is a space-separated list of token ids."""
    rng = np.random.default_rng(seed)
    return [{"id": f"q{i}", "question": " ".join(map(str, rng.integers(1, vocab, prompt_len))),
             "answers": ["low"], "data_source": "test"} for i in range(n)]


def encode_digits(example: dict) -> list[int]:
    return [int(x) for x in example["question"].split()]


def low_token_reward(example: dict, trajectory: Trajectory) -> float:
    """Fraction of generated tokens below 16: a dense, learnable signal."""
    del example
    ids = np.asarray(trajectory.response_ids)
    return float(np.mean(ids < 16))


def small_rl_config(factory, total_steps: int = 3):
    """A tiny config of `factory` (a configs/*_tiny.py `get_config`) sized for these rollouts: prompts of
    at most 8 tokens, 8 new tokens, sequences of 16, a checkpoint every 2 steps and at the last one, no
    progress bar."""
    c = factory()
    c.train.total_steps = total_steps
    c.train.max_seq_len = 16
    c.train.length_bucket = 16
    c.rollout.max_prompt_len = 8  # digit_examples' prompts are 6 tokens
    c.rollout.max_response_len = 8
    if c.objective.get("overlong_shaping"):
        c.objective.overlong_buffer_len = 4  # DAPO's Lc must stay below the budget
    c.checkpoint.every = 2
    c.checkpoint.async_save = True
    c.log.progress_bar = False
    c.log.tensorboard = False
    return c


def two_process_config(total_steps: int, fsdp: int):
    """`configs/aepo_tiny.py` as small as the two-process tests allow (what they check is that two
    processes agree, not the sizes): 1 prompt per process, k = 2, one mini-batch, 4 new tokens,
    sequences of 16, a `(data, fsdp)` mesh over both processes' devices, synchronous checkpoints."""
    from configs.aepo_tiny import get_config

    c = get_config()
    c.model.vocab_size = 64
    c.model.n_layers = 1
    c.data.prompts_per_step = 2  # global: 1 prompt per process
    c.rollout.k = 2
    c.train.mini_batch_prompts = 2  # global: one mini-batch of one group per process
    c.train.max_seq_len = 16
    c.train.length_bucket = 16
    c.rollout.max_prompt_len = 12  # digit_examples' prompts are 6 tokens
    c.rollout.max_response_len = 4
    c.train.total_steps = total_steps
    c.mesh.shape = {"data": -1, "fsdp": fsdp, "tensor": 1}
    c.checkpoint.async_save = False
    c.log.progress_bar = False
    c.log.tensorboard = False
    return c


def sampling_trainer(config, workdir, rollout_fn=None):
    """An `RLTrainer` of the tiny model over 16 digit prompts, rolling out with `make_sampling_rollout`
    unless given another `rollout_fn`."""
    from aepo_jax.data import PromptPipeline
    from aepo_jax.training.rl_trainer import RLTrainer
    from tests.training.fixtures import tiny_model

    graphdef, params = tiny_model(seed=config.seed)
    pipeline = PromptPipeline(digit_examples(16), config.data.prompts_per_step, seed=config.seed)
    return RLTrainer(config, str(workdir), rollout_fn=rollout_fn or make_sampling_rollout(graphdef),
                     pipeline=pipeline, encode_prompt=encode_digits, reward_fn=low_token_reward, graphdef=graphdef,
                     params=params)
