"""Stage 1 of the loop, rollout: tool calls inside the decode loop, as the engine's one hook (engine.py).

In: at each decode step, the batch rows about to take a token and the tokens they drew. Out: a
`Steering` (which rows take an observation token instead of their draw, which wait on a call, which end
one call past the limit), and per completion the records of the calls it made. It knows token ids and a
`ToolHook` (tools.ToolRunner is one); not text, the model or the cache.

A row that draws the hook's end marker starts a call (unless the token ends the row: an EOS, or its
budget's last column) and pauses; the call runs while the other rows decode, and the row resumes with
the response's tokens (the observation) fed in as forced tokens, one per decode step. A paused row keeps
its random stream, so its completion does not depend on when the call returned.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from .decode_hook import Steering

POLL_SECONDS = 0.001  # how often a batch with every row waiting on a tool call looks for answers


class ToolHook(Protocol):
    """What the engine needs of a tool runner (tools.ToolRunner is one). A request is one completion of
    the call (prompt r // G's sample r % G); its tokens so far, observations included, are passed in."""

    end_token_id: int  # a drawn token with this id ends a call: its row pauses
    max_tool_calls: int  # calls per completion; the end marker of one more ends it ("tool_limit")

    def start(self, request: int, completion: list[int]) -> object:
        """Run the call `completion` ends with, in the background; the call's record (a tools.ToolCall),
        which generate reports in Samples.tool_calls."""

    def poll(self, request: int) -> list[int] | None:
        """The call's observation token ids once it is answered (or timed out); None while it runs."""


class ToolTurns:
    """The engine's DecodeHook for the tool calls of one generate() call: per request, the calls it made,
    whether one is running, and the observation tokens it has yet to take."""

    def __init__(self, tools: ToolHook, num_requests: int):
        self.tools = tools
        self.calls = [[] for _ in range(num_requests)]  # per request: the records of the calls it started
        self.made = [0] * num_requests  # per request: calls made, the one past the limit included
        self.running = set()  # requests whose call has not answered yet
        self.queued = {}  # request -> observation tokens still to feed, in order

    def steer(self, engine, which, drawn: torch.Tensor) -> Steering:
        """The steering of batch rows `which`, which drew `drawn` (b,): collect the answers, feed the rows
        that have observation tokens queued, hold the rows whose call still runs, and start the calls of
        the rows that drew the end marker (or stop them, past the limit)."""
        requests = engine.rows.requests[which].tolist()
        finished = engine.rows.finished[which].tolist()
        # wait for an answer only when no finished row could take a waiting request instead
        self.collect_answers(requests, finished, wait=not (engine.waiting and any(finished)))
        rows = len(requests)
        tokens = torch.zeros(rows, dtype=torch.long)  # (b,)
        forced = torch.zeros(rows, dtype=torch.bool)  # (b,)
        held = torch.zeros(rows, dtype=torch.bool)  # (b,)
        stopped = torch.zeros(rows, dtype=torch.bool)  # (b,)
        columns = engine.rows.columns[which].tolist()
        for row, (request, token) in enumerate(zip(requests, drawn.tolist())):
            if finished[row]:
                continue
            if self.queued.get(request):
                tokens[row] = self.queued[request].pop(0)
                forced[row] = True
            elif request in self.running:
                held[row] = True
            elif token == self.tools.end_token_id and not self.ends_row(engine, request, columns[row]):
                stopped[row] = self.start_call(engine, request, columns[row])
        device = engine.device
        return Steering(tokens.to(device), forced.to(device), held.to(device), stopped.to(device))

    def collect_answers(self, requests: list[int], finished: list[bool], wait: bool) -> None:
        """Queue the observations of the calls that have answered. When every unfinished row is waiting
        on a call and `wait`, wait here (a decode step would do nothing) until one answers."""
        while True:
            for request in requests:
                if request in self.running:
                    observation = self.tools.poll(request)
                    if observation is not None:
                        self.running.discard(request)
                        self.queued[request] = list(observation)
            waiting = [request in self.running for request, f in zip(requests, finished) if not f]
            if not wait or not waiting or not all(waiting):
                return
            time.sleep(POLL_SECONDS)

    def ends_row(self, engine, request: int, column: int) -> bool:
        """Whether the end marker, drawn for `column`, ends its row (as Engine.write_steered_tokens decides):
        an EOS, or the budget's last column. Such a row starts no call."""
        return (
            self.tools.end_token_id in engine.config.eos_token_ids
            or column == int(engine.completions.budgets[request]) - 1
        )

    def start_call(self, engine, request: int, column: int) -> bool:
        """Start the call whose end marker the request drew for `column`; True if it is one past the
        limit, which stops the row instead."""
        self.made[request] += 1
        if self.made[request] > self.tools.max_tool_calls:
            return True
        completion = engine.completions.tokens[request, :column].tolist() + [self.tools.end_token_id]
        self.calls[request].append(self.tools.start(request, completion))
        self.running.add(request)
        return False
