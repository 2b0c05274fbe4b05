"""Checks a launch makes before any model work: settings a run cannot start with are refused by
name before a checkpoint, a tool or an optimiser is built (the composition root and the launchers
call them)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import jax
import ml_collections

if TYPE_CHECKING:
    from aepo_jax.experiment import Environment


def require_runnable_attention(cfg: ml_collections.ConfigDict, platform: str | None = None) -> None:
    """A ValueError unless `model.attention` runs on `platform` (default: this process's
    `jax.default_backend()`), naming the setting to use instead (`models.attention.require_backend_runs_on`).
    Entry points that train call it before any model work; splash and cuDNN otherwise fail at the first
    program, after the checkpoint and optimiser are built."""
    from aepo_jax.models.attention import require_backend_runs_on

    require_backend_runs_on(cfg.model.get("attention") or "dense", platform or jax.default_backend())


def require_judge(reward_names: Iterable[str], env: Environment, what: str) -> None:
    """Refuse, before any rollout, to score with the `llm_judge` reward when `env` has no judge."""
    if "llm_judge" in set(reward_names) and env.judge is None:
        raise ValueError(f"{what} scores with the llm_judge reward (data sources such as gaia, hle, webwalker) but "
                         "no judge is configured: set reward.judge_url and reward.judge_model "
                         "(launch.evaluate: --judge_url, --judge_model)")


def require_mesh_fits_model(cfg: ml_collections.ConfigDict, env: Environment, mesh: Any) -> None:
    """A ValueError unless the `tensor` axis of `mesh` divides the query and key-value heads of the model
    `model_from` builds (`parallel.sharding.require_heads_split`), read without any weight: the GGUF
    policy's config, the checkpoint's config.json or the preset."""
    from aepo_jax.models.hf_checkpoint import checkpoint_config
    from aepo_jax.parallel.sharding import require_heads_split
    from aepo_jax.training.build import model_config_from

    if env.pretrained is not None:
        from flax import nnx

        config, source = nnx.merge(*env.pretrained).config, "the GGUF policy"
    elif cfg.model.get("checkpoint_dir"):
        config = checkpoint_config(cfg.model.checkpoint_dir)
        source = f"the checkpoint in model.checkpoint_dir={cfg.model.checkpoint_dir!r}"
    else:
        config, source = model_config_from(cfg), f"model.preset={cfg.model.preset!r}"
    require_heads_split(config.n_heads, config.n_kv_heads, mesh.shape, source)


def require_known_rewards(reward_names: Iterable[str], what: str) -> None:
    """Refuse, before any rollout, a reward name the registry does not know (a misspelt `reward.name`
    otherwise fails only when the first step's rollout is scored)."""
    from aepo_jax.rewards.registry import REWARDS

    unknown = sorted(set(reward_names) - set(REWARDS))
    if unknown:
        raise ValueError(f"{what} scores with unknown rewards {unknown} (reward.name); known: {sorted(REWARDS)} "
                         "or 'auto'")


def require_prompts_fit(examples: Iterable[dict], encode_prompt: Any, what: str, shown: int = 5) -> None:
    """Encode every prompt once, before the run starts, and refuse the examples whose prompt exceeds
    `rollout.max_prompt_len` all together, by id: found by the step that first draws one, a long prompt
    stops a run hours in, and again at each resume (which redraws the same batch)."""
    too_long, limit = [], None
    for index, example in enumerate(examples):
        try:
            encode_prompt(example)
        except PromptTooLong as err:
            too_long.append(f"{example.get('id', f'#{index}')} ({err.tokens} tokens)")
            limit = err.limit
    if too_long:
        raise ValueError(f"{what}: {len(too_long)} prompts are longer than rollout.max_prompt_len={limit}: "
                         f"{', '.join(too_long[:shown])}{' ...' if len(too_long) > shown else ''}; raise "
                         "rollout.max_prompt_len or leave those examples out of the data")


class PromptTooLong(ValueError):
    """An example's rendered prompt has more tokens than `rollout.max_prompt_len`."""

    def __init__(self, example_id: Any, tokens: int, limit: int):
        super().__init__(f"example {example_id}: prompt has {tokens} tokens > rollout.max_prompt_len={limit}")
        self.tokens, self.limit = tokens, limit
