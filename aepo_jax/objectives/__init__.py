"""Pure-functional RL objectives: policy losses, advantages, KL, log-probs (spec §3).

Public API (docs/interfaces.md):

    preset = get_preset("dapo")
    loss, metrics = policy_loss(preset.loss_config(), logp=..., logp_old=..., advantages=..., mask=...)
    loss, metrics = policy_loss(loss_config("aepo", clip_high=0.28), logp=..., ...)
    advantages, adv_metrics = compute_advantages(preset, rewards, group_ids, mask, ...)
    kl = kl_penalty(logp, logp_ref, "k3")
    logp, entropy = token_logprobs_and_entropy(logits, targets, temperature=1.0, chunk_size=None)
"""

from aepo_jax.objectives.advantage_dispatch import compute_advantages
from aepo_jax.objectives.advantages import (
    dr_grpo_advantages,
    dynamic_sampling_keep,
    entropy_aware_advantages,
    group_relative_advantages,
    grpo_advantages,
    masked_whiten,
    overlong_penalty,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
)
from aepo_jax.objectives.aggregation import (
    LOSS_AGG_MODES,
    aggregate,
    loss_denominator,
    seq_mean_token_mean,
    seq_mean_token_sum_norm,
    token_mean,
)
from aepo_jax.objectives.kl import entropy_bonus, kl_penalty
from aepo_jax.objectives.logprobs import token_logprobs_and_entropy
from aepo_jax.objectives.policy_loss import LossConfig, LossParts, policy_loss
from aepo_jax.objectives.presets import (
    PRESETS,
    AlgorithmPreset,
    get_preset,
    loss_config,
    make_preset,
)
from aepo_jax.objectives.surrogates import SURROGATES
from aepo_jax.objectives.tree_advantages import (
    gigpo_advantages,
    hard_attribution_advantages,
    shared_prefix_lengths,
)

__all__ = [
    "LOSS_AGG_MODES",
    "PRESETS",
    "SURROGATES",
    "AlgorithmPreset",
    "LossConfig",
    "LossParts",
    "aggregate",
    "compute_advantages",
    "dr_grpo_advantages",
    "dynamic_sampling_keep",
    "entropy_aware_advantages",
    "entropy_bonus",
    "get_preset",
    "gigpo_advantages",
    "group_relative_advantages",
    "grpo_advantages",
    "hard_attribution_advantages",
    "kl_penalty",
    "loss_config",
    "loss_denominator",
    "make_preset",
    "masked_whiten",
    "overlong_penalty",
    "policy_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
    "shared_prefix_lengths",
    "token_logprobs_and_entropy",
    "token_mean",
]
