"""No import cycles between the packages of aepo_jax/ (DESIGN.md: packages import downward only).

Every `import` / `from ... import` in every module (module level and inside
functions alike, `if TYPE_CHECKING:` blocks aside) becomes an edge between
top-level packages of aepo_jax (`aepo_jax.agent.loop` -> `agent`; a top-level
module such as `aepo_jax/experiment.py` is its own node). A cycle in that graph
fails the test with the modules that make each of its edges.
"""

from __future__ import annotations

import ast
import gc
import itertools
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "aepo_jax"


def _unit(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if parts[0] == "aepo_jax" and len(parts) > 1 else None


def _parse(source: str) -> ast.Module:
    """`ast.parse` with the cyclic GC paused.

    CPython 3.11 keeps the AST converter's recursion counter in module state:
    a finalizer run by the GC in the middle of a parse (an asyncio task of an
    earlier test logging its traceback, which parses source for its carets)
    re-enters the converter and the outer parse fails with "AST constructor
    recursion depth mismatch".
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def package_graph(root: Path = ROOT) -> dict[str, dict[str, list[str]]]:
    """source package -> target package -> modules of the source that import the target."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent).with_suffix("")
        module = ".".join(relative.parts)
        source = _unit(module)
        if source is None or source == "__init__":  # aepo_jax/__init__.py re-exports; it is not a package
            continue
        tree = _parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names
                                         if node.module == "aepo_jax"]
                if node.module == "aepo_jax":
                    names = names[1:]
            else:
                continue
            for name in names:
                target = _unit(name)
                if target is not None and target != source:
                    graph[source][target].append(module)
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle as a list of packages (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_graph_sees_known_edges():
    graph = package_graph()
    assert "agent" in graph["rollout"] and "objectives" in graph["training"]
    assert "training" in graph["experiment"]


def test_finder_reports_a_planted_cycle():
    assert find_cycle({"a": {"b": ["a.x"]}, "b": {"c": ["b.y"]}, "c": {"a": ["c.z"]}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": ["a.x"]}, "b": {}}) is None


def test_no_package_level_import_cycles():
    graph = package_graph()
    cycle = find_cycle(graph)
    if cycle:
        edges = [f"{a} -> {b} (in {', '.join(sorted(set(graph[a][b])))})" for a, b in itertools.pairwise(cycle)]
        raise AssertionError("package import cycle:\n  " + "\n  ".join(edges))
