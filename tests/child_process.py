"""The environment of a process a test starts (`python -m launch.train`, a multi-host worker, ...).

One home for the test-only XLA settings, so that children compile with the
same flags as the suite's own process (tests/conftest.py): LLVM backend
optimisation off (the programs are tiny and run once) and, through the
inherited `JAX_COMPILATION_CACHE_DIR`, the suite's persistent compilation
cache. Children that compile the same program with the same device count then
load it from the cache instead of compiling it again.
"""

from __future__ import annotations

import os

# The suite's programs are tiny and each runs a few times, so compiling fast matters more than running
# fast. Measured on one tiny-decoder AdamW train step (2-core machine, CPU seconds of `compile()`):
# XLA's defaults 9.1 s; LLVM backend optimisation off 4.6 s; plus the classic loop emitters instead of
# the MLIR fusion emitters and no expensive LLVM passes 0.8 s, with the step itself about as fast as
# with the first setting. Results agree with the default build within float32 rounding.
TEST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                      "--xla_llvm_disable_expensive_passes=true")


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for a CPU process with `devices` fake devices and the suite's compile settings."""
    if devices < 1:
        raise ValueError(f"a child process needs at least one device, got {devices}")
    return f"--xla_force_host_platform_device_count={devices} {TEST_COMPILE_FLAGS}"


def child_env(devices: int = 1, **overrides: str) -> dict[str, str]:
    """This process's environment for a CPU child with `devices` fake devices (1: as a user runs it)."""
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices), **overrides)
