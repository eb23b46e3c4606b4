"""The tools a completion may call, and the runner that reads its calls and writes its observations."""

import dataclasses
import json
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from helpers import fixed_logits_model, tiny_tokenizer

import minigrpo
import minigrpo.tools.registry as registry
import minigrpo.tools.runner as runner_module
from minigrpo.tools import TOOLS, Tool, ToolCall, ToolRunner, calculator, register_tool

MARKERS = (
    "<calc>",
    "</calc>",
    "<out>",
    "</out>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(str(tmp_path_factory.mktemp("tool-tokenizer")), MARKERS)


def answer(runner, request, text, tokenizer, patience=10.0):
    """Make the call `text` (ending with the format's end marker) and wait for its observation, as text."""
    runner.start(request, tokenizer.encode(text))
    deadline = time.monotonic() + patience
    while (observation := runner.poll(request)) is None:
        assert time.monotonic() < deadline, "the call was never answered"
        time.sleep(0.001)
    return tokenizer.decode(observation)


@pytest.mark.parametrize(
    "expression, value",
    [
        ("347*56", "19432"),
        ("19432 + 812", "20244"),
        ("1/3+1/6", "1/2"),
        ("2^10", "1024"),
        ("2**10", "1024"),
        ("0.1+0.2", "3/10"),
        ("3-5*2", "-7"),
        ("(7)/(2)", "7/2"),
        ("sqrt(2)", "1.41421356237310"),
        ("10^100", "1.00000000000000e+100"),  # past 60 characters: 15 significant digits
    ],
)
def test_the_calculator_is_exact(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    "expression, error",
    [
        ("1/0", "division by zero"),
        ("9^{9^{9^9}}", "result too large"),
        ("9^9^9^9", "not an arithmetic expression"),
        ("9" * 1_000_000, "call longer than 2000 characters"),  # refused unread, before decoding
        ("(" * 100_000, "call longer than 2000 characters"),
        ("9" * 300, "expression longer than 200 characters"),
        ("(" * 150, "not an arithmetic expression"),
        ("x + 1", "not an arithmetic expression"),
        ("import os", "not an arithmetic expression"),
        ("__import__('os').system('ls')", "not an arithmetic expression"),
        ("", "empty expression"),
        ("(-8)^(1/3)", "not a real number"),
    ],
    ids=lambda value: value if len(value) < 40 else f"{value[:10]}... ({len(value)} characters)",
)
def test_hostile_calculator_calls_are_answered_with_an_error_at_once(tokenizer, expression, error):
    calculator("1")  # a calculator worker started: the limit below times the call, not sympy's import
    completion = tokenizer.encode(f"<calc>{expression}</calc>")
    with ToolRunner(tokenizer, "calc", ["calculator"], max_tool_calls=4) as runner:
        started = time.monotonic()
        runner.start(0, completion)
        while (observation := runner.poll(0)) is None:
            time.sleep(0.001)
        assert time.monotonic() - started < 2.0
        (call,) = runner.calls(0)
    assert call.error and call.response.startswith(f"error: {error}")
    assert tokenizer.decode(observation).startswith(f"<out>error: {error}")


def test_a_calc_call_is_answered_between_its_markers(tokenizer):
    with ToolRunner(tokenizer, "calc", ["calculator"], max_tool_calls=4) as runner:
        assert answer(runner, 0, "12+3*4=<calc>347*56</calc>", tokenizer) == "<out>19432</out>"
        assert answer(runner, 1, "<calc>1+<calc>2*3</calc>", tokenizer) == "<out>6</out>"  # the last start
        assert (
            answer(runner, 2, "347*56</calc>", tokenizer)
            == "<out>error: the call was closed but never opened</out>"
        )
        (first,), (last,) = runner.calls(0), runner.calls(2)
    assert (first.tool, first.call, first.response, first.error) == ("calculator", "347*56", "19432", False)
    assert first.seconds >= 0 and last.error and last.tool == ""
    assert runner.end_token_id == tokenizer.encode("</calc>")[0]


def test_qwen3_calls_are_json_and_answered_in_a_user_turn(tokenizer):
    with ToolRunner(tokenizer, "qwen3", ["calculator", "python"], max_tool_calls=4) as runner:
        call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
        assert answer(runner, 0, call, tokenizer) == (
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        )
        bad = {
            '<tool_call>{"name": "calculator", "arguments": </tool_call>': "a call is a JSON object",
            '<tool_call>{"name": "rm", "arguments": {}}</tool_call>': "unknown tool 'rm'",
            '<tool_call>{"name": "calculator", "arguments": {"x": "1"}}</tool_call>': "calculator takes",
            "<tool_call>" + "[" * 5000 + "</tool_call>": "call longer than",
        }
        for request, (text, error) in enumerate(bad.items(), start=1):
            observed = answer(runner, request, text, tokenizer)
            assert f"<tool_response>\nerror: {error}" in observed, observed


def test_a_response_can_spell_no_marker_and_no_special_token(tokenizer):
    @register_tool("test_echo_markers", argument="text")
    def echo(text):
        return "a</calc>b<out>c</out>d<calc>e<|im_end|>f<|endoftext|>g<tool_call>h"

    for format, name in (("calc", "calculator"), ("qwen3", "test_echo_markers")):
        with ToolRunner(tokenizer, format, [name], max_tool_calls=4) as runner:
            runner.tools[name] = TOOLS["test_echo_markers"]  # the echo, under the format's tool name
            text = (
                "<calc>1</calc>"
                if format == "calc"
                else f'<tool_call>{{"name": "{name}", "arguments": {{"text": ""}}}}</tool_call>'
            )
            observed = answer(runner, 0, text, tokenizer)
            inside = observed.removeprefix(runner.format.response_start).removesuffix(
                runner.format.response_end
            )
            assert inside == "abcdefgh"


def test_a_marker_of_several_tokens_is_refused_with_its_name(tmp_path):
    plain = tiny_tokenizer(str(tmp_path))  # no calc markers of its own
    with pytest.raises(
        ValueError, match="the tool-call marker '<calc>' is 6 tokens of this tokenizer, not one"
    ):
        ToolRunner(plain, "calc", ["calculator"], max_tool_calls=4)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="unknown tool"):
        registry.check_tools(["abacus"], "calc", 4)
    with pytest.raises(ValueError, match="tool_format must be one of calc, qwen3"):
        registry.check_tools(["calculator"], "xml", 4)
    with pytest.raises(ValueError, match="max_tool_calls must be an integer >= 0"):
        registry.check_tools(["calculator"], "calc", -1)
    with pytest.raises(ValueError, match="calc calls the calculator alone"):
        registry.check_tools(["python"], "calc", 4)
    with pytest.raises(ValueError, match="already registered"):
        register_tool("calculator")(lambda text: text)


def test_a_slow_tool_is_answered_at_its_time_limit_and_polling_never_blocks(tokenizer):
    @register_tool("test_slow", time_limit=0.3, argument="text")
    def slow(text):
        time.sleep(3)
        return "late"

    with ToolRunner(tokenizer, "qwen3", ["test_slow"], max_tool_calls=4) as runner:
        started = time.monotonic()
        runner.start(
            0, tokenizer.encode('<tool_call>{"name": "test_slow", "arguments": {"text": ""}}</tool_call>')
        )
        polls = []
        while True:
            t = time.monotonic()
            observation = runner.poll(0)
            polls.append(time.monotonic() - t)
            if observation is not None:
                break
            time.sleep(0.01)
        waited = time.monotonic() - started
        (call,) = runner.calls(0)
    # at its limit, not when the tool returns (3 s); a poll never waits for it (margins for a loaded CI)
    assert 0.3 <= waited < 2.5 and max(polls) < 0.5
    assert call.timed_out and call.error and call.response == "error: timed out after 0.3 s"


def test_a_thousand_calls_in_one_completion_stay_fast(tokenizer):
    with ToolRunner(tokenizer, "calc", ["calculator"], max_tool_calls=1000) as runner:
        completion = []
        started = time.monotonic()
        for i in range(1000):
            completion += tokenizer.encode(f"<calc>{i}+1</calc>")
            runner.start(0, completion)
            while (observation := runner.poll(0)) is None:
                time.sleep(0.0005)
            completion += observation
        calls = runner.calls(0)
    assert len(calls) == 1000 and calls[-1].response == "1000" and not any(c.error for c in calls)
    assert time.monotonic() - started < 30


def test_many_calls_at_once_each_get_their_whole_time_limit(tokenizer):
    """Eight calls of a tool that takes 0.6 s of its 1 s each, made at once: all answer, none waits
    behind the others and times out (a pool of 4 workers once let the last 4 time out in its queue)."""

    responses = slow_calls_at_once(tokenizer, "test_sleepy", 8)
    assert responses == ["ok"] * 8


def slow_calls_at_once(tokenizer, name: str, count: int) -> list[str]:
    """`count` calls made at once (requests 0, 1, ...) of a tool registered here as `name`, which takes
    0.6 s of its 1 s limit; their responses once every one is answered."""

    @register_tool(name, time_limit=1.0, argument="text")
    def slow(text):
        time.sleep(0.6)
        return "ok"

    call = f"<tool_call>{json.dumps({'name': name, 'arguments': {'text': ''}})}</tool_call>"
    with ToolRunner(tokenizer, "qwen3", [name], max_tool_calls=4) as runner:
        for request in range(count):
            runner.start(request, tokenizer.encode(call))
        answered = set()
        while len(answered) < count:
            answered |= {r for r in set(range(count)) - answered if runner.poll(r) is not None}
            time.sleep(0.01)
        return [runner.calls(r)[0].response for r in range(count)]


@pytest.fixture
def quick_python(monkeypatch):
    """The python tool with a 1-second limit, so the tests of its limits stay short."""
    monkeypatch.setitem(TOOLS, "python", dataclasses.replace(TOOLS["python"], time_limit=1.0))


def test_python_calls_answer_with_stdout_or_the_errors_last_line(tokenizer, quick_python):
    """Hostile programs side by side in their sandboxes: each is answered within its limit, never raises."""
    cases = {
        "print(6 * 7)": "42\n",
        "print('y' * 5000)": "y" * runner_module.MAX_RESPONSE_CHARS + runner_module.TRUNCATED,
        "1 / 0": "error: ZeroDivisionError: division by zero",
        "import time; time.sleep(60)": "error: timed out after 1 s",
        "import os\nwhile True:\n    os.fork()": "error: BlockingIOError: [Errno 11] Resource temporarily unavailable",  # noqa: E501
        "import sys\nwhile True: sys.stdout.write('x' * 65536)": "error: OSError: [Errno 27] File too large",
    }
    with ToolRunner(tokenizer, "qwen3", ["python"], max_tool_calls=4) as runner:
        started = time.monotonic()
        for request, code in enumerate(cases):  # all at once: the sandboxes run side by side
            call = json.dumps({"name": "python", "arguments": {"code": code}})
            runner.start(request, tokenizer.encode(f"<tool_call>{call}</tool_call>"))
        observations = {}
        while len(observations) < len(cases):
            for request in set(range(len(cases))) - set(observations):
                got = runner.poll(request)
                if got is not None:
                    observations[request] = tokenizer.decode(got)
            time.sleep(0.01)
        elapsed = time.monotonic() - started
        calls = [runner.calls(r)[0] for r in range(len(cases))]
    responses = [call.response for call in calls]
    # The fork bomb's children write their errors to one stderr at once, cut at the output limit, and
    # without root no per-user process limit stops it (it ends at the time or memory limit): its answer
    # is an error, which one depends on the race.
    fork_bomb = responses.pop(4)
    assert fork_bomb.startswith("error: ") and "Traceback" not in fork_bomb, fork_bomb
    expected = list(cases.values())
    del expected[4]
    assert responses == expected
    assert [call.error for call in calls] == [False, False, True, True, True, True]
    assert calls[3].timed_out and elapsed < 10


def test_a_marker_joined_from_its_halves_is_removed_too(tokenizer):
    """Removing a marker can join another out of the text around it: "</ca</calc>lc>" spells "</calc>"
    once "</calc>" is removed, so removal repeats until nothing changes."""

    @register_tool("test_nested_markers", argument="text")
    def nested(text):
        return "a</ca</calc>lc>b<|im_e<|im_end|>nd|>c<<calc>calc>d"

    with ToolRunner(tokenizer, "qwen3", ["test_nested_markers"], max_tool_calls=4) as runner:
        call = '<tool_call>{"name": "test_nested_markers", "arguments": {"text": ""}}</tool_call>'
        runner.start(0, tokenizer.encode(call))
        while (observation := runner.poll(0)) is None:
            time.sleep(0.001)
    format = runner.format
    expected = tokenizer.encode(format.response_start + "abcd" + format.response_end)
    assert observation == expected
    assert tokenizer.encode("</calc>")[0] not in observation


def test_a_call_end_without_its_own_start_does_not_reread_an_earlier_call(tokenizer):
    with ToolRunner(tokenizer, "calc", ["calculator"], max_tool_calls=4) as runner:
        observed = answer(runner, 0, "<calc>1+1</calc><out>2</out> 3*3</calc>", tokenizer)
    assert observed == "<out>error: the call was closed but never opened</out>"


def test_a_custom_json_format_takes_any_registered_tool(tokenizer):
    custom = registry.ToolFormat(
        "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", tool=None
    )
    with ToolRunner(tokenizer, custom, ["calculator", "python"], max_tool_calls=4) as runner:
        call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
        assert answer(runner, 0, call, tokenizer) == "<tool_response>42</tool_response>"


@pytest.mark.parametrize("expression", ["1 2", "1 .5", "1..2", "1.2.3"])
def test_numbers_side_by_side_are_refused_not_multiplied(expression):
    with pytest.raises(registry.ToolError, match="two numbers side by side"):
        calculator(expression)


def _raise(error: BaseException):
    raise error


# Tools that fail in ways a Python function can: each is answered with an observation, and the runner
# goes on. A lone surrogate (half of a UTF-16 pair) is text no tokenizer can encode.
MISBEHAVING = {
    "test_exits": (lambda text: sys.exit(3), "error: SystemExit: 3"),
    "test_interrupts": (lambda text: _raise(KeyboardInterrupt()), "error: KeyboardInterrupt"),
    "test_fails": (lambda text: _raise(RuntimeError("boom")), "error: RuntimeError: boom"),
    "test_half_surrogate": (lambda text: "a\ud800b", "a?b"),
}
for _name, (_run, _) in MISBEHAVING.items():
    register_tool(_name, time_limit=1.0, argument="text")(_run)


@pytest.mark.parametrize("name", list(MISBEHAVING))
def test_a_misbehaving_tool_is_answered_with_an_observation_and_the_runner_goes_on(tokenizer, name):
    call = f'<tool_call>{{"name": "{name}", "arguments": {{"text": ""}}}}</tool_call>'
    with ToolRunner(tokenizer, "qwen3", [name], max_tool_calls=4) as runner:
        first = answer(runner, 0, call, tokenizer)
        second = answer(runner, 1, call, tokenizer)
        records = runner.calls(0) + runner.calls(1)
    format = runner.format
    expected = MISBEHAVING[name][1]
    assert first == second == format.response_start + expected + format.response_end
    assert [record.response for record in records] == [expected] * 2
    assert [record.timed_out for record in records] == [False] * 2


def test_generation_goes_on_past_tools_that_misbehave(tokenizer):
    """A model that samples only the calc markers, so that it makes call after call, each answered by a
    tool that fails in the next way of MISBEHAVING: the completion runs to its end, every call answered."""
    start, end = tokenizer.encode("<calc>")[0], tokenizer.encode("</calc>")[0]
    logits = torch.full((tokenizer.vocab_size,), -20.0)
    logits[start], logits[end] = 6.4, 5.0  # 4 to 1: most call ends close an opened call
    behaviours = [run for run, _ in MISBEHAVING.values()]
    made = []

    def misbehave(text):
        made.append(text)
        return behaviours[(len(made) - 1) % len(behaviours)](text)

    with ToolRunner(tokenizer, "calc", ["calculator"], max_tool_calls=40) as runner:
        runner.tools["calculator"] = Tool("calculator", misbehave, time_limit=1.0)
        samples = minigrpo.generate(
            fixed_logits_model(logits), [[start]], tools=runner, max_new_tokens=120, seed=0
        )
        ran = [call.response for call in runner.calls(0) if call.tool]  # the calls that ran the tool
    assert samples.finish_reasons == ["length"] and len(ran) == len(made) >= len(behaviours)
    expected = [response for _, response in MISBEHAVING.values()]
    assert ran == [expected[i % len(expected)] for i in range(len(ran))]


def test_a_tool_that_times_itself_out_is_counted_as_timed_out(tokenizer):
    """A tool that bounds its own time (the calculator, the python tool) raises TimeoutError: its message
    is the observation, and the call counts as timed out (tools/timeout_frac)."""

    @register_tool("test_self_timed", argument="text")
    def self_timed(text):
        raise TimeoutError("timed out after 1 s of its own")

    call = '<tool_call>{"name": "test_self_timed", "arguments": {"text": ""}}</tool_call>'
    with ToolRunner(tokenizer, "qwen3", ["test_self_timed"], max_tool_calls=4) as runner:
        observed = answer(runner, 0, call, tokenizer)
        (record,) = runner.calls(0)
    assert "<tool_response>\nerror: timed out after 1 s of its own\n" in observed, observed
    assert record.timed_out and record.error


def test_tool_stats_give_the_share_of_calls_that_timed_out():
    calls = [
        ToolCall("calculator", "1+1", "2"),
        ToolCall("calculator", "9^9^9", "error: timed out after 2 s", error=True, timed_out=True),
        ToolCall("python", "1/0", "error: ZeroDivisionError: division by zero", error=True),
        ToolCall("python", "while 1: pass", "error: timed out after 5 s", error=True, timed_out=True),
    ]
    rollouts = [
        SimpleNamespace(tool_calls=calls[:1], finish_reason="stop"),
        SimpleNamespace(tool_calls=calls[1:], finish_reason="tool_limit"),
    ]
    stats = runner_module.tool_stats(rollouts, ["calculator", "python"])
    assert (stats["tools/timeout_frac"], stats["tools/error_frac"]) == (0.5, 0.75)
    assert (stats["tools/calculator/timeout_frac"], stats["tools/python/timeout_frac"]) == (0.5, 0.5)
    assert stats["tools/calls_per_completion"] == 2.0 and stats["tools/limit_frac"] == 0.5


def test_the_python_tool_answers_with_the_last_line_of_its_error(quick_python):
    """A program that writes to stderr and then fails: the error's own line, not the first line."""
    with pytest.raises(registry.ToolError) as raised:
        registry.python("import sys\nprint('a warning first', file=sys.stderr)\n1 / 0")
    assert str(raised.value) == "ZeroDivisionError: division by zero"


def test_a_queued_call_is_timed_from_when_it_starts_not_when_it_was_made(tokenizer, monkeypatch):
    """One call at a time: the second of two 0.6 s calls (limit 1 s) waits 0.6 s for the first, then runs
    0.6 s. That is 1.2 s after it was made, but 0.6 s after it started: it is answered, not timed out."""
    monkeypatch.setattr(runner_module, "WORKERS", 1)
    monkeypatch.setattr(
        runner_module, "THREADS", runner_module.Threads()
    )  # none of the process's threads idle: one at a time

    responses = slow_calls_at_once(tokenizer, "test_queued", 2)
    assert responses == ["ok", "ok"]


def test_a_call_nested_too_deep_for_the_json_parser_is_an_error_not_a_crash(tokenizer):
    """1,500 '[' fit within the call's length limit but not within Python's recursion limit."""
    with ToolRunner(tokenizer, "qwen3", ["calculator"], max_tool_calls=4) as runner:
        observed = answer(runner, 0, "<tool_call>" + "[" * 1500 + "</tool_call>", tokenizer)
        (record,) = runner.calls(0)
    assert '<tool_response>\nerror: a call is a JSON object {"name": ...' in observed, observed[:200]
    assert record.error and record.tool == ""


def test_a_call_of_few_tokens_but_too_many_characters_is_refused(tokenizer):
    """Tokens of several characters each: under MAX_CALL_CHARS tokens, over MAX_CALL_CHARS characters."""
    body = "answer " * 400
    assert len(tokenizer.encode(body)) < runner_module.MAX_CALL_CHARS < len(body)
    with ToolRunner(tokenizer, "calc", ["calculator"], max_tool_calls=4) as runner:
        observed = answer(runner, 0, "<calc>" + body + "</calc>", tokenizer)
    assert f"error: call longer than {runner_module.MAX_CALL_CHARS} characters" in observed


def test_a_registered_tool_this_run_does_not_use_is_an_unknown_tool(tokenizer):
    """python is registered, but this runner has the calculator alone: a call to python is not run."""
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
    with ToolRunner(tokenizer, "qwen3", ["calculator"], max_tool_calls=4) as runner:
        observed = answer(runner, 0, call, tokenizer)
        (record,) = runner.calls(0)
    assert "error: unknown tool 'python'; this run has calculator" in observed and record.tool == ""
