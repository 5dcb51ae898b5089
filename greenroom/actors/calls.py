"""`ToolCalls`: a step's tool calls run in order, each logged before it runs and given a result.

Every call the model made gets a ``tool/result``, whatever happens, so the
history stays valid for the next request: a call its write-ahead could not
log is ``not run`` (and so is every later one), and a cancel gives each call
without a result yet an ``aborted`` result if it started, else (still asked,
say) a ``not run`` one, as every later call gets. But a turn
parked on a decision (`Decisions.parked`: disposed while it waited) is left
as its log stands, for the session's next holder to go on with.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

import msgspec
import trio

from greenroom.actors.decisions import Decisions
from greenroom.actors.events import AGENT_TOOL_PROGRESS, SUBAGENT_STARTED
from greenroom.actors.life import AgentLife
from greenroom.actors.limits import Budget
from greenroom.actors.marker import DEFAULT_CANCEL_REASON, CancelMarker, cancelled_in
from greenroom.actors.step import LimitStop, StepFailed, TurnStopped, write_ahead
from greenroom.actors.types import (
    Agent,
    AgentOptions,
    ChildHandle,
    SessionClient,
    ToolExecutor,
    ToolInvocation,
    ToolOutcome,
    ToolView,
)
from greenroom.hooks import Hooks
from greenroom.protocol.events import (
    LimitReached,
    StepStart,
    ToolCall,
    ToolProgress,
    ToolResult,
    ToolStart,
)
from greenroom.protocol.mcp import McpServer
from greenroom.protocol.model import ToolCallChunk
from greenroom.session import Session


class ToolCalls:
    """Runs and logs the tool calls of one agent's steps (see the module docstring).

    A tool that starts a child agent calls the agent's `AgentHandle.spawn` (told as
    ``subagent/started``, with the call's id, once the child is live); the
    running turn's scope, read off the `CancelMarker`, is what a call's work
    runs under.
    """

    __slots__ = ("_agent", "_client", "_decisions", "_hooks", "_life", "_marker", "_session")

    def __init__(
        self,
        agent: Agent,
        session: Session,
        hooks: Hooks,
        marker: CancelMarker,
        client: SessionClient | None,
        life: AgentLife,
        decisions: Decisions,
    ) -> None:
        self._agent = agent
        self._decisions = decisions
        self._session = session
        self._hooks = hooks
        self._marker = marker
        self._client = client
        self._life = life

    async def run(
        self,
        turn: int,
        step: int,
        calls: list[ToolCallChunk],
        tools: ToolExecutor,
        budget: Budget | None = None,
    ) -> None:
        """Run the step's calls in order; a run of calls whose tools are concurrent runs at
        once. Raises the `StepFailed` of a write-ahead, the cancel, the `TurnStopped` of a
        guard, or a `LimitStop` when `budget` allows no more calls, once every call has
        its result (the calls past a limit are logged ``not run``)."""
        views = [tools.describe(call.name, call.arguments) for call in calls]
        done = 0
        while done < len(calls):
            end = done + 1
            while views[done].concurrent and end < len(calls) and views[end].concurrent:
                end += 1
            reached = None
            if budget is not None:  # counted before they run: a limit holds exactly
                for index in range(done, end):
                    if (reached := budget.call()) is not None:
                        end = index
                        break
                if end == done:  # not one more may run
                    assert reached is not None
                    self._settle_rest(turn, step, calls, views, done, done, set(), _unrun(reached))
                    raise LimitStop(reached)
            batch = calls[done:end]
            for call, view in zip(batch, views[done:end], strict=True):
                self.log_call(turn, step, call, view)
            results: list[str] = []  # the batch's calls with a result (a set is 4x the size)
            try:
                if self._session.persistent:  # the calls: before they run
                    names = ", ".join(repr(call.name) for call in batch)
                    await write_ahead(self._session, f"tool call {names}")
                if len(batch) == 1:
                    await self.run_one(turn, step, batch[0], results, tools)
                else:
                    try:
                        async with trio.open_nursery() as running:
                            for call in batch:
                                running.start_soon(self.run_one, turn, step, call, results, tools)
                    except BaseExceptionGroup as group:
                        stopped = _stopped_alone(group)
                        if stopped is None:
                            raise
                        raise stopped from None
            except (StepFailed, TurnStopped) as failure:
                unrun = ToolOutcome.failed(f"not run: {failure}", "not-run", "NotRun")
                self._settle_rest(turn, step, calls, views, done, end, results, unrun)
                raise
            except BaseException as exc:
                cancel = cancelled_in(exc)
                if cancel is None or self._decisions.parked:  # parked: the log stays as is
                    raise
                reason = cancel.reason or DEFAULT_CANCEL_REASON
                aborted = ToolOutcome.failed(f"aborted: {reason}", "aborted", "Cancelled")
                unrun = ToolOutcome.failed(
                    f"not run: the turn was cancelled ({reason}) before it started",
                    "not-run",
                    "NotRun",
                )
                started = self.started(turn, step)
                for call in batch:  # one that never started (asked, say) is not run
                    if call.call_id not in results:
                        ran = call.call_id in started
                        self.log_result(turn, step, call, aborted if ran else unrun)
                        results.append(call.call_id)
                self._settle_rest(turn, step, calls, views, end, end, results, unrun)
                raise
            if reached is not None:  # the batch ran as far as the limit let it
                self._settle_rest(turn, step, calls, views, end, end, set(), _unrun(reached))
                raise LimitStop(reached)
            done = end

    async def run_one(
        self,
        turn: int,
        step: int,
        call: ToolCallChunk,
        results: list[str],
        tools: ToolExecutor,
    ) -> None:
        """Run one logged call through `tools` and log its result (its id joins `results`)."""
        running = _Running(self, turn, step, call.call_id)
        outcome = await tools.execute(
            ToolInvocation(
                call.call_id,
                call.name,
                call.arguments,
                self._agent,
                self._marker.running,
                self._client,
                running.log_start,
                running.spawn,
                running.show_progress,
            )
        )
        self.log_result(turn, step, call, outcome)
        results.append(call.call_id)

    async def _spawn(
        self,
        call_id: str,
        spec: object = None,
        /,
        *,
        agent_id: str | None = None,
        session_id: str | None = None,
        options: AgentOptions | None = None,
        tools: Sequence[str] | None = None,
        mcp_servers: Sequence[McpServer] = (),
    ) -> ChildHandle:
        """A call's spawn (`ToolInvocation.spawn`): the agent's, then ``subagent/started``."""
        child = await self._life.handle.spawn(
            spec,
            agent_id=agent_id,
            session_id=session_id,
            options=options,
            tools=tools,
            mcp_servers=mcp_servers,
        )
        if SUBAGENT_STARTED in self._hooks.listened:
            self._hooks.emit(SUBAGENT_STARTED, self._agent, call_id, child.agent)
        return child

    def _settle_rest(
        self,
        turn: int,
        step: int,
        calls: list[ToolCallChunk],
        views: list[ToolView],
        done: int,
        end: int,
        results: Container[str],
        outcome: ToolOutcome,
    ) -> None:
        """Give `outcome` to the batch's calls without a result, then log and settle the rest."""
        for call in calls[done:end]:
            if call.call_id not in results:
                self.log_result(turn, step, call, outcome)
        for call, view in zip(calls[end:], views[end:], strict=True):
            self.log_call(turn, step, call, view)
            self.log_result(turn, step, call, outcome)

    def log_call(self, turn: int, step: int, call: ToolCallChunk, view: ToolView) -> None:
        self._session.append(
            ToolCall(
                turn=turn,
                step=step,
                call_id=call.call_id,
                name=call.name,
                arguments=call.arguments,
                kind=view.kind,
                title=view.title,
                locations=view.locations,
            )
        )

    def log_result(self, turn: int, step: int, call: ToolCallChunk, outcome: ToolOutcome) -> None:
        self._session.append(
            ToolResult(
                turn=turn,
                step=step,
                call_id=call.call_id,
                content=outcome.content,
                is_error=outcome.is_error,
                error=outcome.error,
                diffs=outcome.diffs,
            )
        )

    def started(self, turn: int, step: int) -> set[str]:
        """The calls of the step that started (``tool/start``), read off the log's tail."""
        started: set[str] = set()
        for event in reversed(self._session.events):
            if type(event) is ToolStart and event.step == step and event.turn == turn:
                started.add(event.call_id)
            elif type(event) is StepStart:
                break
        return started

    def show_progress(self, progress: ToolProgress) -> None:
        """A running call's progress (`ToolInvocation.progress`): shown, never logged."""
        self._session.show_progress(progress)
        if AGENT_TOOL_PROGRESS in self._hooks.listened:
            self._hooks.emit(AGENT_TOOL_PROGRESS, self._agent, progress)


class _Running(msgspec.Struct, frozen=True):
    """One call as it runs: its invocation's callbacks, each a bound method of this one
    object (three partials cost twice as much, held while the call runs or waits on a
    decision). A Struct: made with no Python call."""

    calls: ToolCalls
    turn: int
    step: int
    call_id: str

    def log_start(self) -> None:
        self.calls._session.append(ToolStart(turn=self.turn, step=self.step, call_id=self.call_id))

    def show_progress(self, output: str, total: int) -> None:
        self.calls.show_progress(
            ToolProgress(
                turn=self.turn, step=self.step, call_id=self.call_id, output=output, total=total
            )
        )

    async def spawn(
        self,
        spec: object = None,
        /,
        *,
        agent_id: str | None = None,
        session_id: str | None = None,
        options: AgentOptions | None = None,
        tools: Sequence[str] | None = None,
        mcp_servers: Sequence[McpServer] = (),
    ) -> ChildHandle:
        return await self.calls._spawn(
            self.call_id,
            spec,
            agent_id=agent_id,
            session_id=session_id,
            options=options,
            tools=tools,
            mcp_servers=mcp_servers,
        )


def _unrun(reached: LimitReached) -> ToolOutcome:
    """The result of a call a limit kept from running."""
    return ToolOutcome.failed(
        f"not run: the {reached.limit} limit ({reached.allowed}) was reached", "limit", "Limit"
    )


def _stopped_alone(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The first `StepFailed` or `TurnStopped` of concurrent calls' `group`, when it holds
    nothing else (the others' cuts stay inside their nursery), so that the step stops as a
    lone call's does; None when it holds more (a cancel from outside, a bug)."""
    stopped, rest = group.split((StepFailed, TurnStopped))
    if stopped is None or rest is not None:
        return None
    first: BaseException = stopped
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first
