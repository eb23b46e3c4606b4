"""Between the task and the sampler: a checkpoint's own chat template, rendered as transformers renders it.

In: the template's Jinja source (tokenizer_config.json's `chat_template`, a named one of a list, or
chat_template.jinja), a conversation ([{"role", "content", ...}, ...]), tool schemas and the template's
keywords (`enable_thinking`, ...). Out: the prompt's text (and where a training template's
{% generation %} blocks are in it). It knows text and the template language, not token ids or the model.

transformers' `apply_chat_template` compiles a template in a configured jinja2 sandbox (template_sandbox.py
does the same), passes the special tokens (`bos_token`, ...) by name, rebuilds what the template sees from
plain JSON types (a caller's objects cannot be reached through it), gives a message's `reasoning` or
`thinking` also as `reasoning_content`, and with `continue_final_message` ends the text inside the last
message. This does the same, so the text is transformers' for any conversation a template accepts.
Departing from transformers, a template is untrusted input: a render runs on a budget (template_sandbox.py)
that refuses a template that would never end, and a value that contains itself or nests more than
MAX_DEPTH deep is refused before the template sees it. A template that does not parse, one that raises or
spends its budget, a message without a role and a tool without a schema are each a ValueError of one line.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

import jinja2

from .template_sandbox import Budget, OverBudget, Refused, compile_template, render

# tokenizer_config.json's names of the special tokens a template may use, passed to it by these names
SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# the names a message's reasoning goes by; the first is the one templates read, and transformers gives a
# message's reasoning under all of them (gpt-oss's templates read `thinking`)
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
MAX_DEPTH = 100  # how deep a message, a tool schema or a keyword's value may nest (lists in dicts in ...)


class ChatTemplate:
    """One chat template, compiled once; `where` names it in errors (a file, or a config's key)."""

    def __init__(self, source: str, where: str, special_tokens: dict[str, str] | None = None):
        self.source = source
        self.where = where
        self.special_tokens = dict(special_tokens or {})  # bos_token -> "<s>", ...
        try:
            self.compiled, self.variables = compile_template(source)  # variables: the names it reads
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(
                f"the chat template in {where} does not parse: line {error.lineno}: {one_line(error.message)}"
            ) from None
        except (RecursionError, SyntaxError, MemoryError) as error:
            # 3,000 nested ifs exhaust the parser's recursion; 21 nested fors, Python's static blocks
            raise ValueError(
                f"the chat template in {where} nests too deeply to compile ({cause(error)})"
            ) from None

    @property
    def takes_tools(self) -> bool:
        """Whether the template reads a `tools` variable (declares the tools it is given)."""
        return "tools" in self.variables

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool | str = False,
        **kwargs,
    ) -> str:
        """The conversation's text. With continue_final_message (True: the last message's content, or the
        name of another of its fields, such as reasoning_content) the text ends inside the last message,
        for the model to continue it, as transformers' does."""
        messages = template_messages(messages)
        final = None  # the text of the last message that is continued
        if continue_final_message:
            if add_generation_prompt:
                raise ValueError(
                    "continue_final_message continues the last message, and add_generation_prompt starts a "
                    "new one: pass add_generation_prompt=False to continue it"
                )
            final = _mark_final_message(messages, continue_final_message, self)
        text = self._render(self._variables(messages, tools, add_generation_prompt, kwargs), Budget())
        return text if final is None else _cut_at_mark(text, final, self.where)

    def render_with_generation_spans(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **kwargs,
    ) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text, and the (start, end) in it of each span its {% generation %} blocks
        wrote: TRL's training templates mark the assistant's text so (transformers' assistant mask, in
        characters; none for a template without the blocks). Not with continue_final_message, which
        transformers refuses with the mask too."""
        if "continue_final_message" in kwargs:
            raise ValueError(
                "continue_final_message cuts the text the generation spans are in: render it alone"
            )
        budget = Budget()
        messages = template_messages(messages)
        text = self._render(self._variables(messages, tools, add_generation_prompt, kwargs), budget)
        return text, budget.spans

    def _variables(self, messages: list[dict], tools, add_generation_prompt: bool, kwargs: dict) -> dict:
        """What the template sees: plain data; the caller's keywords win over the special tokens."""
        kwargs = {name: plain_data(value, f"the template keyword {name!r}") for name, value in kwargs.items()}
        variables = {"documents": None, **self.special_tokens, **kwargs}
        tools = template_tools(tools)
        variables.update(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)
        return variables

    def _render(self, variables: dict, budget: Budget) -> str:
        try:
            return render(self.compiled, variables, budget)
        except OverBudget as spent:
            raise ValueError(f"the chat template in {self.where} {spent}") from None
        except Refused as refused:
            raise ValueError(
                f"the chat template in {self.where} refuses this conversation: {one_line(str(refused))}"
            ) from None
        except Exception as error:
            # the template is untrusted code: whatever it raises (a conversation it reads as it was not
            # written to, a division by zero, a macro that calls itself, ...) is its failure on this one
            raise ValueError(
                f"the chat template in {self.where} failed on this conversation: {cause(error)}"
            ) from None


# transformers' mark of where the continued message's text ends, found in the rendered text and cut there
CONTINUE_MARK = "CONTINUE_FINAL_MESSAGE_TAG "


def _mark_final_message(
    messages: list[dict], continue_final_message: bool | str, template: ChatTemplate
) -> str:
    """Append CONTINUE_MARK to the text of the last message that is continued (its content's last text
    block, for a list of blocks), under each name it has; the text before the mark."""
    name = continue_final_message if isinstance(continue_final_message, str) else "content"
    last = messages[-1]
    if last.get(name) is None:
        raise ValueError(f"continue_final_message: the last message has no {name!r} to continue")
    names = [name]
    if name in REASONING_FIELDS:  # the reasoning under each of its names: the template reads one
        names = [key for key in REASONING_FIELDS if last.get(key) == last[name]]
    if not any(key in template.source for key in names):
        raise ValueError(
            f"continue_final_message: the chat template in {template.where} never reads {name!r}"
        )
    holders = [(last, key) for key in names]  # (dict, key) of each copy of the text
    if isinstance(last[name], (list, tuple)):
        blocks = [block for block in last[name] if isinstance(block, dict) and "text" in block]
        if not blocks:
            raise ValueError(
                f"continue_final_message: the last message's {name} has no text block to continue"
            )
        holders = [(blocks[-1], "text")]
    final = holders[0][0][holders[0][1]]
    if not isinstance(final, str):
        raise ValueError(f"continue_final_message: the last message's {name} is not text, got {final!r:.80}")
    for holder, key in holders:
        holder[key] = final + CONTINUE_MARK
    return final


def _cut_at_mark(text: str, final: str, where: str) -> str:
    """The rendered `text` up to where the continued message's text `final` ends (its mark)."""
    if final.strip() not in text or CONTINUE_MARK.strip() not in text:
        raise ValueError(
            f"continue_final_message: the chat template in {where} does not write the last message as it "
            "is (it changes or drops part of it), so the text cannot end inside it"
        )
    at = text.rindex(CONTINUE_MARK.strip())
    if text[at : at + len(CONTINUE_MARK)] == CONTINUE_MARK:
        return text[:at]
    return text[:at].rstrip()  # the template stripped the message's end, and the mark's space with it


def one_line(text: str, limit: int = 200) -> str:
    """`text` on one line, cut to `limit` characters: a template's message is its author's to write."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cause(error: BaseException) -> str:
    """What went wrong, in one line: jinja2's own errors say it; Python's are named (MemoryError says
    nothing else)."""
    if isinstance(error, jinja2.TemplateError):
        return one_line(str(error))
    return one_line(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)


def read_template_file(path: str) -> str:
    """chat_template.jinja's text; a file that is not UTF-8 is a ValueError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text ({error.reason}), as a chat template must be") from None


def template_messages(messages) -> list[dict]:
    """The conversation as transformers' templates see it: plain data (plain_data), each message with a
    role, a key whose value is None left out ({"content": None} of an assistant turn that only calls), its
    reasoning under each name templates read it by."""
    if isinstance(messages, (list, tuple)):
        messages = [
            plain_data(message, f"message {i} of the conversation") for i, message in enumerate(messages)
        ]
    check_messages(messages)
    messages = [{key: value for key, value in message.items() if value is not None} for message in messages]
    return [_alias_reasoning(message) for message in messages]


def _alias_reasoning(message: dict) -> dict:
    """`message` with its reasoning, under any of REASONING_FIELDS, also under the first two."""
    reasoning = next((message[key] for key in REASONING_FIELDS if key in message), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def template_tools(tools) -> list[dict] | None:
    """Tool schemas (check_tool_schemas) as plain data, or None."""
    check_tool_schemas(tools)
    if tools is None:
        return None
    return [plain_data(tool, f"the schema of tool {tool['function']['name']!r}") for tool in tools]


def plain_data(value, what: str, inside: tuple[int, ...] = ()):
    """`value` rebuilt from plain JSON types, as transformers rebuilds what a template sees: a str, int or
    float subclass (an enum, a numpy scalar) as its base type, a mapping as a dict, a dataclass or a
    pydantic model as its fields, anything else as a placeholder naming its type ("<PosixPath>"): an
    object's methods (Path.write_text) are not the template's to call. Departing from transformers (which
    recurses until Python stops it), a value that contains itself, or nests more than MAX_DEPTH deep, is a
    ValueError naming `what`; `inside`: the ids of the containers `value` is in."""
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return value
    if kind is not dict and kind is not list:  # (the scalar checks cost a dict and a list their time)
        scalar = _plain_scalar(value)
        if scalar is not None:
            return scalar
    if id(value) in inside:
        raise ValueError(f"{what} contains itself, which a template cannot render")
    if len(inside) == MAX_DEPTH:
        raise ValueError(f"{what} nests more than {MAX_DEPTH} levels deep")
    inside = (*inside, id(value))
    if kind is dict or isinstance(value, Mapping):
        return {plain_data(key, what, inside): plain_data(item, what, inside) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_data(item, what, inside) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_data(item, what, inside) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return {field.name: plain_data(getattr(value, field.name), what, inside) for field in fields}
    if callable(getattr(value, "model_dump", None)):  # a pydantic model (OpenAI's messages)
        return plain_data(value.model_dump(), what, inside)
    return f"<{type(value).__name__}>"


def _plain_scalar(value):
    """A str, int or float subclass, or a numpy scalar, as the plain value it stands for; else None."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    numpy = sys.modules.get("numpy")  # a numpy scalar exists only once numpy is imported
    if numpy is not None and isinstance(value, numpy.generic):
        return plain_data(value.item(), "a numpy scalar")
    return None


def check_messages(messages) -> None:
    """A conversation: a non-empty list of dicts, each with a string role."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"a conversation must be a non-empty list of messages, got {messages!r:.80}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"message {i} of the conversation has no role: {message!r:.80}")


def check_tool_schemas(tools) -> None:
    """Tool schemas as templates read them: {"type": "function", "function": {"name", "description",
    "parameters"}}, each with a name and an object of parameters."""
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(
                f'tool {i} has no JSON schema: give {{"type": "function", "function": {{"name", '
                f'"description", "parameters"}}}}, got {tool!r:.80}'
            )
        if not isinstance(function.get("parameters", {}), dict):
            raise ValueError(f"tool {function['name']!r}: its parameters must be a JSON-schema object")


def choose(chat_template, where: str, tools: bool) -> str | None:
    """The template's source from tokenizer_config.json's `chat_template`: a string, or of a list of
    {"name", "template"} the "tool_use" one when tools are declared and it exists, else "default" (as
    transformers chooses); None for none."""
    if chat_template is None or isinstance(chat_template, str):
        return chat_template
    if not isinstance(chat_template, list) or not all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
        for t in chat_template
    ):
        raise ValueError(f"{where}: chat_template must be a string or a list of {{name, template}}")
    named = {t["name"]: t["template"] for t in chat_template}
    if tools and "tool_use" in named:
        return named["tool_use"]
    if "default" not in named:
        raise ValueError(f"{where}: its chat templates ({', '.join(named)}) have no 'default' one")
    return named["default"]
