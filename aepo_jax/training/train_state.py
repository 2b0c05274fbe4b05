"""The pytree a training run carries and checkpoints (DESIGN.md, Trainer)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct


@struct.dataclass
class TrainState:
    """Everything the jitted step reads and writes.

    Attributes:
      step: int32 scalar, number of optimiser updates applied (drives the lr schedule).
      params: float32 master parameters (an `nnx.State` from `nnx.split`).
      opt_state: optax state for `params`.
      rng: uint32[2] raw PRNG key data (saved by orbax as a plain array).
      rounds: int32 scalar, completed trainer steps (one RL step = rollout plus
        `ppo_epochs` x mini-batch updates); checkpoints and metrics are indexed by it.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    rounds: jax.Array = struct.field(default_factory=lambda: jnp.zeros((), jnp.int32))

    @classmethod
    def create(cls, params: Any, tx: optax.GradientTransformation, seed: int) -> TrainState:
        return cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params),
            rng=jax.random.key_data(jax.random.key(seed)),
            rounds=jnp.zeros((), jnp.int32),
        )

    def next_rng(self) -> tuple[TrainState, jax.Array]:
        """Split the carried key: returns (state with the new key, a fresh subkey)."""
        key = jax.random.wrap_key_data(self.rng)
        key, sub = jax.random.split(key)
        return self.replace(rng=jax.random.key_data(key)), sub


def train_state_shardings(state: TrainState, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh) -> TrainState:
    """NamedShardings for every leaf of `state` (same structure).

    Parameters follow the logical-axis rules of `aepo_jax.parallel`; optimiser
    moments mirror their parameter's sharding (`optax.tree_map_params`); the
    step, the RNG and optimiser counters are replicated.
    """
    from aepo_jax.parallel import state_shardings

    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    params = state_shardings(state.params, mesh)
    opt_state = optax.tree_map_params(tx, lambda _, sharding: sharding, state.opt_state, params,
                                      transform_non_params=lambda _: replicated)
    return TrainState(step=replicated, params=params, opt_state=opt_state, rng=replicated, rounds=replicated)


def batch_shardings(batch: dict[str, Any], mesh: jax.sharding.Mesh) -> dict[str, Any]:
    """Batch-major sharding (axis 0 over the data axes) for every array of `batch`."""
    from aepo_jax.parallel import batch_sharding

    return {key: batch_sharding(mesh, jnp.ndim(value)) for key, value in batch.items()}
