"""Tools the agent calls (spec §4): python sandbox, search, browser, LLM judge, and the registry."""

from aepo_jax.tools.base import Tool, ToolResult
from aepo_jax.tools.browse import BrowseTool
from aepo_jax.tools.llm_judge import LLMJudgeClient, parse_verdict
from aepo_jax.tools.python_exec import PythonSandbox, SandboxLimits, SandboxResult
from aepo_jax.tools.python_tool import PythonTool
from aepo_jax.tools.registry import ToolRegistry
from aepo_jax.tools.search import SearchTool

__all__ = [
    "BrowseTool",
    "LLMJudgeClient",
    "PythonSandbox",
    "PythonTool",
    "SandboxLimits",
    "SandboxResult",
    "SearchTool",
    "Tool",
    "ToolRegistry",
    "ToolResult",
    "parse_verdict",
]
