"""Every script in benchmarks/ follows one convention: `--json OUT`, and nothing written unless asked."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Scripts are the modules that run as a program; the others (bench_json, branch_scenarios) are their helpers.
SCRIPTS = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if '__name__ == "__main__"' in p.read_text())


def test_there_are_benchmarks_to_check():
    assert {"packing_bench", "rollout_bench", "sampler_bench", "train_bench"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_help_offers_json_out(script):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-m", f"benchmarks.{script}", "--help"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--json" in out.stdout, f"benchmarks/{script}.py has no --json OUT flag"
    assert "--out" not in out.stdout.replace("--out-", ""), f"benchmarks/{script}.py still takes --out"


def test_no_benchmark_defaults_to_writing_into_the_repository():
    """The default of every `--json` is None: a plain run prints its table and writes nothing."""
    for script in SCRIPTS:
        text = (REPO / "benchmarks" / f"{script}.py").read_text()
        assert 'default="benchmarks/' not in text and "default=Path(" not in text, script


def test_rollout_bench_counts_tracing_lowering_and_compiling_of_a_new_program():
    """The rollout bench takes a run's on-the-spot compile seconds out of its seconds: every jax event of
    making a program must reach its count (regression: only XLA's compile counted, not tracing or lowering)."""
    import jax
    import jax.numpy as jnp

    from benchmarks import rollout_bench

    seen: list[tuple[str, float]] = []

    def listen(event: str, seconds: float, **_) -> None:
        seen.append((event, seconds))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        before, compiles_before = dict(rollout_bench._COMPILE_SECONDS), rollout_bench._BACKEND_COMPILES[0]
        spot_before = len(rollout_bench._ON_THE_SPOT)
        inner = jax.jit(lambda x: jnp.sin(x) * 2.0)  # traced inside the outer trace: its events nest in the outer's
        start = time.perf_counter()
        jax.jit(lambda x: jnp.tanh(inner(x)) * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
        wall = time.perf_counter() - start
        on_the_spot = [(event, seconds) for event, seconds in seen if event in rollout_bench.COMPILE_EVENTS]
        # A compile on another thread (the sampler's background compiles) is counted apart: it is not
        # taken out of a run's seconds.
        worker = threading.Thread(target=lambda: jax.jit(lambda x: jnp.cos(x) - 2.0)(jnp.arange(5.0)).block_until_ready())
        worker.start()
        worker.join()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)  # no listener left behind for later tests
    made = [(event, seconds) for event, seconds in seen if event in rollout_bench.COMPILE_EVENTS]
    background = made[len(on_the_spot):]
    assert {event for event, _ in on_the_spot} == set(rollout_bench.COMPILE_EVENTS), seen
    assert {event for event, _ in background} == set(rollout_bench.COMPILE_EVENTS), seen
    # Every event counted, nested ones once: the union of the intervals, within the call's own wall time.
    assert len(rollout_bench._ON_THE_SPOT) - spot_before == len(on_the_spot)
    spot = rollout_bench.on_the_spot_seconds(spot_before)
    assert max(seconds for _, seconds in on_the_spot) <= spot + 1e-9 and spot <= wall + 1e-3
    assert rollout_bench.on_the_spot_seconds(len(rollout_bench._ON_THE_SPOT)) == 0.0
    behind = rollout_bench._COMPILE_SECONDS["background"] - before["background"]
    assert behind == pytest.approx(sum(seconds for _, seconds in background), abs=1e-9)
    xla_compiles = sum(event == rollout_bench.BACKEND_COMPILE_EVENT for event, _ in seen)
    assert xla_compiles >= 2 and rollout_bench._BACKEND_COMPILES[0] - compiles_before == xla_compiles


def test_on_the_spot_compile_time_is_the_union_of_nested_and_separate_intervals():
    from benchmarks import rollout_bench

    since = len(rollout_bench._ON_THE_SPOT)
    rollout_bench._ON_THE_SPOT.extend([(2.0, 3.0), (0.0, 10.0), (12.0, 13.0), (12.5, 14.0)])
    try:
        assert rollout_bench.on_the_spot_seconds(since) == pytest.approx(10.0 + 2.0)  # [0, 10] and [12, 14]
    finally:
        del rollout_bench._ON_THE_SPOT[since:]
