"""Stage 1 of the loop, rollout: the tools a completion may call, and the formats it writes a call in.

In: a tool's name and settings (`register_tool`), or a tool format's name. Out: `TOOLS` and `FORMATS`,
which the runner (runner.py) reads calls and writes responses by; `check_tools` says what is wrong with a
run's tool settings. It knows text and functions; not tokens, rows, threads or the sampler.

Two formats (`FORMATS`):
  calc   `<calc>347*56</calc>` answered `<out>19432</out>`: compact, for tiny tokenizers; the body is
         the calculator's expression.
  qwen3  Qwen3's chat template: the model writes `<tool_call>\\n{"name": ..., "arguments": {...}}\\n
         </tool_call>`, its assistant turn ends there, and the response comes back in a user turn as
         `<tool_response>\\n...\\n</tool_response>`, after which a new assistant turn opens.
The call's end marker must be one token of the tokenizer: the sampler watches for that id.

Two tools are registered (`register_tool` adds yours, as `register_reward` does rewards):
  calculator  exact arithmetic through the verifier's bounded parser, never eval (calculator_worker.py:
              its budget; calculator_pool.py: the worker processes it runs in): an integer or reduced
              fraction, or 15 significant digits for an irrational value.
  python      the code in the verifier's sandbox (verifier/programs/code.py, all its guarantees), its stdout
              (truncated) or its error's last line.
A tool raises ToolError for a call it cannot answer, and TimeoutError when it stops itself at its own
time limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import check_max_tool_calls, check_tool_settings
from ..model import check_tool_schemas
from ..verifier import SandboxConfig, run_cases
from .calculator_pool import CalculatorError, calculate


# --- formats --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolFormat:
    """How a call is written and how its response is put back into the completion."""

    call_start: str  # opens a call
    call_end: str  # closes it: one token, the id the sampler pauses on
    response_start: str  # written before the response (the observation starts here)
    response_end: str  # and after it (the observation ends here)
    tool: str | None  # the one tool the call's body is the argument of; None: the body is JSON naming it


FORMATS = {
    "calc": ToolFormat("<calc>", "</calc>", "<out>", "</out>", tool="calculator"),
    # Qwen3's chat template (tokenizer_config.json of Qwen/Qwen3-*): a tool message is rendered as
    # "<|im_start|>user\n<tool_response>\n" + content + "\n</tool_response><|im_end|>\n", after the
    # assistant turn that made the call has ended with <|im_end|>.
    "qwen3": ToolFormat(
        "<tool_call>",
        "</tool_call>",
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n",
        "\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        tool=None,
    ),
}


# --- tools ----------------------------------------------------------------------------------------
class ToolError(ValueError):
    """A call a tool cannot answer; its message becomes the observation "error: <message>". (A tool that
    stops itself at its own time limit raises TimeoutError instead: the call then counts as timed out.)"""


@dataclass(frozen=True)
class Tool:
    """A function a completion may call."""

    name: str  # what a call names it by
    run: Callable[[str], str]  # the call's input -> the response text; raises ToolError for a bad call
    time_limit: float = 5.0  # seconds, from when its thread starts it, before it is answered "timed out"
    argument: str = "input"  # in a JSON call, the argument that holds the input
    # the tool as a chat template declares it: {"type": "function", "function": {"name", "description",
    # "parameters"}}, the JSON schema transformers and TRL pass as `tools`
    schema: dict = field(default_factory=dict)

    def parse(self, arguments) -> str:
        """The input of a call: the bare body (calc format), or the named argument of a JSON call."""
        if isinstance(arguments, str):
            return arguments
        if not isinstance(arguments, dict) or not isinstance(arguments.get(self.argument), str):
            raise ToolError(f'{self.name} takes {{"{self.argument}": "..."}} as its arguments')
        return arguments[self.argument]


TOOLS: dict[str, Tool] = {}


def register_tool(
    name: str,
    time_limit: float = 5.0,
    argument: str = "input",
    description: str | None = None,
    argument_description: str = "",
    schema: dict | None = None,
):
    """Decorator: make `fn(input: str) -> str` a tool completions may call as `name`. A chat template
    declares it by its JSON schema: `schema` as given, else one string parameter, `argument`, described
    by `argument_description`, the tool by `description` (else the first line of fn's docstring)."""

    def register(fn: Callable[[str], str]) -> Callable[[str], str]:
        if name in TOOLS:
            raise ValueError(f"a tool called {name!r} is already registered")
        if not 0 < time_limit < 1e6:
            raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
        said = description if description is not None else (fn.__doc__ or "").strip().split("\n")[0]
        declared = (
            schema if schema is not None else string_tool_schema(name, said, argument, argument_description)
        )
        check_tool_schemas([declared])
        if declared["function"]["name"] != name:
            raise ValueError(f"the schema of tool {name!r} names it {declared['function']['name']!r}")
        parameters = declared["function"].get("parameters", {}).get("properties", {})
        if argument not in parameters:
            raise ValueError(
                f"the schema of tool {name!r} has no parameter {argument!r}, the argument a JSON call passes "
                f"its input in (register_tool's argument)"
            )
        TOOLS[name] = Tool(name, fn, time_limit, argument, declared)
        return fn

    return register


def string_tool_schema(name: str, description: str, argument: str, argument_description: str) -> dict:
    """The JSON schema of a tool that takes one string argument."""
    parameter = (
        {"type": "string", "description": argument_description}
        if argument_description
        else {"type": "string"}
    )
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {argument: parameter}, "required": [argument]},
        },
    }


def declared_tools(tokenizer, names: list[str]) -> list[dict] | None:
    """What a prompt declares of the tools `names`: their schemas when the tokenizer's own chat template
    reads `tools`, else None (a template without tools, or the hand-written ChatML fallback)."""
    template = tokenizer.chat_template(tools=True) if names else None
    return tool_schemas(names) if template is not None and template.takes_tools else None


def tool_schemas(names: list[str]) -> list[dict]:
    """The JSON schemas of the registered tools `names`, in that order, for a chat template's `tools`."""
    check_tools(names, "qwen3", 1)  # the names alone: any format takes a JSON-declared tool
    return [TOOLS[name].schema for name in names]


# The calculator times its calls itself, from when one of its worker processes takes one (a TimeoutError
# after calculator.CPU_LIMIT of computing); the runner's limit is a backstop for a call that waits long
# for a free worker while the others are busy.
@register_tool(
    "calculator",
    time_limit=30.0,
    argument="expression",
    argument_description="an arithmetic expression in plain text or LaTeX, such as 347*56 or \\frac{7}{2}",
)
def calculator(expression: str) -> str:
    """The exact value of an arithmetic expression: 19432, 7/2, or 1.41421356237310 for sqrt(2)."""
    try:
        return calculate(expression)
    except CalculatorError as error:
        raise ToolError(str(error)) from None


@register_tool(
    "python",
    time_limit=5.0,
    argument="code",
    description="Run a Python program and return what it prints, or the last line of its error.",
    argument_description="the program's source",
)
def python(code: str) -> str:
    """Run `code` in the verifier's sandbox: its stdout, or the last line of its error."""
    limit = TOOLS["python"].time_limit
    config = SandboxConfig(timeout=limit, cpu_seconds=max(1, int(limit)), max_output_bytes=64 << 10)
    (result,) = run_cases(code, [{"input": "", "output": ""}], config)
    if result.timed_out:
        raise TimeoutError(f"timed out after {limit:g} s")
    if result.exit_code != 0:  # the error's own line: not a traceback's header or frames
        lines = [line for line in result.stderr.splitlines() if line.strip() and not _traceback_line(line)]
        raise ToolError(lines[-1] if lines else f"exited with code {result.exit_code}")
    return result.stdout


def _traceback_line(line: str) -> bool:
    """A line of a traceback's header or frames, not its error: "Traceback (most recent call last):",
    or an indented frame or source line."""
    return line.startswith(("Traceback (most recent call last)", " ", "\t"))


def check_tools(names: list[str], tool_format: str | ToolFormat, max_tool_calls: int) -> None:
    """Tool settings as GRPOConfig and the examples take them; a ValueError names what is wrong."""
    unknown = [name for name in names if name not in TOOLS]
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(unknown)}; registered: {', '.join(TOOLS)}")
    if isinstance(tool_format, ToolFormat):  # a format of the caller's own: its limit alone to check
        check_max_tool_calls(max_tool_calls)
    else:
        check_tool_settings(tool_format, max_tool_calls)  # the settings' one check (config.py)
    single = (tool_format if isinstance(tool_format, ToolFormat) else FORMATS[tool_format]).tool
    if single is not None and names and names != [single]:
        shown = tool_format if isinstance(tool_format, str) else tool_format.call_start
        raise ValueError(f"tool_format {shown} calls the {single} alone; got tools {', '.join(names)}")


def check_format_against_template(tokenizer, tool_format: ToolFormat, name: str) -> None:
    """A JSON format's markers as the tokenizer's own chat template writes a call and its response: the
    template renders a conversation with one call and one tool message, and the text must hold the
    format's call start and, around the response, its response markers. A checkpoint whose template
    differs is refused with one line, not trained on a format it never saw. Nothing to check for a
    format of one tool's bare calls (calc) or a tokenizer with no template of its own."""
    template = tokenizer.chat_template(tools=True)
    if tool_format.tool is not None or template is None:
        return
    response = "RESPONSE-7f3a"  # text no template writes by itself
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+1"}}}
    conversation = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": response},
    ]
    text = template.render(conversation, tool_schemas(["calculator"]), add_generation_prompt=True)
    expected = tool_format.response_start + response + tool_format.response_end
    call = text[: text.find(response)]  # the turn that made the call, and what came before it
    written = call[call.rfind(tool_format.call_start) :] if tool_format.call_start in call else ""
    # the call as the template writes it: the format's start, "calculator", then the format's end
    named_before_its_end = 0 <= written.find("calculator") < written.find(tool_format.call_end)
    if not named_before_its_end or expected not in text:
        raise ValueError(
            f"tool_format {name}'s markers are not how {template.where} writes a tool call and its response "
            f"(it writes {text[text.find(response) - 60 : text.find(response) + 60]!r} around a response): "
            "choose the format the checkpoint was trained on"
        )
