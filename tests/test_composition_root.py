"""The composition root is the only place the rollout pieces are built from a config (DESIGN.md).

Outside tests/ and benchmarks/, `LoopConfig(`, `RolloutConfig(` and `Sampler(`
are each constructed in exactly one module (a default inside the class's own
module aside), so the wiring cannot drift apart in parallel copies again.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("aepo_jax", "launch", "configs", "notebooks")
# class -> (the module allowed to construct it, the class's own module)
EXPECTED = {
    "LoopConfig": ("aepo_jax/experiment.py", "aepo_jax/agent/loop.py"),
    "RolloutConfig": ("aepo_jax/experiment.py", "aepo_jax/rollout/strategies.py"),
    "Sampler": ("aepo_jax/rollout/agent_sampler.py", "aepo_jax/sampling/sampler.py"),
}


def constructing_modules(name: str) -> set[str]:
    pattern = re.compile(r"(?<![\w.])" + name + r"\(")
    found = set()
    for top in SOURCES:
        for path in (REPO / top).rglob("*"):
            if path.suffix not in (".py", ".ipynb") or not path.is_file():
                continue
            text = path.read_text(encoding="utf-8")
            lines = [line for line in text.splitlines() if not line.lstrip().startswith(("#", "class "))]
            if any(pattern.search(line) for line in lines):
                found.add(path.relative_to(REPO).as_posix())
    return found


def test_each_rollout_piece_is_constructed_in_exactly_one_module():
    for name, (builder, own_module) in EXPECTED.items():
        others = constructing_modules(name) - {own_module}
        assert others == {builder}, f"{name}( is constructed in {sorted(others)}; only {builder} should build it"


def test_the_search_finds_constructions():
    assert "aepo_jax/experiment.py" in constructing_modules("LoopConfig")
    assert "aepo_jax/evaluation/driver.py" in constructing_modules("EvalConfig")
