"""A checkpoint's own chat template, rendered as transformers renders it (transformers as the oracle):
Qwen3's and DeepSeek-V3's real templates (tests/data/chat_templates) over single turns, system turns,
thinking on and off, earlier assistant turns that thought, one and two tools declared, a tool call and
its response in the history, and add_generation_prompt both ways: the same text and the same token ids.
Then the tools a run declares, the qwen3 format's markers checked against the template, conversations
as task rows, the template kept as it came when a checkpoint is saved, and bad input in one line."""

import dataclasses
import enum
import importlib.util
import inspect
import json
import os
import random
import re
import time

import jinja2
import numpy
import pydantic
import pytest
from helpers import SPECIALS, tiny_model, tiny_tokenizer

import minigrpo
from minigrpo.flags import from_args
from minigrpo.model import ChatTemplate, Tokenizer, template_sandbox
from minigrpo.tools import FORMATS, ToolFormat, check_format_against_template, declared_tools, tool_schemas

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = os.path.join(ROOT, "tests", "data", "chat_templates")
FAMILIES = ["qwen3", "deepseek_v3"]

CALCULATOR, PYTHON = tool_schemas(["calculator", "python"])
CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "65*7"}}}
CONVERSATIONS = {
    "one turn": [{"role": "user", "content": "70+65*7"}],
    "system turn": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}],
    "earlier thinking": [
        {"role": "user", "content": "1+1"},
        {"role": "assistant", "content": "<think>\nadd one\n</think>\n\n2"},
        {"role": "user", "content": "and 2+2?"},
    ],
    "tool call and response": [
        {"role": "user", "content": "70+65*7"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "455"},
    ],
}
ONE_TURN = CONVERSATIONS["one turn"]
TOOL_SETS = {"no tools": None, "one tool": [CALCULATOR], "two tools": [CALCULATOR, PYTHON]}


def checkpoint_tokenizer(directory, family: str, **config_changes) -> str:
    """A tiny tokenizer, with a family's added and special tokens, beside that family's real
    tokenizer_config.json (its template and special tokens; the added tokens' ids, which are the real
    vocabulary's, and its tokenizer class left out)."""
    with open(os.path.join(TEMPLATES, family, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    # its added tokens (<|im_start|>, <tool_call>, ...) and special tokens, tokens of the tiny tokenizer too
    specials = [token["content"] for token in config.get("added_tokens_decoder", {}).values()]
    specials += [config.get(name) for name in ("bos_token", "eos_token", "pad_token", "unk_token")]
    specials = [token["content"] if isinstance(token, dict) else token for token in specials]
    tiny_tokenizer(str(directory), tuple(sorted({t for t in specials if t} - set(SPECIALS))))
    config.pop("added_tokens_decoder", None)
    # the tiny tokenizer.json as it is: a family's class (Qwen2Tokenizer) would pre-tokenize its own way
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.update(config_changes)
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return str(directory)


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request, tmp_path_factory):
    """(transformers' tokenizer, minigrpo's) of one family's template."""
    from transformers import AutoTokenizer

    directory = checkpoint_tokenizer(tmp_path_factory.mktemp(request.param), request.param)
    return AutoTokenizer.from_pretrained(directory), Tokenizer.from_directory(directory)


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("tools", list(TOOL_SETS))
@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_the_text_and_ids_are_transformers(pair, conversation, tools, thinking, add_generation_prompt):
    hf, mine = pair
    messages = CONVERSATIONS[conversation]
    settings = dict(
        tools=TOOL_SETS[tools], add_generation_prompt=add_generation_prompt, enable_thinking=thinking
    )
    expected = hf.apply_chat_template(messages, tokenize=False, **settings)
    text = mine.apply_chat_template(messages, **settings)
    assert text == expected
    ids = hf.apply_chat_template(messages, tokenize=True, **settings)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert mine.encode(text) == list(ids)


def test_qwen3_drops_earlier_thinking_and_declares_the_tools(tmp_path):
    tokenizer = Tokenizer.from_directory(checkpoint_tokenizer(tmp_path, "qwen3"))
    text = tokenizer.apply_chat_template(CONVERSATIONS["earlier thinking"])
    assert "add one" not in text and "<|im_start|>assistant\n2<|im_end|>" in text
    declared = tokenizer.apply_chat_template(
        CONVERSATIONS["one turn"], tools=[CALCULATOR], enable_thinking=False
    )
    assert declared.startswith("<|im_start|>system\n# Tools\n")
    assert json.dumps(CALCULATOR) in declared and declared.endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_a_run_declares_its_tools_where_the_template_takes_them(tmp_path):
    qwen3 = Tokenizer.from_directory(checkpoint_tokenizer(tmp_path / "q", "qwen3"))
    assert declared_tools(qwen3, ["calculator"]) == [CALCULATOR]
    assert declared_tools(qwen3, []) is None
    chatml = Tokenizer.from_directory(tiny_tokenizer(str(tmp_path / "c")) and str(tmp_path / "c"))
    assert chatml.chat_template(tools=True) is None and declared_tools(chatml, ["calculator"]) is None
    # the hand-written ChatML stays the fallback: a template row declares no tool through it
    assert (
        chatml.apply_chat_template(CONVERSATIONS["one turn"])
        == "<|im_start|>user\n70+65*7<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError, match="has no chat template to declare tools in"):
        chatml.apply_chat_template(CONVERSATIONS["one turn"], tools=[CALCULATOR])


def test_a_registered_tool_carries_its_schema():
    assert CALCULATOR["function"]["name"] == "calculator"
    assert CALCULATOR["function"]["parameters"]["required"] == ["expression"]
    assert PYTHON["function"]["parameters"]["properties"]["code"]["type"] == "string"
    with pytest.raises(ValueError, match="tool 0 has no JSON schema"):
        minigrpo.register_tool("schemaless", schema={"name": "schemaless"})(lambda text: text)


def test_the_qwen3_format_agrees_with_qwen3s_template_and_a_different_one_is_refused(tmp_path):
    qwen3 = Tokenizer.from_directory(checkpoint_tokenizer(tmp_path / "q", "qwen3"))
    check_format_against_template(qwen3, FORMATS["qwen3"], "qwen3")
    elsewhere = ToolFormat("<tool_call>", "</tool_call>", "<|im_start|>tool\n", "<|im_end|>\n", tool=None)
    with pytest.raises(ValueError, match="tool_format other's markers are not how .* writes a tool call"):
        check_format_against_template(qwen3, elsewhere, "other")
    deepseek = Tokenizer.from_directory(checkpoint_tokenizer(tmp_path / "d", "deepseek_v3"))
    with pytest.raises(ValueError, match="tool_format qwen3's markers are not how"):
        check_format_against_template(deepseek, FORMATS["qwen3"], "qwen3")


def test_a_conversation_row_is_rendered_by_the_template(tmp_path):
    """A task row whose prompt is a conversation: the trainer renders it with the checkpoint's template,
    earlier thinking dropped where the template drops it, the run's tools declared."""
    directory = checkpoint_tokenizer(tmp_path / "policy", "qwen3")
    tokenizer = Tokenizer.from_directory(directory)
    minigrpo.save_pretrained(
        tiny_model(vocab_size=tokenizer.vocab_size, max_position_embeddings=2048),  # room for the tools
        tokenizer,
        directory,
    )
    model, tokenizer = minigrpo.load_pretrained(directory)
    rows = [{"prompt": CONVERSATIONS["earlier thinking"], "answer": "4"}]
    grpo = minigrpo.GRPOConfig(
        num_generations=2, max_completion_length=4, tools="calculator", tool_format="qwen3"
    )
    config = minigrpo.TrainConfig(output_dir=str(tmp_path / "run"), batch_size=2, progress_bar=False)
    trainer = minigrpo.Trainer(
        model, tokenizer, minigrpo.Task(rows, [minigrpo.RewardSpec("accuracy")]), grpo, config
    )
    text = tokenizer.decode(trainer.prompt_ids[0])
    assert text == tokenizer.apply_chat_template(CONVERSATIONS["earlier thinking"], tools=[CALCULATOR])
    assert "add one" not in text and "# Tools" in text


@pytest.mark.parametrize("kind", ["string", "named list", "jinja file"])
def test_a_saved_checkpoint_keeps_the_template_as_it_came(tmp_path, kind):
    """The template a checkpoint ships, as a string, a named list (its tool_use one writes tools its own
    way) or chat_template.jinja beside a config template the file overrides: the one transformers renders
    with, kept as it came when the checkpoint is saved."""
    from transformers import AutoTokenizer

    source = real_template("qwen3")
    directory = tmp_path / "in"
    if kind == "string":
        checkpoint_tokenizer(directory, "qwen3")
    elif kind == "named list":
        named = [
            {"name": "default", "template": source},
            {"name": "tool_use", "template": source.replace("# Tools", "# Tool use")},
        ]
        checkpoint_tokenizer(directory, "qwen3", chat_template=named)
    else:
        checkpoint_tokenizer(directory, "qwen3", chat_template="{{ 'overridden by the file' }}")
        (directory / "chat_template.jinja").write_text(source, encoding="utf-8")
    tokenizer = Tokenizer.from_directory(str(directory))
    hf = AutoTokenizer.from_pretrained(str(directory))
    before = {}  # the text with tools and without
    for tools in (None, [CALCULATOR]):
        before[bool(tools)] = tokenizer.apply_chat_template(CONVERSATIONS["one turn"], tools=tools)
        expected = hf.apply_chat_template(CONVERSATIONS["one turn"], tools=tools, tokenize=False)
        assert before[bool(tools)] == expected + "<|im_start|>assistant\n"  # transformers' default: no prompt
    out = tmp_path / "out"
    minigrpo.save_pretrained(
        tiny_model(vocab_size=tokenizer.vocab_size),
        tokenizer,
        str(out),
    )
    if kind == "jinja file":  # the file, byte for byte
        assert (out / "chat_template.jinja").read_bytes() == (directory / "chat_template.jinja").read_bytes()
    saved = json.loads((out / "tokenizer_config.json").read_text())
    original = json.loads((directory / "tokenizer_config.json").read_text())
    assert saved["chat_template"] == original["chat_template"]
    for tools in (None, [CALCULATOR]):
        again = Tokenizer.from_directory(str(out)).apply_chat_template(CONVERSATIONS["one turn"], tools=tools)
        assert again == before[bool(tools)]
    tools_heading = "# Tool use" if kind == "named list" else "# Tools\n"  # the tool_use template, for tools
    assert before[True].startswith(f"<|im_start|>system\n{tools_heading}") and "# Tool" not in before[False]


@pytest.mark.parametrize(
    "template, messages, tools, message",
    [
        ("{% if %}", CONVERSATIONS["one turn"], None, r"the chat template in .* does not parse: line 1"),
        (
            "{{ raise_exception('no system turns') }}",
            CONVERSATIONS["one turn"],
            None,
            "refuses this conversation: no system turns",
        ),
        ("{{ messages }}", [{"content": "hi"}], None, "message 0 of the conversation has no role"),
        ("{{ messages }}", CONVERSATIONS["one turn"], [{"name": "calculator"}], "tool 0 has no JSON schema"),
        (
            "{{ messages }}",
            CONVERSATIONS["one turn"],
            [{"type": "function", "function": {"name": "calc", "parameters": "expression"}}],
            "tool 'calc': its parameters must be a JSON-schema object",
        ),
        (
            {"default": "{{ messages }}"},
            ONE_TURN,
            None,
            "chat_template must be a string or a list of {name, temp",
        ),
        (
            [{"name": "default"}],
            ONE_TURN,
            None,
            "chat_template must be a string or a list of {name, template}",
        ),
        ([{"name": "tool_use", "template": "x"}], ONE_TURN, None, "have no 'default' one"),
    ],
    ids=["no parse", "refused", "no role", "no schema", "parameters", "a dict", "a bad entry", "no default"],
)
def test_bad_input_is_one_line_naming_the_problem(tmp_path, template, messages, tools, message):
    tokenizer = Tokenizer.from_directory(checkpoint_tokenizer(tmp_path, "qwen3", chat_template=template))
    with pytest.raises(ValueError, match=re.escape(message) if "{" in message else message) as raised:
        tokenizer.apply_chat_template(messages, tools=tools)
    assert "\n" not in str(raised.value)


def test_bad_chat_template_kwargs_are_refused_by_the_config():
    with pytest.raises(ValueError, match="chat_template_kwargs must be a JSON object"):
        minigrpo.GRPOConfig(chat_template_kwargs="enable_thinking=false")
    assert minigrpo.GRPOConfig(chat_template_kwargs='{"enable_thinking": false}').template_kwargs == {
        "enable_thinking": False
    }


def test_a_template_that_writes_calls_its_own_way_is_refused_for_the_qwen3_format(tmp_path):
    """Qwen3's template with its calls written <|fn|>...<|/fn|>: the system turn still shows <tool_call>,
    but the call the template writes is not the format's, so it is refused."""
    with open(os.path.join(TEMPLATES, "qwen3", "tokenizer_config.json"), encoding="utf-8") as f:
        source = json.load(f)["chat_template"]
    written_otherwise = source.replace('\'<tool_call>\\n{"name": "\'', '\'<|fn|>{"name": "\'').replace(
        "'}\\n</tool_call>'", "'}<|/fn|>'"
    )
    assert written_otherwise != source
    tokenizer = Tokenizer.from_directory(
        checkpoint_tokenizer(tmp_path, "qwen3", chat_template=written_otherwise)
    )
    with pytest.raises(ValueError, match="tool_format qwen3's markers are not how"):
        check_format_against_template(tokenizer, FORMATS["qwen3"], "qwen3")


def test_what_transformers_refuses_or_accepts_is_refused_or_rendered_the_same(pair):
    """A turn that only calls, written with content None as OpenAI's messages are: transformers drops
    the None-valued key and the template then fails on it, and here it is one line naming the template.
    A keyword that is also a special token's name wins over the token, in both."""
    hf, mine = pair
    messages = [
        {"role": "user", "content": "70+65*7"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "455"},
    ]
    with pytest.raises(Exception, match="has no attribute 'content'"):
        hf.apply_chat_template(messages, tokenize=False)
    with pytest.raises(
        ValueError, match="failed on this conversation: 'dict object' has no attribute"
    ) as raised:
        mine.apply_chat_template(messages)
    assert "\n" not in str(raised.value)
    shown = [{"role": "user", "content": "hi"}]
    assert mine.apply_chat_template(shown, eos_token="<X>") == hf.apply_chat_template(
        shown, tokenize=False, add_generation_prompt=True, eos_token="<X>"
    )


def test_a_schema_without_the_calls_argument_is_refused():
    schema = {"type": "function", "function": {"name": "lookup", "parameters": {"properties": {"q": {}}}}}
    with pytest.raises(ValueError, match="has no parameter 'query', the argument a JSON call passes"):
        minigrpo.register_tool("lookup", argument="query", schema=schema)(lambda text: text)


@pytest.mark.parametrize(
    "version, refused",
    [
        ("3.1.5", True),
        ("3.0.3", True),
        ("3.1", True),
        ("unknown", True),
        ("3.1.6", False),
        ("3.1.10", False),
        ("3.2.0", False),
        ("3.2", False),
        ("4.0.0rc1", False),
    ],
)
def test_a_jinja2_whose_sandbox_leaks_is_refused_before_compiling(monkeypatch, version, refused):
    """jinja2 3.1.5's sandbox let a template read os.environ (|attr('format'), GHSA-cpwx-vrp4-4pq7): the
    version the module reads is checked before a template compiles, in one line saying what to install."""
    monkeypatch.setattr(jinja2, "__version__", version)
    if not refused:
        assert (
            ChatTemplate("{{ messages[0].content }}", "t").render([{"role": "user", "content": "x"}]) == "x"
        )
        return
    with pytest.raises(ValueError) as raised:
        ChatTemplate("{{ messages[0].content }}", "t")
    assert str(raised.value) == (
        "rendering a checkpoint's chat template needs jinja2>=3.1.6 (older versions let a template escape "
        f"the sandbox), but jinja2 {version} is installed: pip install -U 'jinja2>=3.1.6'"
    )


def test_setup_requires_the_jinja2_the_renderer_checks_for():
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        required = re.search(r'"jinja2>=([\d.]+)"', f.read()).group(1)
    assert tuple(map(int, required.split("."))) == template_sandbox.MIN_JINJA2 == (3, 1, 6)


# Templates that never end, or not before they have spent minutes or gigabytes on one conversation; each is
# refused in one line by the budget of a render: what it spends, and on what
NEVER_ENDS = {
    "nested loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "made more than 100,000 loop iterations and calls on one conversation: it may never end",
    ),
    "a recursive loop": (  # loop(...)'s own iterations count too
        "{% for i in range(100000) recursive %}{% if loop.depth < 2 %}{{ loop(range(100000)) }}{% endif %}"
        "{% endfor %}",
        "made more than 100,000 loop iterations and calls",
    ),
    "a macro that calls itself twice": (  # 2**41 calls, 40 deep: only the calls count
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
        "made more than 100,000 loop iterations and calls",
    ),
    "lipsum": ("{{ lipsum(1000000) }}", "asks lipsum() for 1,000,000 paragraphs of up to 100 words"),
    "its output": (
        "{% for i in range(100000) %}{{ range(100000)|join }}{% endfor %}",
        "wrote more than 4,000,000 characters for one conversation",
    ),
    "a repeated string": (
        "{% for i in range(100000) %}{% set s = 'x' * (100000000 + i) %}{% endfor %}",
        "repeats a str to more than 4,000,000 items",
    ),
    "a power": ("{{ 7 ** 100000000 % 10 }}", "computes an integer of more than 100,000 bits with **"),
    "squaring": (
        "{% set ns = namespace(n=7) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
        "computes an integer of more than 100,000 bits with *",
    ),
    "doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "built a str of 4,194,304 items, more than 4,000,000",
    ),
}


@pytest.mark.parametrize("case", list(NEVER_ENDS))
def test_a_template_that_never_ends_is_refused_by_its_budget(tmp_path, monkeypatch, case):
    """(A tenth of the steps, to spend less of the suite's time on them.)"""
    monkeypatch.setattr(template_sandbox, "MAX_STEPS", 100_000)
    source, message = NEVER_ENDS[case]
    tokenizer = Tokenizer.from_directory(checkpoint_tokenizer(tmp_path, "qwen3", chat_template=source))
    started = time.monotonic()
    where = os.path.join(tmp_path, "tokenizer_config.json")
    with pytest.raises(ValueError, match=re.escape(f"the chat template in {where} {message}")) as raised:
        tokenizer.apply_chat_template(ONE_TURN)
    assert "\n" not in str(raised.value)
    assert time.monotonic() - started < 60  # a budget spent in seconds at most, not minutes or hours


def test_a_template_whose_every_step_is_slow_is_stopped_by_the_clock(monkeypatch):
    """A hundred thousand steps of a fraction of a millisecond each: the clock, read every CLOCK_EVERY steps,
    stops it.
    A render of fewer steps never reads the clock, so its result cannot depend on the machine's speed."""
    monkeypatch.setattr(template_sandbox, "MAX_SECONDS", 0.0)
    slow = ChatTemplate("{% for i in range(100000) %}{% set s = range(1000)|join %}{% endfor %}", "slow")
    with pytest.raises(
        ValueError, match="^the chat template in slow ran longer than 0 s on one conversation"
    ):
        slow.render(ONE_TURN)
    quick = "{% for i in range(1000) %}{% set s = i %}{% endfor %}{{ messages[0].content }}"
    assert ChatTemplate(quick, "quick").render(ONE_TURN) == ONE_TURN[0]["content"]


def test_a_long_conversation_with_tools_is_far_from_the_budget(tmp_path):
    """Qwen3's template over a thousand turns that think and call a tool, with two tools declared: the text is
    transformers', and the render spends under 2% of the budget's steps and characters."""
    from transformers import AutoTokenizer

    directory = checkpoint_tokenizer(tmp_path, "qwen3")
    long = [message for _ in range(250) for message in CONVERSATIONS["tool call and response"]]
    long += CONVERSATIONS["earlier thinking"]
    hf, mine = AutoTokenizer.from_pretrained(directory), Tokenizer.from_directory(directory)
    text = mine.apply_chat_template(long, tools=[CALCULATOR, PYTHON])
    assert text == hf.apply_chat_template(
        long, tools=[CALCULATOR, PYTHON], tokenize=False, add_generation_prompt=True
    )
    budget = template_sandbox.Budget()
    template = mine.chat_template(tools=True)
    variables = {"messages": long, "tools": [CALCULATOR, PYTHON], "add_generation_prompt": True}
    assert template_sandbox.render(template.compiled, variables, budget) == text
    assert budget.steps < template_sandbox.MAX_STEPS / 50 and budget.written < template_sandbox.MAX_CHARS / 50


@pytest.mark.parametrize(
    "source, message",
    [
        ("{{ 1 / 0 }}", "failed on this conversation: ZeroDivisionError: division by zero"),
        ("{{ (10 ** 400) | float }}", "failed on this conversation: OverflowError: int too large to convert"),
        ("{{ range(10 ** 20) }}", "failed on this conversation: OverflowError: Python int too large"),
        (
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "failed on this conversation: RecursionError: maximum recursion depth exceeded",
        ),
        ("{{ 'x' | center(10 ** 15) }}", "failed on this conversation: MemoryError$"),
        ("{% if true %}" * 3000 + "{% endif %}" * 3000, "nests too deeply to compile \\(RecursionError: "),
        (
            "{% for i in [1] %}" * 25 + "{% endfor %}" * 25,
            "nests too deeply to compile \\(SyntaxError: too many",
        ),
        (
            "{{ raise_exception('no tools here:\\n' ~ 'x' * 1000) }}",
            "refuses this conversation: no tools here: x{182}\\.\\.\\.$",
        ),
    ],
    ids=[
        "zero",
        "float overflow",
        "range overflow",
        "recursive macro",
        "memory",
        "3000 ifs",
        "25 fors",
        "long",
    ],
)
def test_what_a_template_raises_is_one_line_naming_it(source, message):
    with pytest.raises(ValueError, match=f"^the chat template in hostile.jinja {message}") as raised:
        ChatTemplate(source, "hostile.jinja").render(ONE_TURN)
    assert "\n" not in str(raised.value)


def test_a_template_file_that_is_not_utf8_is_refused_naming_it(tmp_path):
    checkpoint_tokenizer(tmp_path, "qwen3")
    (tmp_path / "chat_template.jinja").write_bytes(b"{{ messages[0].content }}\xff\xfe")
    with pytest.raises(ValueError) as raised:
        Tokenizer.from_directory(str(tmp_path))
    path = os.path.join(tmp_path, "chat_template.jinja")
    assert str(raised.value) == f"{path} is not UTF-8 text (invalid start byte), as a chat template must be"


def real_template(family: str) -> str:
    with open(os.path.join(TEMPLATES, family, "tokenizer_config.json"), encoding="utf-8") as f:
        return json.load(f)["chat_template"]


@pytest.fixture(scope="module")
def hf_qwen3(tmp_path_factory):
    """transformers' tokenizer of Qwen3's template, the oracle for templates given as source."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint_tokenizer(tmp_path_factory.mktemp("hf"), "qwen3"))


@dataclasses.dataclass
class Message:
    role: str
    content: object


class Colour(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 2


class Point(pydantic.BaseModel):
    name: str


def test_a_template_sees_plain_data_as_transformers_does(hf_qwen3, tmp_path):
    """A library caller's rich objects (a dataclass message, str and int enums, numpy scalars, a tuple, a
    pydantic model, a Path) are rebuilt as transformers rebuilds them, so the text is the same: an enum is
    its value, a model its fields, a Path a placeholder."""
    source = (
        "{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}{{ n + 1 }} {{ flag }} {{ colour }} "
        "{{ level }} {{ half }} {{ pair | tojson }} {{ point | tojson }}"
    )
    messages = [Message("user", tmp_path / "x"), {"role": "assistant", "content": Colour.RED}]
    kwargs = dict(n=numpy.int64(41), flag=numpy.bool_(False), colour=Colour.RED, level=Level.HIGH)
    kwargs.update(half=numpy.float64(0.5), pair=(1, "a"), point=Point(name="p"))
    text = ChatTemplate(source, "t").render(messages, add_generation_prompt=False, **kwargs)
    assert text == hf_qwen3.apply_chat_template(messages, chat_template=source, tokenize=False, **kwargs)
    assert text == 'user=<PosixPath>;assistant=red;42 False red 2 0.5 [1, "a"] {"name": "p"}'


def test_a_path_given_as_content_cannot_write_a_file(tmp_path):
    target = tmp_path / "written"
    template = ChatTemplate("{{ messages[0].content.write_text('owned') }}", "t")
    with pytest.raises(
        ValueError, match="failed on this conversation: 'str object' has no attribute 'write_text'"
    ):
        template.render([{"role": "user", "content": target}])
    assert not target.exists()


def test_a_value_that_contains_itself_or_nests_too_deep_is_refused_naming_it():
    template = ChatTemplate(real_template("qwen3"), "qwen3")
    schema = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    schema["function"]["parameters"]["properties"]["more"] = schema["function"]["parameters"]
    with pytest.raises(
        ValueError, match="^the schema of tool 'lookup' contains itself, which a template cannot"
    ):
        template.render(ONE_TURN, tools=[schema])
    message = {"role": "user", "content": []}
    message["content"].append(message)
    with pytest.raises(ValueError, match="^message 0 of the conversation contains itself"):
        template.render([message])
    keywords = {}
    keywords["again"] = keywords
    with pytest.raises(ValueError, match="^the template keyword 'extra' contains itself"):
        template.render(ONE_TURN, extra=keywords)
    deep = "x"
    for _ in range(150):
        deep = [deep]
    with pytest.raises(ValueError, match="^message 1 of the conversation nests more than 100 levels deep$"):
        template.render([*ONE_TURN, {"role": "user", "content": deep}])
    shared = ["x"]  # the same list twice, neither inside the other, is no cycle
    shown = ChatTemplate("{{ messages[0].content }}", "t").render(
        [{"role": "user", "content": [shared, shared]}]
    )
    assert shown == "[['x'], ['x']]"


@pytest.mark.parametrize(
    "name", ["tools", "messages", "add_generation_prompt", "documents", "continue_final_message"]
)
def test_chat_template_kwargs_naming_the_renderers_own_arguments_are_refused(name):
    """--chat_template_kwargs '{"tools": ...}' was a TypeError traceback when the first prompt rendered."""
    with pytest.raises(ValueError) as raised:
        minigrpo.GRPOConfig(chat_template_kwargs=json.dumps({"enable_thinking": False, name: True}))
    assert str(raised.value) == (
        f"chat_template_kwargs names {name}, which the run sets itself (the renderer's arguments: messages, "
        "tools, documents, add_generation_prompt, continue_final_message); give only the template's "
        "keywords, such as enable_thinking"
    )


def test_the_renderer_arguments_config_names_are_the_renderers():
    """config.py names them without importing the renderer: ChatTemplate.render's keywords and `documents`."""
    parameters = inspect.signature(ChatTemplate.render).parameters
    named = [name for name, p in parameters.items() if p.kind is p.POSITIONAL_OR_KEYWORD and name != "self"]
    assert sorted(minigrpo.config.RENDER_ARGUMENTS) == sorted([*named, "documents"])


TRAIN_MATH = os.path.join(ROOT, "examples", "train_math.py")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_config_file_gives_chat_template_kwargs_as_an_object(tmp_path, suffix):
    """As TRL's configs do; the flag's JSON text stays, and wins over the file."""
    spec = importlib.util.spec_from_file_location("train_math", TRAIN_MATH)
    train_math = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_math)
    values = {"chat_template_kwargs": {"enable_thinking": False, "style": "brief"}}
    path = tmp_path / f"run{suffix}"
    path.write_text(
        json.dumps(values) if suffix == ".json" else pytest.importorskip("yaml").safe_dump(values)
    )
    grpo = from_args(minigrpo.GRPOConfig, train_math.parse_args(["--config", str(path)]))
    assert grpo.template_kwargs == {"enable_thinking": False, "style": "brief"}
    flag = ["--chat_template_kwargs", '{"enable_thinking": true}']
    grpo = from_args(minigrpo.GRPOConfig, train_math.parse_args(["--config", str(path), *flag]))
    assert grpo.template_kwargs == {"enable_thinking": True}
    path.write_text(json.dumps({"chat_template_kwargs": {"tools": []}}))
    path.rename(path := tmp_path / "clash.json")
    with pytest.raises(ValueError, match="^chat_template_kwargs names tools, which the run sets itself"):
        from_args(minigrpo.GRPOConfig, train_math.parse_args(["--config", str(path)]))
    path.write_text(json.dumps({"chat_template_kwargs": ["enable_thinking"]}))
    with pytest.raises(SystemExit, match="chat_template_kwargs must be text, got \\['enable_thinking'\\]"):
        train_math.parse_args(["--config", str(path)])


def test_code_gives_chat_template_kwargs_as_an_object_or_its_json():
    assert minigrpo.GRPOConfig(chat_template_kwargs={"enable_thinking": False}).chat_template_kwargs == (
        '{"enable_thinking": false}'
    )
    itself = {}
    itself["again"] = itself
    with pytest.raises(
        ValueError, match="^chat_template_kwargs must be a JSON object, got .* \\(Circular reference"
    ):
        minigrpo.GRPOConfig(chat_template_kwargs=itself)


@pytest.mark.parametrize("name", ["reasoning_content", "reasoning", "thinking"])
def test_reasoning_under_any_of_its_names_is_rendered_as_transformers_does(pair, name):
    """transformers gives a message's reasoning, under any name, as reasoning_content (what Qwen3's reads)."""
    hf, mine = pair
    messages = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2", name: "add one"}]
    text = mine.apply_chat_template(messages, add_generation_prompt=False)
    assert text == hf.apply_chat_template(messages, tokenize=False)
    assert ("add one" in text) == (mine.chat_template(tools=False).source == real_template("qwen3"))


CONTINUED = {  # (conversation, continue_final_message): the last message's text, to be continued
    "content": ([*CONVERSATIONS["system turn"], {"role": "assistant", "content": "The answer is"}], True),
    "reasoning_content": (
        [ONE_TURN[0], {"role": "assistant", "content": "", "reasoning_content": "add two"}],
        "reasoning_content",
    ),
    "reasoning": ([ONE_TURN[0], {"role": "assistant", "content": "5", "reasoning": "add two"}], "reasoning"),
}


@pytest.mark.parametrize("case", list(CONTINUED))
def test_continue_final_message_ends_inside_the_last_message_as_transformers_does(pair, case):
    """The text ends where the last message's text does, for the model to continue it; a template that does
    not read the field continued is refused, as transformers refuses it."""
    hf, mine = pair
    messages, field = CONTINUED[case]
    try:
        expected = hf.apply_chat_template(messages, tokenize=False, continue_final_message=field)
    except ValueError as refused:
        assert "is not an accepted field in the chat_template" in str(refused)
        with pytest.raises(ValueError, match=f"chat template in .* never reads '{field}'$"):
            mine.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=field)
        return
    text = mine.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=field)
    assert text == expected and text.endswith(("The answer is", "add two"))


def test_continue_final_message_over_content_blocks_is_transformers(hf_qwen3):
    source = "{% for m in messages %}{% for b in m.content %}{{ b.text }}|{% endfor %}{% endfor %}"
    blocks = [
        {"type": "text", "text": "first"},
        {"type": "image"},
        {"type": "text", "text": "second"},
        {"type": "text", "text": "The answer is "},
    ]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "2+3"}]},
        {"role": "assistant", "content": blocks},
    ]
    text = ChatTemplate(source, "t").render(
        messages, add_generation_prompt=False, continue_final_message=True
    )
    assert text == hf_qwen3.apply_chat_template(
        messages, chat_template=source, tokenize=False, continue_final_message=True
    )
    assert text == "2+3|first||second|The answer is "  # the mark was followed by the template's own text


def test_continue_final_message_where_the_template_trims_the_message_is_transformers(hf_qwen3):
    """The template strips the message's end, and the mark's space with it: the text ends at the message's
    last character, as in transformers."""
    source = "{% for m in messages %}{{ m.content | trim }}|{% endfor %}"
    messages = [ONE_TURN[0], {"role": "assistant", "content": "The answer is "}]
    text = ChatTemplate(source, "t").render(
        messages, add_generation_prompt=False, continue_final_message=True
    )
    assert text == hf_qwen3.apply_chat_template(
        messages, chat_template=source, tokenize=False, continue_final_message=True
    )
    assert text == "70+65*7|The answer is"


@pytest.mark.parametrize(
    "source, messages, settings, message",
    [
        (
            "{{ messages }}",
            ONE_TURN,
            {},
            "continue_final_message continues the last message, and add_generation",
        ),
        (
            "{{ messages }}",
            ONE_TURN,
            {"continue_final_message": "reasoning_content", "add_generation_prompt": False},
            "the last message has no 'reasoning_content' to continue$",
        ),
        (
            "{{ messages[0].content[:3] }}",
            [{"role": "assistant", "content": "The answer is"}],
            {"add_generation_prompt": False},
            "the chat template in t does not write the last message as it is",
        ),
        (
            "{{ messages[0].content | replace('answer', 'result') }}",
            [{"role": "assistant", "content": "The answer is"}],
            {"add_generation_prompt": False},
            "the chat template in t does not write the last message as it is",
        ),
        (
            "{{ messages[0].content }}",
            [{"role": "assistant", "content": 5}],
            {"add_generation_prompt": False},
            "the last message's content is not text, got 5$",
        ),
        (
            "{{ messages[0].content }}",
            [{"role": "assistant", "content": [{"type": "image"}]}],
            {"add_generation_prompt": False},
            "the last message's content has no text block to continue$",
        ),
    ],
    ids=[
        "with a generation prompt",
        "no such field",
        "a template that cuts it",
        "a template that rewrites it",
        "not text",
        "no text block",
    ],
)
def test_continue_final_message_refusals_are_one_line(source, messages, settings, message):
    settings = {"continue_final_message": True, **settings}
    with pytest.raises(ValueError, match=f"^(continue_final_message: )?{message}") as raised:
        ChatTemplate(source, "t").render(messages, **settings)
    assert "\n" not in str(raised.value)


TRAINING_TEMPLATES = [
    "qwen3_training",
    "deepseekv3_training",
    "gptoss_training",
    "llama3_training",
    "phi3_training",
]


@pytest.mark.parametrize("tools", list(TOOL_SETS)[:2])
@pytest.mark.parametrize("name", TRAINING_TEMPLATES)
def test_trls_training_templates_render_with_the_spans_they_mark_as_transformers(name, tools):
    """TRL's training templates mark what the assistant writes with {% generation %}: the text, and each
    span's (start, end), are transformers' (its assistant mask before it becomes tokens); gpt-oss's reads
    the reasoning as `thinking`."""
    from transformers.utils.chat_template_utils import render_jinja_template

    trl = pytest.importorskip("trl")
    with open(
        os.path.join(os.path.dirname(trl.__file__), "chat_templates", f"{name}.jinja"), encoding="utf-8"
    ) as f:
        source = f.read()
    answer = {"role": "assistant", "content": "It is 525.", "reasoning_content": "add 70"}
    messages = [*CONVERSATIONS["system turn"][:1], *CONVERSATIONS["tool call and response"], answer]
    specials = {"bos_token": "<s>", "eos_token": "</s>"}
    (expected,), (spans,) = render_jinja_template(
        [messages], TOOL_SETS[tools], chat_template=source, return_assistant_tokens_mask=True, **specials
    )
    template = ChatTemplate(source, name, specials)
    rendered = template.render_with_generation_spans(messages, TOOL_SETS[tools], add_generation_prompt=False)
    assert rendered == (expected, [tuple(span) for span in spans])
    text, spans = rendered
    assert len(spans) >= 2 and sum(text[start:end].count("It is 525.") for start, end in spans) == 1
    assert template.render(messages, TOOL_SETS[tools], add_generation_prompt=False) == text


def test_a_template_without_generation_blocks_marks_no_spans_and_a_continued_message_is_refused():
    template = ChatTemplate(real_template("qwen3"), "qwen3")
    assert template.render_with_generation_spans(ONE_TURN) == (template.render(ONE_TURN), [])
    with pytest.raises(ValueError, match="^continue_final_message cuts the text the generation spans are in"):
        template.render_with_generation_spans(
            ONE_TURN, add_generation_prompt=False, continue_final_message=True
        )


@pytest.mark.parametrize(
    "source",
    [
        "{% set m = {'a': 1} %}{{ dict.update(m, {'a': 2}) }}{{ m.a }}",  # the dict type's own methods
        "{% set ns = namespace(_x=1) %}{{ ns._x }}",
        "{% set ns = namespace() %}{% set ns._y = 2 %}",
    ],
    ids=["dict.update", "namespace(_x)", "ns._y"],
)
def test_what_transformers_dict_and_namespace_refuse_is_refused(hf_qwen3, source):
    with pytest.raises(Exception):  # noqa: B017 (transformers' own: jinja2's UndefinedError, SecurityError)
        hf_qwen3.apply_chat_template(ONE_TURN, chat_template=source, tokenize=False)
    with pytest.raises(ValueError, match="^the chat template in t failed on this conversation: ") as raised:
        ChatTemplate(source, "t").render(ONE_TURN)
    assert "\n" not in str(raised.value)


def test_what_transformers_dict_and_namespace_do_is_the_same(hf_qwen3):
    source = (
        "{{ dict(a=1) | tojson }} {{ dict.fromkeys(['x'], 0) | tojson }} "
        "{% set ns = namespace(n=1, self=2) %}{% set ns.n = ns.n + ns.self %}{{ ns.n }}"
    )
    text = ChatTemplate(source, "t").render(ONE_TURN, add_generation_prompt=False)
    assert (
        text
        == hf_qwen3.apply_chat_template(ONE_TURN, chat_template=source, tokenize=False)
        == '{"a": 1} {"x": 0} 3'
    )


# A tool whose description is not ASCII, and has characters HTML would escape: tojson keeps them as they are
RECHNER = {
    "type": "function",
    "function": {
        "name": "rechner",
        "description": "Rechnet 2×3 — über <b>&</b> 計算",
        "parameters": {
            "type": "object",
            "properties": {"ausdruck": {"type": "string", "description": "z. B. 2×3"}},
        },
    },
}
# Templates whose text depends on how transformers sets up the environment, one setting each
SETTINGS = {
    "trim_blocks": "{% if true %}\nA{% endif %}\nB",
    "lstrip_blocks": "  {% if true %}A{% endif %} x\n   {% for i in [1] %}B{% endfor %}",
    "loop controls": (
        "{% for m in [1, 2, 3, 4] %}{% if m == 2 %}{% continue %}{% endif %}"
        "{% if m == 4 %}{% break %}{% endif %}{{ m }}{% endfor %}"
    ),
    "tojson": "{{ tools | tojson }}",
    "tojson's keywords": "{{ tools[0] | tojson(indent=2, sort_keys=True, separators=(',', ': ')) }}",
    "tojson ensure_ascii": "{{ tools[0].function.description | tojson(ensure_ascii=True) }}",
    "strftime_now": "{{ strftime_now('%Y') | length }}",
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_the_environment_is_set_up_as_transformers_sets_it_up(hf_qwen3, setting):
    source = SETTINGS[setting]
    text = ChatTemplate(source, "t").render(ONE_TURN, tools=[RECHNER], add_generation_prompt=False)
    assert text == hf_qwen3.apply_chat_template(
        ONE_TURN, tools=[RECHNER], chat_template=source, tokenize=False
    )
    expected = {"trim_blocks": "AB", "lstrip_blocks": "A x\nB", "loop controls": "13", "strftime_now": "4"}
    assert text == expected.get(setting, text)
    if setting.startswith("tojson"):  # the text as it is, unless ensure_ascii asks for \u escapes
        assert ("計算" in text and "<b>&</b>" in text) != (setting == "tojson ensure_ascii")


def test_a_tool_described_in_other_scripts_is_declared_as_transformers_declares_it(pair):
    hf, mine = pair
    text = mine.apply_chat_template(ONE_TURN, tools=[RECHNER, CALCULATOR])
    assert text == hf.apply_chat_template(
        ONE_TURN, tools=[RECHNER, CALCULATOR], tokenize=False, add_generation_prompt=True
    )
    ids = hf.apply_chat_template(ONE_TURN, tools=[RECHNER, CALCULATOR], add_generation_prompt=True)
    assert mine.encode(text) == list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if mine.chat_template(tools=True).takes_tools:
        assert "Rechnet 2×3 — über <b>&</b> 計算" in text


def test_the_budgets_bounds_are_exact(monkeypatch):
    """A render may spend exactly its budget and no more: range() is one call and each of its items one
    step; MAX_CHARS characters, written or repeated; lipsum() of MAX_CHARS // 4 words; an integer of
    MAX_INT_BITS bits (2 ** 99999 has 100,000; a product at most the sum of its factors' bits)."""
    monkeypatch.setattr(template_sandbox, "MAX_STEPS", 10)
    monkeypatch.setattr(template_sandbox, "MAX_CHARS", 400)
    monkeypatch.setattr(
        template_sandbox, "generate_lorem_ipsum", lambda *arguments: "lorem"
    )  # words unwritten
    within = {
        "{% for i in range(9) %}{% endfor %}ok": "ok",
        "{{ 'x' * 400 }}": "x" * 400,
        "{{ lipsum(1) }}": "lorem",
        "{{ 2 ** 99999 % 7 }}": str(pow(2, 99999, 7)),
        "{{ (2 ** 50000) * (2 ** 49998) % 7 }}": str(pow(2, 99998, 7)),
    }
    for source, text in within.items():
        assert ChatTemplate(source, "t").render(ONE_TURN) == text, source
    beyond = {
        "{% for i in range(10) %}{% endfor %}": "made more than 10 loop iterations and calls",
        "{{ 'x' * 399 }}{{ 'yy' }}": "wrote more than 400 characters",
        "{{ 'x' * 401 }}": "repeats a str to more than 400 items",
        "{{ lipsum(2) }}": "asks lipsum() for 2 paragraphs of up to 100 words",
        "{{ 2 ** 100000 % 7 }}": "computes an integer of more than 100,000 bits with **",
        "{{ (2 ** 50000) * (2 ** 49999) % 7 }}": "computes an integer of more than 100,000 bits with *",
    }
    for source, message in beyond.items():
        with pytest.raises(ValueError, match=re.escape(f"the chat template in t {message}")):
            ChatTemplate(source, "t").render(ONE_TURN)


def test_what_star_and_power_build_within_the_budget_is_transformers(hf_qwen3):
    source = (
        "{{ 6 * 7 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ 3 * 'c' }} {{ 1.5 * 2 }} {{ true * 'x' }} "
        "{{ 2.0 ** 0.5 }} {{ 2 ** -1 }} {{ 1 ** 1000000 }} {{ (-1) ** 1000001 }} {{ 0 ** 5 }} {{ 3 ** 0 }}"
    )
    text = ChatTemplate(source, "t").render(ONE_TURN, add_generation_prompt=False)
    assert text == hf_qwen3.apply_chat_template(ONE_TURN, chat_template=source, tokenize=False)
    assert text == "42 ababab [1, 1] ccc 3.0 x 1.4142135623730951 0.5 1 -1 0 1"


def test_lipsum_is_jinja2s(hf_qwen3):
    """lipsum() and its arguments as jinja2 (and so transformers) gives them, from the same random draws."""
    source = "{{ lipsum() }}|{{ lipsum(2, false, 5, 10) }}"
    random.seed(7)
    text = ChatTemplate(source, "t").render(ONE_TURN, add_generation_prompt=False)
    random.seed(7)
    assert text == hf_qwen3.apply_chat_template(ONE_TURN, chat_template=source, tokenize=False)
    assert text.count("<p>") == 5 and text.split("|")[1].count("\n\n") == 1
