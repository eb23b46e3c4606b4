"""Stage 1 of the loop, rollout: the runner that answers a completion's tool calls, and their stats.

In: a completion's token ids up to a call's end marker, handed over by the sampler, which pauses that
row (rollout/tool_turns.py). Out: the observation's token ids, the tool's response between the format's
response markers, and a `ToolCall` record per call, which generate returns in Samples.tool_calls for the
metrics and the trace. It knows text, the tokenizer and the tools (registry.py: the tools, the formats
and `register_tool`); not the model, tensors or rewards.

A bad call (a parse error, an unknown tool, malformed JSON) is answered with "error: ..." as its
observation, never an exception: the policy learns from its mistakes in context. So is anything a tool
raises, SystemExit and KeyboardInterrupt included; a tool that bounds its own time raises TimeoutError,
and its call counts as timed out (`ToolCall.timed_out`, logged as tools/timeout_frac).

Each call runs in one of the process's reused daemon threads (at most WORKERS, made as calls need them)
while the other rows decode. Its time limit counts from when a thread starts running it, so a call
waiting for a free thread is not charged for the wait; only past WORKERS calls at once does a queued
call's limit count from when it was made, so that tools that hang cannot hold the others forever. The
limit is enforced where the engine polls for it: past it the row gets "error: timed out" and goes on. A
Python function cannot be killed, so a tool that never returns keeps its thread, but a daemon thread
does not keep the process from exiting. The tools that can run for long run elsewhere and stop
themselves: the calculator in its worker processes, the python tool in the sandbox, each killed at its
own limit.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .registry import FORMATS, TOOLS, Tool, ToolError, ToolFormat, check_format_against_template, check_tools

MAX_CALL_CHARS = 2_000  # a call's text longer than this is refused unread
WORKERS = 64  # threads the process runs calls in at once; more calls wait for one
MAX_RESPONSE_CHARS = 1_000  # a response is cut here, with TRUNCATED after it
TRUNCATED = " ...[truncated]"


# --- the runner -----------------------------------------------------------------------------------
@dataclass
class ToolCall:
    """One call a completion made, as the metrics and the trace see it."""

    tool: str  # the tool's name ("" when the call named none we know)
    call: str  # the call's text between its markers
    response: str  # what the tool answered, before the format's markers are put around it
    error: bool = False  # the response is an error: a bad call, a failed run, a timeout
    timed_out: bool = False  # no answer within the tool's time limit
    seconds: float = 0.0  # from the call's start to its answer (or its time limit)


@dataclass
class _Pending:
    """A call being answered: what its thread and the engine's polls share."""

    call: ToolCall
    time_limit: float  # seconds it may run, from when its thread starts running it
    started: float = field(default_factory=time.monotonic)  # when the call was made
    began: float | None = None  # when its thread started running it; None while it waits for a slot
    answer: tuple[str, bool, bool] | None = None  # (response, error, timed_out) once it has one
    abandoned: bool = False  # answered "timed out", or the runner closed: its thread must not run it


def _run(pending: _Pending, tool: Tool, argument: str) -> None:
    """A call, in a thread of THREADS: the tool's answer, unless the call was abandoned while it waited
    (a queued call is answered "timed out" at its limit, counted from when it was made)."""
    if not pending.abandoned:
        pending.began = time.monotonic()
        pending.answer = _answer(tool, argument)


class Threads:
    """Up to WORKERS daemon threads, made as calls need them and reused. Reused: a thread started per call
    cost about twice as much per call (benchmarks/README.md). Daemon threads: the interpreter does not
    wait for them at exit, so a tool that never returns cannot keep the process alive (a
    ThreadPoolExecutor's threads are joined at exit)."""

    def __init__(self):
        self.jobs = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.threads = 0  # started so far
        self.idle = 0  # waiting for a job

    def submit(self, job: Callable[[], None]) -> None:
        with self.lock:
            start = self.idle <= 0 and self.threads < WORKERS
            if start:
                self.threads += 1
            else:
                self.idle -= 1  # the job is an idle thread's (or waits for the first that is free)
        if start:
            threading.Thread(target=self._work, args=(job,), name="minigrpo-tool", daemon=True).start()
        else:
            self.jobs.put(job)

    def _work(self, job: Callable[[], None]) -> None:
        while True:
            job()
            with self.lock:
                self.idle += 1
            job = self.jobs.get()


THREADS = Threads()  # the process's tool threads, shared by every runner


class ToolRunner:
    """The sampler's ToolHook for one generate() call: it reads each call, runs it in a thread of its own,
    and answers with the observation's token ids. Requests are that call's rows, so make a runner per
    generate() call; as a context manager it abandons the calls still running when it closes."""

    def __init__(self, tokenizer, format: str | ToolFormat, tools: list[str], max_tool_calls: int):
        check_tools(tools, format, max_tool_calls)
        self.tokenizer = tokenizer
        self.format = FORMATS[format] if isinstance(format, str) else format
        check_format_against_template(
            tokenizer, self.format, format if isinstance(format, str) else "(custom)"
        )
        self.tools = {name: TOOLS[name] for name in tools}
        self.max_tool_calls = max_tool_calls
        self.start_token_id = self._one_token(self.format.call_start)
        self.end_token_id = self._one_token(self.format.call_end)
        # what a response may not spell: the markers, and every special token (an EOS would end the row)
        self.forbidden = sorted(
            {
                self.format.call_start,
                self.format.call_end,
                *self._response_markers(),
                *self._special_tokens(),
            },
            key=len,
            reverse=True,
        )
        self.pending: dict[int, _Pending] = {}
        self.made: dict[int, list[ToolCall]] = {}

    # the ToolHook interface (rollout/tool_turns.py)
    def start(self, request: int, completion: list[int]) -> ToolCall:
        """Start the call that `completion` (ending with the end marker) makes; its record, which the
        answer completes."""
        call = ToolCall(tool="", call="", response="")
        self.made.setdefault(request, []).append(call)
        try:
            tool, argument = self._read_call(completion, call)
        except ToolError as error:
            self.pending[request] = _Pending(call, 0.0, answer=(f"error: {error}", True, False))
            return call
        pending = _Pending(call, tool.time_limit)
        self.pending[request] = pending
        THREADS.submit(lambda: _run(pending, tool, argument))
        return call

    def poll(self, request: int) -> list[int] | None:
        """The observation's token ids once the call has answered or run out of time; None until then."""
        pending = self.pending[request]
        call = pending.call
        if pending.answer is not None:
            response, error, timed_out = pending.answer
            call.response = _cut(response)
            call.error = error
            call.timed_out = timed_out
        elif time.monotonic() >= (pending.began or pending.started) + pending.time_limit:
            pending.abandoned = True  # a Python function cannot be stopped; its thread ends when it returns
            call.response = f"error: timed out after {pending.time_limit:g} s"
            call.error = True
            call.timed_out = True
        else:
            return None
        call.seconds = time.monotonic() - pending.started
        del self.pending[request]
        return self._observation(call.response)

    def calls(self, request: int) -> list[ToolCall]:
        """Request `request`'s call records, for callers of the runner itself (generate reports the
        same records as Samples.tool_calls)."""
        return list(self.made.get(request, []))

    def close(self) -> None:
        """Abandon the calls still queued or running (a running tool's thread ends when it returns); the
        calls made stay readable."""
        for pending in self.pending.values():
            pending.abandoned = True
        self.pending.clear()

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    # reading a call, writing an observation
    def _read_call(self, completion: list[int], call: ToolCall) -> tuple[Tool, str]:
        """The tool and the input of the call `completion` ends with; ToolError for a bad call."""
        start = self._call_start(completion)
        if start is None:
            raise ToolError("the call was closed but never opened")
        body = completion[start + 1 : -1]
        call.call = self.tokenizer.decode(body)
        if len(call.call) > MAX_CALL_CHARS:
            raise ToolError(f"call longer than {MAX_CALL_CHARS} characters")
        if self.format.tool is not None:
            name = self.format.tool
            arguments = call.call
        else:
            name, arguments = _read_json_call(call.call)
        if name not in self.tools:
            raise ToolError(f"unknown tool {name!r:.40}; this run has {', '.join(self.tools)}")
        call.tool = name
        tool = self.tools[name]
        return tool, tool.parse(arguments)

    def _call_start(self, completion: list[int]) -> int | None:
        """The index of the start marker of the call `completion` ends with: the last one since the
        previous call's end (None if there is none), found reading back from the end, so that a call
        costs its own length however long the completion has grown. A token spells at least one
        character, so past MAX_CALL_CHARS tokens back the call is too long, opened or not."""
        lowest = max(0, len(completion) - 2 - MAX_CALL_CHARS)  # the furthest back a start may be
        for i in range(len(completion) - 2, lowest - 1, -1):
            if completion[i] == self.end_token_id:
                return None  # an earlier call's start belongs to that call
            if completion[i] == self.start_token_id:
                return i
        if lowest > 0:
            raise ToolError(f"call longer than {MAX_CALL_CHARS} characters")
        return None

    def _observation(self, response: str) -> list[int]:
        """The response, cleaned of markers and special tokens, between the response markers."""
        cleaned = None
        while cleaned != response:  # removing one can join another from its halves: "</ca</calc>lc>"
            cleaned = response
            for text in self.forbidden:
                response = response.replace(text, "")
        return self.tokenizer.encode(self.format.response_start + response + self.format.response_end)

    def _one_token(self, marker: str) -> int:
        ids = self.tokenizer.encode(marker)
        if len(ids) != 1:
            raise ValueError(
                f"the tool-call marker {marker!r} is {len(ids)} tokens of this tokenizer, not one: "
                "add it to the tokenizer as a token of its own (pretrain_tiny.py's calc markers are)"
            )
        return ids[0]

    def _response_markers(self) -> list[str]:
        """The response markers' special tokens ("<out>", "<tool_response>", "<|im_end|>", ...)."""
        return [
            text
            for text in self._special_tokens() + ["<out>", "</out>", "<tool_response>", "</tool_response>"]
            if text in self.format.response_start + self.format.response_end
        ]

    def _special_tokens(self) -> list[str]:
        added = self.tokenizer.backend.get_added_tokens_decoder().values()
        return [token.content for token in added if token.content]


def _answer(tool: Tool, argument: str) -> tuple[str, bool, bool]:
    """(response, error, timed_out) of one run of a tool. Anything it raises is an error observation,
    SystemExit and KeyboardInterrupt too: raised by a tool in its own thread, they stop nothing else."""
    try:
        answer = (str(tool.run(argument)), False, False)
    except ToolError as failure:
        answer = (f"error: {failure}", True, False)
    except TimeoutError as failure:  # a tool that stopped itself at its own limit
        answer = (f"error: {failure}", True, True)
    except BaseException as failure:  # a user's tool failing: the completion sees why, the run goes on
        answer = (f"error: {_described(failure)}"[:200], True, False)
    response, error, timed_out = answer
    return _encodable(response), error, timed_out


def _described(failure: BaseException) -> str:
    """The failure as "RuntimeError: boom", or as "KeyboardInterrupt" when it has no message."""
    message = str(failure)
    return f"{type(failure).__name__}: {message}" if message else type(failure).__name__


def _encodable(text: str) -> str:
    """`text` as UTF-8 can hold it: a lone surrogate (half of a UTF-16 pair, such as "\\ud800"), which no
    tokenizer encodes, becomes "?"."""
    return text.encode("utf-8", errors="replace").decode("utf-8")


def _cut(response: str) -> str:
    """A response of at most MAX_RESPONSE_CHARS characters, marked where it was cut."""
    return response if len(response) <= MAX_RESPONSE_CHARS else response[:MAX_RESPONSE_CHARS] + TRUNCATED


def _read_json_call(text: str) -> tuple[str, object]:
    """(name, arguments) of a JSON call {"name": ..., "arguments": {...}}."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise ToolError('a call is a JSON object {"name": ..., "arguments": {...}}') from None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ToolError('a call is a JSON object {"name": ..., "arguments": {...}}')
    return value["name"], value.get("arguments", {})


# --- metrics --------------------------------------------------------------------------------------
def tool_stats(rollouts, names: list[str]) -> dict[str, float]:
    """The logger's tool stats over a step's rollouts, overall and per tool: calls per completion, the
    share of calls answered with an error, the share that timed out (the one part of a tool's answer
    that can depend on the machine's load rather than on the call), the share of completions ended by
    the call limit, and the seconds the calls took (summed: they overlap with decoding and each other)."""
    calls = [call for r in rollouts for call in r.tool_calls]
    count = max(len(rollouts), 1)
    stats = {
        "tools/calls_per_completion": len(calls) / count,
        "tools/error_frac": sum(c.error for c in calls) / max(len(calls), 1),
        "tools/timeout_frac": sum(c.timed_out for c in calls) / max(len(calls), 1),
        "tools/limit_frac": sum(r.finish_reason == "tool_limit" for r in rollouts) / count,
        "tools/seconds": sum(c.seconds for c in calls),
    }
    for name in names:
        mine = [c for c in calls if c.tool == name]
        stats[f"tools/{name}/calls_per_completion"] = len(mine) / count
        stats[f"tools/{name}/error_frac"] = sum(c.error for c in mine) / max(len(mine), 1)
        stats[f"tools/{name}/timeout_frac"] = sum(c.timed_out for c in mine) / max(len(mine), 1)
        stats[f"tools/{name}/seconds"] = sum(c.seconds for c in mine)
    return stats
