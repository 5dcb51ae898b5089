"""`Limits`: what a run cannot pass, and `Budget`, one agent's count against them.

Per turn and per session: model requests (a turn's steps), tool calls,
input, output and total tokens, and cost in USD. The session's figures are
counted from its log (its steps, its tool calls, its ``turn/usage`` records),
so they survive a resume. Counts are checked before the request or the call
that would pass them, so they hold exactly; tokens and cost are known only
once a step's reply reports them, so a token or cost limit ends the turn
after the step that crosses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Final, Protocol

import msgspec

from greenroom.protocol.events import (
    LimitReached,
    SessionEvent,
    StepStart,
    ToolCall,
    TurnUsage,
)
from greenroom.protocol.model import NO_USAGE, Usage

#: The fields of `Limits` that count, in the order a crossing is reported.
_COUNTS: Final = (
    "requests",
    "tool_calls",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "session_requests",
    "session_tool_calls",
    "session_input_tokens",
    "session_output_tokens",
    "session_total_tokens",
)
#: The fields of `Limits` in USD, reported after the counts.
_COSTS: Final = ("cost_usd", "session_cost_usd")
_FIELDS: Final = _COUNTS + _COSTS


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """What a run cannot pass (None: no limit). Per turn: ``requests`` (model requests,
    one a step), ``tool_calls``, ``input_tokens``, ``output_tokens``, ``total_tokens``,
    and ``cost_usd`` (what its steps cost, by the runtime's price table); the same per
    session, ``session_...``, counted from the log. Each count is a positive int, each
    cost a positive finite `Decimal`; anything else is a `ValueError` naming the field."""

    requests: int | None = None
    tool_calls: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    session_requests: int | None = None
    session_tool_calls: int | None = None
    session_input_tokens: int | None = None
    session_output_tokens: int | None = None
    session_total_tokens: int | None = None
    cost_usd: Decimal | None = None
    session_cost_usd: Decimal | None = None

    def __post_init__(self) -> None:
        for name in _COUNTS:
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"Limits.{name} must be a positive int or None, got {value!r}")
        for name in _COSTS:
            value = getattr(self, name)
            if value is not None and (
                type(value) is not Decimal or not value.is_finite() or value <= 0
            ):
                raise ValueError(
                    f"Limits.{name} must be a positive Decimal (USD) or None, got {value!r}"
                )

    def stricter(self, other: Limits | None) -> Limits:
        """Each limit the smaller of this one's and `other`'s (a call's and its spec's)."""
        if other is None or other == self:
            return self
        mine, theirs = msgspec.structs.asdict(self), msgspec.structs.asdict(other)
        return Limits(
            **{
                name: min((v for v in (mine[name], theirs[name]) if v is not None), default=None)
                for name in _FIELDS
            }
        )


class _Limited(Protocol):
    """A prompt, as a budget reads it: the limits its turn is held to, if any."""

    @property
    def limits(self) -> Limits | None: ...


#: No limit at all: what a turn is held to when neither the agent nor its prompts set any.
NO_LIMITS: Final = Limits()


class Budget:
    """One agent's counts against its `Limits`: the running turn's, and its session's
    (read off the log once, then kept up to date by the turn driver).

    `request` and `call` ask before a request or a call would pass a limit, and
    count it when it does not (each returns the `LimitReached` that stops the
    turn, or None); `spend` adds a step's reported tokens and notes a token
    limit crossed (`crossed`).
    """

    __slots__ = (
        "_calls",
        "_limits",
        "_requests",
        "_session_calls",
        "_session_requests",
        "_session_usage",
        "_usage",
        "crossed",
    )

    def __init__(self, limits: Limits, events: Sequence[SessionEvent]) -> None:
        self._limits = limits
        #: The token limit the turn's last step crossed, if any: the turn ends after it.
        self.crossed: LimitReached | None = None
        self._session_requests = sum(1 for e in events if type(e) is StepStart)
        self._session_calls = sum(1 for e in events if type(e) is ToolCall)
        usage = [e.session for e in events if type(e) is TurnUsage]
        self._session_usage = usage[-1] if usage else NO_USAGE
        self._requests = self._calls = 0
        self._usage = NO_USAGE

    @property
    def limits(self) -> Limits:
        return self._limits

    def turn(self, limits: Limits | None, prompts: Sequence[_Limited]) -> None:
        """A turn starts over `prompts`, under `limits` (the agent's) narrowed by theirs."""
        turn = limits or NO_LIMITS
        for prompt in prompts:
            if prompt.limits is not None:
                turn = turn.stricter(prompt.limits)
        self._limits = turn
        self._requests = self._calls = 0
        self._usage = NO_USAGE
        self.crossed = None

    def request(self) -> LimitReached | None:
        """Before a model request: the limit it would pass, else count it."""
        limits = self._limits
        if limits.requests is not None and self._requests >= limits.requests:
            return LimitReached(limit="requests", allowed=limits.requests, reached=self._requests)
        if limits.session_requests is not None and self._session_requests >= (
            limits.session_requests
        ):
            return LimitReached(
                limit="session_requests",
                allowed=limits.session_requests,
                reached=self._session_requests,
            )
        self._requests += 1
        self._session_requests += 1
        return None

    def call(self) -> LimitReached | None:
        """Before a tool call runs: the limit it would pass, else count it."""
        limits = self._limits
        if limits.tool_calls is not None and self._calls >= limits.tool_calls:
            return LimitReached(limit="tool_calls", allowed=limits.tool_calls, reached=self._calls)
        if limits.session_tool_calls is not None and self._session_calls >= (
            limits.session_tool_calls
        ):
            return LimitReached(
                limit="session_tool_calls",
                allowed=limits.session_tool_calls,
                reached=self._session_calls,
            )
        self._calls += 1
        self._session_calls += 1
        return None

    def spend(self, usage: Usage) -> None:
        """A step's reply reported `usage` (priced): note in `crossed` the token or cost
        limit the turn or the session has now crossed (met counts as crossed: no request
        may follow). A cost limit is crossed too when the cost is unknown (``reached``
        None): a limit that cannot be checked does not let the turn go on."""
        self._usage = turn = self._usage + usage
        self._session_usage = session = self._session_usage + usage
        limits = self._limits
        for name, limit, spent in (
            ("input_tokens", limits.input_tokens, turn.input_tokens),
            ("output_tokens", limits.output_tokens, turn.output_tokens),
            ("total_tokens", limits.total_tokens, turn.input_tokens + turn.output_tokens),
            ("session_input_tokens", limits.session_input_tokens, session.input_tokens),
            ("session_output_tokens", limits.session_output_tokens, session.output_tokens),
            (
                "session_total_tokens",
                limits.session_total_tokens,
                session.input_tokens + session.output_tokens,
            ),
        ):
            if limit is not None and spent >= limit:
                self.crossed = LimitReached(limit=name, allowed=limit, reached=spent)
                return
        for name, cost_limit, cost in (
            ("cost_usd", limits.cost_usd, turn.cost),
            ("session_cost_usd", limits.session_cost_usd, session.cost),
        ):
            if cost_limit is not None and (cost is None or cost >= cost_limit):
                self.crossed = LimitReached(limit=name, allowed=cost_limit, reached=cost)
                return
