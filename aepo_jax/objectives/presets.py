"""Named algorithm presets: one config word selects a whole algorithm (spec §2, §3, §7).

`get_preset("dapo")` returns the surrogate, advantage estimator, clip values,
aggregation, rollout strategy and shaping switches of DAPO; a config may
override single fields with `dataclasses.replace`.

This module is the one home of the loss defaults: each surrogate's clip
bounds and dual clip (`SURROGATE_CLIPS`) and the default aggregation
(`DEFAULT_LOSS_AGG`). `policy_loss` takes a `LossConfig` built here
(`AlgorithmPreset.loss_config()`, or `loss_config(surrogate, **overrides)`).
"""

from __future__ import annotations

import dataclasses

from aepo_jax.objectives.advantage_dispatch import ADVANTAGES
from aepo_jax.objectives.advantages import ENTROPY_ADV_SCOPES
from aepo_jax.objectives.aggregation import check_loss_agg
from aepo_jax.objectives.kl import KL_ESTIMATORS
from aepo_jax.objectives.policy_loss import LossConfig
from aepo_jax.objectives.surrogates import SURROGATES
from aepo_jax.objectives.tree_advantages import GIGPO_NORMS

ADVANTAGE_ESTIMATORS = tuple(ADVANTAGES)
ROLLOUT_STRATEGIES = ("independent", "arpo", "aepo")

# (clip_low el, clip_high eh, dual_clip_c) each surrogate uses unless a preset or config says otherwise.
SURROGATE_CLIPS: dict[str, tuple[float, float, float | None]] = {
    "ppo": (0.2, 0.2, 3.0),  # PPO / GRPO: symmetric 0.2, dual clip c = 3 (spec §7)
    "gppo": (0.2, 0.2, 3.0),
    "aepo": (0.2, 0.2, 3.0),
    "cispo": (1.0, 0.28, None),  # el = 1 puts the lower bound at 0 (no lower clip); no dual clip
    "gspo": (3e-4, 4e-4, 3.0),  # GSPO's sequence-ratio clip (1 - 3e-4, 1 + 4e-4)
}
DEFAULT_LOSS_AGG = "token_mean"


def loss_config(surrogate: str, **overrides) -> LossConfig:
    """The `LossConfig` of a bare surrogate: its `SURROGATE_CLIPS`, `DEFAULT_LOSS_AGG`, no KL or
    entropy term; `overrides` replace fields (a clip bound given as None keeps the surrogate's)."""
    if surrogate not in SURROGATE_CLIPS:
        raise ValueError(f"unknown policy-loss algorithm {surrogate!r}; known: {sorted(SURROGATE_CLIPS)}")
    low, high, dual = SURROGATE_CLIPS[surrogate]
    fields = {"surrogate": surrogate, "clip_low": low, "clip_high": high, "dual_clip_c": dual,
              "loss_agg": DEFAULT_LOSS_AGG, "kl_coef": 0.0, "kl_estimator": "k3", "entropy_coef": 0.0}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"unknown LossConfig fields {unknown}; known: {sorted(fields)}")
    for name in ("clip_low", "clip_high"):
        if overrides.get(name, 0.0) is None:
            overrides.pop(name)
    return LossConfig(**(fields | overrides))


@dataclasses.dataclass(frozen=True)
class AlgorithmPreset:
    """Everything that distinguishes one RL algorithm from another in this codebase.

    Attributes:
      name: preset name.
      surrogate: policy-loss surrogate ("ppo", "gppo", "aepo", "cispo", "gspo").
      advantage: advantage estimator (one of `ADVANTAGE_ESTIMATORS`).
      clip_low, clip_high: `el`, `eh` of spec §3.1 (`make_preset` fills the surrogate's).
      dual_clip_c: dual-clip constant, None = off.
      loss_agg: aggregation mode of spec §3 (default `DEFAULT_LOSS_AGG`).
      rollout: "independent" (§2.1), "arpo" (§2.2) or "aepo" (§2.3).
      entropy_advantage: AEPO entropy-aware advantage reshape (§3.2).
      entropy_advantage_coef: its `a`.
      entropy_advantage_scope: "batch" or "group".
      dynamic_sampling: DAPO's filter of all-equal-reward groups.
      overlong_shaping: DAPO's overlong reward shaping.
      overlong_buffer_len: DAPO's `Lc`, below `Lmax` (`rollout.max_response_len`); None: the
        paper's share of the budget, 4096 / 20480 = 0.2 `Lmax` (`advantage_dispatch.overlong_buffer_len`).
      overlong_penalty_factor: scale of the overlong penalty.
      hard_attribution: ARPO hard attribution over shared prefixes.
      kl_coef: KL-to-reference weight (in the loss, or in the reward when
        `kl_in_reward`).
      kl_estimator: "k1", "k2" or "k3".
      kl_in_reward: Reinforce++: KL penalty inside the token reward.
      entropy_coef: entropy-bonus weight.
      gigpo_gamma, gigpo_omega, gigpo_norm: GiGPO constants.
    """

    name: str
    surrogate: str
    advantage: str
    clip_low: float
    clip_high: float
    dual_clip_c: float | None
    loss_agg: str = DEFAULT_LOSS_AGG
    rollout: str = "independent"
    entropy_advantage: bool = False
    entropy_advantage_coef: float = 0.2
    entropy_advantage_scope: str = "batch"
    dynamic_sampling: bool = False
    overlong_shaping: bool = False
    overlong_buffer_len: int | None = None
    overlong_penalty_factor: float = 1.0
    hard_attribution: bool = False
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    gigpo_gamma: float = 0.95
    gigpo_omega: float = 1.0
    gigpo_norm: str = "mean_norm"

    def __post_init__(self) -> None:
        choices = {
            "surrogate": (self.surrogate, tuple(SURROGATES)),
            "advantage": (self.advantage, ADVANTAGE_ESTIMATORS),
            "rollout": (self.rollout, ROLLOUT_STRATEGIES),
            "entropy_advantage_scope": (self.entropy_advantage_scope, ENTROPY_ADV_SCOPES),
            "kl_estimator": (self.kl_estimator, KL_ESTIMATORS),
            "gigpo_norm": (self.gigpo_norm, GIGPO_NORMS),
        }
        for field, (value, known) in choices.items():
            if value not in known:
                raise ValueError(f"preset {self.name!r}: unknown {field} {value!r}; "
                                 f"known: {list(known)}")
        check_loss_agg(self.loss_agg)
        if self.surrogate == "cispo" and self.dual_clip_c is not None:
            raise ValueError(f"preset {self.name!r}: CISPO takes no dual clip")
        if self.overlong_buffer_len is not None and self.overlong_buffer_len <= 0:
            raise ValueError(f"preset {self.name!r}: overlong_buffer_len must be > 0 or None, "
                             f"got {self.overlong_buffer_len}")
        if self.hard_attribution and self.advantage not in ("grpo", "dr_grpo"):
            raise ValueError(f"preset {self.name!r}: hard attribution needs a per-trajectory "
                             f"advantage (grpo or dr_grpo), got {self.advantage!r}")

    def loss_config(self) -> LossConfig:
        """The `policy_loss` settings (KL goes to the loss unless it is in the reward)."""
        return LossConfig(surrogate=self.surrogate, clip_low=self.clip_low, clip_high=self.clip_high,
                          dual_clip_c=self.dual_clip_c, loss_agg=self.loss_agg,
                          kl_coef=0.0 if self.kl_in_reward else self.kl_coef, kl_estimator=self.kl_estimator,
                          entropy_coef=self.entropy_coef)


def make_preset(name: str, surrogate: str, advantage: str, **fields) -> AlgorithmPreset:
    """An `AlgorithmPreset` whose clip bounds and dual clip are the surrogate's (`SURROGATE_CLIPS`)
    unless `fields` set them."""
    if surrogate not in SURROGATE_CLIPS:
        raise ValueError(f"preset {name!r}: unknown surrogate {surrogate!r}; known: {sorted(SURROGATE_CLIPS)}")
    low, high, dual = SURROGATE_CLIPS[surrogate]
    return AlgorithmPreset(name, surrogate, advantage, **({"clip_low": low, "clip_high": high,
                                                          "dual_clip_c": dual} | fields))


_P = make_preset
PRESETS: dict[str, AlgorithmPreset] = {
    # The paper's GRPO baseline: ARPO's machinery (spec §2.3), so ARPO's token_mean (the spec's
    # default, §3); the GRPO paper's seq_mean_token_mean is the override loss_agg="seq_mean_token_mean".
    "grpo": _P("grpo", "ppo", "grpo"),
    # Dr. GRPO: no std division, token sum over a constant max_len.
    "dr_grpo": _P("dr_grpo", "ppo", "dr_grpo", loss_agg="seq_mean_token_sum_norm"),
    # Reinforce++: k1 KL inside the token reward. 0.01 is OpenRLHF's usual
    # init_kl_coef; the spec leaves the value open.
    "reinforce_pp": _P("reinforce_pp", "ppo", "reinforce_pp", kl_in_reward=True, kl_coef=0.01,
                       kl_estimator="k1"),
    "reinforce_pp_baseline": _P("reinforce_pp_baseline", "ppo", "reinforce_pp_baseline"),
    # DAPO: clip-higher, dynamic sampling, overlong shaping. Lc is the paper's share of the budget
    # (4096 of 20480 -> 0.2 Lmax): a fixed 4096 would cover all of a 4096-token budget.
    "dapo": _P("dapo", "ppo", "grpo", clip_high=0.28, dynamic_sampling=True,
               overlong_shaping=True),
    # CISPO: el = 1 (no lower clip), eh = 0.28, no dual clip (SURROGATE_CLIPS).
    "cispo": _P("cispo", "cispo", "grpo"),
    "gppo": _P("gppo", "gppo", "grpo"),
    # GiGPO needs shared anchor states; the ARPO tree makes them at branch points.
    "gigpo": _P("gigpo", "ppo", "gigpo", rollout="arpo"),
    # ARPO: soft attribution (plain GRPO) by default; hard_attribution is the switch.
    "arpo": _P("arpo", "ppo", "grpo", rollout="arpo"),
    "aepo": _P("aepo", "aepo", "grpo", rollout="aepo", entropy_advantage=True),
    # GSPO: sequence ratio clipped at (1 - 3e-4, 1 + 4e-4) (SURROGATE_CLIPS), sequence-level mean.
    "gspo": _P("gspo", "gspo", "grpo", loss_agg="seq_mean_token_mean"),
}


def get_preset(name: str) -> AlgorithmPreset:
    """The preset called `name`; unknown names raise a ValueError listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm preset {name!r}; known: {sorted(PRESETS)}") from None
