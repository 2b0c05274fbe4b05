"""Every script in benchmarks/ follows one convention: `--json OUT`, and nothing written unless asked."""

from __future__ import annotations

import os
import subprocess
import sys
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
