"""KL estimators to the reference model and the entropy bonus (spec §3.3).

Per-token estimators of `KL(pi || pi_ref)` from samples of `pi`, with
`d = logp - logp_ref`:

* `k1 = d`
* `k2 = 0.5 * d**2`
* `k3 = exp(-d) + d - 1`, clamped to `[-10, 10]` (low-variance, always >= 0)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

KL_ESTIMATORS = ("k1", "k2", "k3")
K3_CLAMP = 10.0
# exp(-d) is evaluated at d clipped to +-20: there k3 >= 19 > K3_CLAMP, so the
# clipped value is unchanged and exp never overflows to inf (no inf * 0 NaNs).
_K3_EXPONENT_CLAMP = 20.0


def kl_penalty(logp: jax.Array, logp_ref: jax.Array, estimator: str = "k3") -> jax.Array:
    """Per-token KL estimate `[B, T]` of the current policy to the reference.

    Args:
      logp: `[B, T]` current-policy log-probs of the sampled tokens.
      logp_ref: `[B, T]` reference-model log-probs of the same tokens.
      estimator: "k1", "k2" or "k3".
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; known: {list(KL_ESTIMATORS)}")
    dtype = jnp.promote_types(jnp.result_type(logp, logp_ref), jnp.float32)
    d = jnp.asarray(logp, dtype) - jnp.asarray(logp_ref, dtype)  # [B, T]
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * jnp.square(d)
    neg_d = jnp.clip(-d, -_K3_EXPONENT_CLAMP, _K3_EXPONENT_CLAMP)
    k3 = jnp.exp(neg_d) - neg_d - 1.0
    return jnp.clip(k3, -K3_CLAMP, K3_CLAMP)


def entropy_bonus(entropy: jax.Array, entropy_coef: float) -> jax.Array:
    """Per-token loss term `-entropy_coef * H` `[B, T]` (minimising it raises entropy).

    `entropy` must be the differentiable entropy of the current policy
    (`token_logprobs_and_entropy`) for the bonus to have a gradient.
    """
    dtype = jnp.promote_types(jnp.result_type(entropy), jnp.float32)
    return -entropy_coef * jnp.asarray(entropy, dtype)
