"""Device meshes and logical-axis sharding of model state and batches."""

from aepo_jax.parallel.compilation_cache import enable_compilation_cache
from aepo_jax.parallel.mesh import MESH_AXES, make_mesh
from aepo_jax.parallel.sharding import (
    LOGICAL_AXIS_RULES,
    batch_sharding,
    logical_to_spec,
    named_sharding,
    shard_state,
    state_shardings,
)

__all__ = [
    "LOGICAL_AXIS_RULES",
    "MESH_AXES",
    "batch_sharding",
    "enable_compilation_cache",
    "logical_to_spec",
    "make_mesh",
    "named_sharding",
    "shard_state",
    "state_shardings",
]
from aepo_jax.parallel.distributed import detect_multihost, maybe_initialize_distributed  # noqa: F401
