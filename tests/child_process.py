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
#
# One codegen part per module (`--xla_cpu_parallel_codegen_split_count=1`, XLA:CPU otherwise splits a large
# module and compiles the parts on LLVM worker threads): three suite workers died of SIGSEGV on 2026-12-05
# inside XLA:CPU's compile of the sampler's decode program (twice in tests/training/test_validation.py,
# once in tests/demo/test_demo_smoke.py), never reproduced alone. Whether the split is the cause is not
# known; with one part tests/sampling/test_sampler_behaviour.py ran in 12.4 s against 18.0 s (one run each).
TEST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
                      "--xla_llvm_disable_expensive_passes=true --xla_cpu_parallel_codegen_split_count=1")


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for a CPU process with `devices` fake devices and the suite's compile settings."""
    if devices < 1:
        raise ValueError(f"a child process needs at least one device, got {devices}")
    return f"--xla_force_host_platform_device_count={devices} {TEST_COMPILE_FLAGS}"


def child_env(devices: int = 1, **overrides: str) -> dict[str, str]:
    """This process's environment for a CPU child with `devices` fake devices (1: as a user runs it)."""
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices), **overrides)


CHILD_TEST_ENV = "AEPO_TEST_IN_CHILD"  # set to a test's node id in the process that runs it alone


def ran_in_child_process(test_file: str, test_name: str, timeout_s: float = 900, retries_on_signal: int = 1,
                         xla_flags: str = "") -> bool:
    """Run one test alone in a fresh pytest process and assert it passed; True in the calling process (its
    test is done), False in that child (which runs the body). A child killed by a signal is run once more
    (`retries_on_signal`), with a warning: XLA:CPU segfaulted a suite worker twice inside this repository's
    `test_validation` evaluation (compile and executable serialisation), never reproduced alone; a fresh
    process keeps that test apart from what earlier tests left in the worker, and a crash in it from
    taking the worker (and with it the run) down. `xla_flags` are added to the child's XLA_FLAGS (XLA reads
    them once per process)."""
    import subprocess
    import sys
    import warnings

    node = f"{test_file}::{test_name}"
    if os.environ.get(CHILD_TEST_ENV) == node:
        return False
    env = dict(os.environ, **{CHILD_TEST_ENV: node})
    if xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {xla_flags}".strip()
    for attempt in range(1 + retries_on_signal):
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", node],
                             check=False, env=env, capture_output=True, text=True, timeout=timeout_s)
        if out.returncode >= 0 or attempt == retries_on_signal:
            break
        warnings.warn(f"{node} died of signal {-out.returncode} in its own process; running it again:\n"
                      f"{out.stderr[-3000:]}", stacklevel=2)
    assert out.returncode == 0, f"{node} failed in its own process ({out.returncode}):\n{out.stdout[-6000:]}\n{out.stderr[-3000:]}"
    return True
