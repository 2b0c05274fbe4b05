"""The environment of a process a test starts (`python -m launch.train`, a multi-host worker, ...).

One home for the test-only XLA settings, so that children compile with the
same flags as the suite's own process (tests/conftest.py): LLVM backend
optimisation off (the programs are tiny and run once). The persistent
compilation cache settings are inherited too (off by default; conftest.py
says why).
"""

from __future__ import annotations

import os

# The suite's programs are tiny and each runs a few times, so compiling fast matters more than running
# fast. `python -m benchmarks.compile_flags_bench` on one tiny-decoder AdamW train step (2-core machine,
# one other job running; CPU seconds of `compile()`, then ms per step): XLA's defaults 5.8 s / 8.7 ms;
# LLVM backend optimisation off 2.8 s / 22 ms; plus XLA's classic loop emitters instead of the MLIR
# fusion emitters 0.5 s / 30 ms; no expensive LLVM passes on top changes little there but is kept
# (an earlier measurement of the same program: 1.1 -> 0.8 s). Same loss to float32 rounding.
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
