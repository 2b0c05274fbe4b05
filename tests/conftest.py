"""Test-wide setup: eight fake CPU devices and fast-compile XLA flags, set before
jax is imported anywhere, and the hypothesis profiles.

JAX's persistent compilation cache is off by default here
(`JAX_ENABLE_COMPILATION_CACHE=false`, inherited by the processes tests start):
writing an XLA:CPU executable to it (`executable.serialize()` in jax 0.10.2's
`put_executable_and_time`) crashed a test worker with SIGSEGV twice in about ten
suite-size runs on 2026-12-05 (once in a clean-clone CI run), and a crashed
worker fails the run. A later clean-clone run with the cache off crashed in the
same test (`tests/training/test_validation.py`) inside the compile itself, so
the cache may not be the cause; that test now runs in its own process
(`tests/child_process.ran_in_child_process`). It saved about 6% of the time of `tests/sampling
tests/rollout` (one run each). Set `JAX_ENABLE_COMPILATION_CACHE=true` to use
it anyway (`JAX_COMPILATION_CACHE_DIR`, default `.pytest_cache/jax-compilation-cache`,
every program however short its compile).

Profiles (`HYPOTHESIS_PROFILE=<name>`, default "ci"):
  ci:   derandomized (each test's examples come from a seed fixed by the test
        itself), no example database, no deadline: every run of the suite
        draws the same examples, so a property test cannot fail on one day and
        pass on the next. A failure prints its reproduction blob.
  fuzz: fresh randomness and `FUZZ_FACTOR` times the examples (`make fuzz`).
        Every failure it finds is understood, fixed or documented, and pinned
        with an explicit `@example` so the ci profile checks it from then on.
Per-test example counts go through `tests.property_budget.examples(n)`, which
scales them by the active profile (a bare `@settings(max_examples=n)` would
override the profile).
"""

import os

from hypothesis import settings

from tests.child_process import TEST_COMPILE_FLAGS

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
# Fast compilation for the suite's own process (tests/child_process.py says which flags and why): the
# tests' programs are tiny and compiled once, so optimising their machine code costs more than it saves.
# Processes that tests start get the same flags from tests/child_process.py.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + TEST_COMPILE_FLAGS
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_ENABLE_COMPILATION_CACHE", "false")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache",
                                   "jax-compilation-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

CI_EXAMPLES = 100  # hypothesis' own default: a test without a count gets this many under ci
FUZZ_FACTOR = 10

settings.register_profile(
    "ci", derandomize=True, database=None, print_blob=True, deadline=None, max_examples=CI_EXAMPLES
)
settings.register_profile(
    "fuzz", derandomize=False, database=None, print_blob=True, deadline=None,
    max_examples=CI_EXAMPLES * FUZZ_FACTOR,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    """Under pytest-xdist, a test whose worker dies of a signal runs once more, and the run cannot hang on
    the crash (tests/xdist_crash_rerun.py says why)."""
    from tests.xdist_crash_rerun import register_under_xdist

    register_under_xdist(config)
