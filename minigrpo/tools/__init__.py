"""Stage 1 of the loop, rollout: the tools a completion may call, and the runner that answers its calls.

- `register_tool`, `Tool`, `TOOLS`, the tool formats and the built-in `calculator` and `python` tools
  (registry.py), each with the JSON schema a chat template declares it by (`tool_schemas`), and the
  check that a format's markers are the template's (`check_format_against_template`);
- `ToolRunner` (runner.py): calls on reused threads, their records (`ToolCall`), `tool_stats`;
- the calculator's worker processes (calculator_pool.py) and the worker program itself, exact
  arithmetic under a deterministic budget (calculator_worker.py, started as
  `python -m minigrpo.tools.calculator_worker`).
The sampler meets the runner at one hook (rollout/tool_turns.py); the tools know text, not tokens or
tensors. Nothing outside this folder imports from inside it: only the names below. They are imported on
first use: a calculator worker, which starts by running this file, then imports sympy and the verifier
alone, not the registry's torch (the model's tool schemas).
"""

import importlib

# public name -> its module here: each imported on first use
_ON_FIRST_USE = {
    "CalculatorError": "calculator_pool",
    "calculate": "calculator_pool",
    "FORMATS": "registry",
    "TOOLS": "registry",
    "Tool": "registry",
    "ToolError": "registry",
    "ToolFormat": "registry",
    "calculator": "registry",
    "check_format_against_template": "registry",
    "declared_tools": "registry",
    "python": "registry",
    "register_tool": "registry",
    "tool_schemas": "registry",
    "ToolCall": "runner",
    "ToolRunner": "runner",
    "tool_stats": "runner",
}


def __getattr__(name: str):
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_ON_FIRST_USE[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


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
