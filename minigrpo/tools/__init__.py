"""Stage 1 of the loop, rollout: the tools a completion may call, and the runner that answers its calls.

- `register_tool`, `Tool`, `TOOLS`, the tool formats and the built-in `calculator` and `python` tools
  (registry.py), each with the JSON schema a chat template declares it by (`tool_schemas`), and the
  check that a format's markers are the template's (`check_format_against_template`);
- `ToolRunner` (runner.py): calls on reused threads, their records (`ToolCall`), `tool_stats`;
- the calculator's worker processes (calculator_pool.py) and the worker program itself, exact
  arithmetic under a deterministic budget (calculator_worker.py, started as
  `python -m minigrpo.tools.calculator_worker`).
The sampler meets the runner at one hook (rollout/tool_turns.py); the tools know text, not tokens or
tensors. Nothing outside this folder imports from inside it: only the names below.
"""

from .calculator_pool import CalculatorError, calculate
from .registry import (
    FORMATS,
    TOOLS,
    Tool,
    ToolError,
    ToolFormat,
    calculator,
    check_format_against_template,
    declared_tools,
    python,
    register_tool,
    tool_schemas,
)
from .runner import ToolCall, ToolRunner, tool_stats

__all__ = [
    "FORMATS",
    "TOOLS",
    "CalculatorError",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolFormat",
    "ToolRunner",
    "calculate",
    "calculator",
    "python",
    "check_format_against_template",
    "declared_tools",
    "register_tool",
    "tool_schemas",
    "tool_stats",
]
