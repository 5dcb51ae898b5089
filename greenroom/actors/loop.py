"""`LoopAgent`: an agent's verbs and its mailbox loop, one Trio task per agent.

One agent is one Trio task running `LoopAgent.drive` inside its `AgentLife`.
Its loop parks on the inbox, then, past cancel windows 1 and 2, hands the
queued burst to its `TurnDriver` (``actors/turn.py``: **the turn driver**),
one turn at a time. The verbs (`send`, `steer`, `cancel`, `inject`, ...)
are synchronous: they change the inbox and the `CancelMarker`
(``actors/marker.py``: **the cancel marker** and the turns' scope) at once,
and the loop acts on it at its next turn-decision point. A turn a crash cut
is carried on first (``actors/carry.py``).

An agent that never had work holds only what waiting takes: it waits for its
first work in its life's frame (`wait_for_work`, Trio's awaitable), and its
loop's frame (`drive`), its turn driver (with its `Requests` and `ToolCalls`),
its `Compactor` and its `Decisions` are made at their first need, as the
inbox's FIFOs are (``bench agents``: traced bytes per idle agent).

Disposal is `stop` (from `AgentHandle.dispose`: the inbox is closed, which
wakes a parked loop, and the turns' scope of a turn in flight is cancelled with
reason ``"disposed"``) or the owner's cancel reaching the task: either way the
turn in flight ends ``disposed``, its closing events are appended and the
flush runs shielded, and `drive` returns (on `stop`) or unwinds (re-raising
the owner's cancel); the life's teardown then calls `close` (``disposed``,
the prompts still queued settled, the last flush).
"""

from __future__ import annotations

from collections.abc import Awaitable, Generator, Mapping
from typing import Any, Final, TypeVar

import trio

from greenroom.actors.calls import ToolCalls
from greenroom.actors.carry import CarriedOn, open_turn_of
from greenroom.actors.compaction import DEFAULT_POLICY, CompactionPolicy, Compactor
from greenroom.actors.decisions import EMBEDDER, Decisions
from greenroom.actors.events import AGENT_QUEUED
from greenroom.actors.inbox import Inbox
from greenroom.actors.life import AgentLife
from greenroom.actors.limits import Limits
from greenroom.actors.marker import DEFAULT_CANCEL_REASON, DISPOSED_REASON, CancelMarker
from greenroom.actors.output import OutputTurn, output_spec
from greenroom.actors.prompt import (
    Answer,
    Prompt,
    StopReason,
    adopt,
    checked_text,
    dropped,
    new_message_id,
    new_prompt,
    settle,
)
from greenroom.actors.request import Requests
from greenroom.actors.status import AgentStatus
from greenroom.actors.titles import TitleTurn, completed_prompt, titled
from greenroom.actors.turn import TurnDriver
from greenroom.actors.types import (
    AgentDisposed,
    AgentOptions,
    SessionClient,
    ToolExecutor,
    check_setting,
)
from greenroom.hooks import Hooks
from greenroom.models.base import ModelAdapter
from greenroom.models.prices import Prices
from greenroom.protocol.content import Content
from greenroom.protocol.events import (
    USER,
    ConfigSet,
    ConfigTrigger,
    ContextMessage,
    InjectionTrigger,
    MessageSource,
    StatusName,
)
from greenroom.session import Session
from greenroom.session.history import HistoryEntry, history_of

#: The grace an agent's supervisor gives it to stop (its last flush, its owned processes);
#: past it the supervisor records it ``killed`` and moves on.
CLOSING_GRACE: Final = 10.0

T = TypeVar("T")

_NO_ANSWERS: Final[Mapping[str, tuple[str, str]]] = {}
#: The options of an agent given none (frozen: one for all of them).
_NO_OPTIONS: Final = AgentOptions()


class _Now:
    """Awaited, returns at once, with no checkpoint."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, Any, None]:
        return
        yield  # a generator: one that never yields


_NOW: Final = _Now()


class LoopAgent:
    """An agent whose turns run in its own Trio task (see the module docstring)."""

    __slots__ = (
        "_compaction",
        "_compactor",
        "_decisions",
        "_driver",
        "_hooks",
        "_id",
        "_inbox",
        "_life",
        "_marker",
        "_models",
        "_options",
        "_prices",
        "_resumed",
        "_session",
        "_status",
        "_titling",
        "_tools",
    )

    def __init__(
        self,
        agent_id: str,
        session: Session,
        *,
        life: AgentLife,
        models: Mapping[str, ModelAdapter],
        tools: ToolExecutor,
        hooks: Hooks,
        options: AgentOptions | None = None,
        compaction: CompactionPolicy = DEFAULT_POLICY,
        prices: Prices,
        resumed: Prompt[None] | None = None,
        answers: Mapping[str, tuple[str, str]] = _NO_ANSWERS,
    ) -> None:
        self._id = agent_id
        self._session = session
        self._life = life
        self._options = options = options or _NO_OPTIONS
        self._models = models  # by id; the first is the default
        self._hooks = hooks
        self._inbox = Inbox()
        self._status = AgentStatus(life, hooks)
        self._marker = CancelMarker()
        self._decisions: Decisions | None = None  # made by the first need (`decisions`)
        for decision_id, (answer, by) in answers.items():  # kept by the store while stored
            self.decisions.answered(decision_id, answer, by)
        self._compaction = options.compaction or compaction
        self._compactor: Compactor | None = None  # made by the first need (`_compacting`)
        self._tools = tools
        self._prices = prices
        self._driver: TurnDriver | None = None  # made by the first turn (`_turns`)
        self._resumed = resumed  # the cut turn to carry on first (`continued_prompt`)
        if resumed is not None:
            adopt(resumed, self)
        #: The model is to write the session's title (`greenroom.actors.titles`), once
        #: (`_titling`, inline: an agent that never writes one makes no call for it).
        titles = session.config.get("titles", options.titles)
        self._titling = titles == "model" and not titled(session.events)

    def __repr__(self) -> str:
        return f"<LoopAgent {self._id!r} {self.status}>"

    # -- the Agent interface -------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    @property
    def options(self) -> AgentOptions:
        return self._options

    @property
    def session(self) -> Session:
        return self._session

    @property
    def client(self) -> SessionClient | None:
        return self._life.client

    @property
    def status(self) -> StatusName:
        """``disposed`` from the moment its dispose began; the ``agent/status`` emit follows
        when the loop has stopped."""
        return "disposed" if self._life.disposing else self._status.name

    @property
    def inbox(self) -> Inbox:
        """The agent's inbox, for observers (queue depths); writers use send/steer."""
        return self._inbox

    def send(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[Any] | None = None,
        limits: Limits | None = None,
    ) -> Prompt[Any]:
        """Queue a prompt; the next turn takes it with everything queued beside it (that
        asks for the same `output`). With `output`, the turn's final answer must validate
        as that type (a msgspec Struct, say): `Answer.output` is the value; a type whose
        JSON form is not an object is a `TypeError`, naming it.

        `content` is text, or a sequence of content blocks (`greenroom.protocol.content`:
        `Text`, `Image`, `Resource`), checked here: a bad block, or one past the limits
        (`MAX_IMAGE_BYTES`, `MAX_PROMPT_BYTES`), is a `ValueError` or `TypeError` naming
        its index, and nothing is queued. Without `output`, the agent's default
        (`AgentOptions.output`) is asked for. `limits` hold its turn beside the agent's
        own `Limits` (the stricter of each wins)."""
        return self._queue(content, source, output, limits)

    def steer(self, content: str, *, source: MessageSource | None = None) -> Prompt[None]:
        """Join the running turn before its next step (its answer is that turn's); while
        not running, `send`."""
        if self.status not in ("running", "waiting"):
            return self.send(content, source=source)
        self._require_live()
        text = checked_text(self._id, content)  # text only: steering takes no blocks
        prompt: Prompt[None] = Prompt(
            self._session, text, source or USER, new_message_id(), None, owner=self
        )
        self._inbox.push_steering(prompt)
        if AGENT_QUEUED in self._hooks.listened:
            self._hooks.emit(AGENT_QUEUED, self, prompt.id, True)
        return prompt

    async def run(
        self,
        content: Content,
        *,
        source: MessageSource | None = None,
        output: type[Any] | None = None,
        limits: Limits | None = None,
    ) -> Answer[Any]:
        """`send`, then await the prompt's `Answer`. A cancelled caller stops waiting and
        nothing else: the prompt stays queued or running (`cancel` stops it)."""
        return await self._queue(content, source, output, limits)

    def withdraw(self, message_id: str) -> bool:
        """Take back a prompt `send` queued that no turn has taken yet; True if it was still
        queued (its prompt settles ``withdrawn``). The rest of the queue and the running
        turn are untouched (`cancel` stops those). A prompt a turn took, or one steered
        into a running turn, is not withdrawn. Withdrawing the last thing an idle agent had
        queued releases its `when_idle`."""
        prompt = self._inbox.withdraw(message_id)
        if prompt is None:
            return False
        settle((prompt,), dropped("withdrawn"))
        if self._status.name == "idle" and not self._inbox.queued:
            self._status.release()
        return True

    def cancel_prompt(self, prompt: Prompt[Any], reason: str | None) -> None:
        """`Prompt.cancel` of an unsettled prompt of this agent's: still in a FIFO, it is
        taken out and settles ``withdrawn``; else the running turn took it (a prompt leaves
        its FIFO only for the turn that takes it, with no checkpoint between), and that
        turn is cancelled, the queue left as it is."""
        if self._inbox.remove(prompt):
            settle((prompt,), dropped("withdrawn", reason))
            if self._status.name == "idle" and not self._inbox.queued:
                self._status.release()
        else:
            self._marker.arm(reason or DEFAULT_CANCEL_REASON)

    def inject(self, content: str, *, source: MessageSource | None = None) -> str:
        """Add context without running the model; returns its message id.

        Into the turn the log has open, if any; otherwise as a one-shot
        ``injection`` turn of its own, so every event stays inside a turn.
        """
        self._require_live()
        source = source or USER
        message = ContextMessage(
            content=checked_text(self._id, content), source=source, message_id=new_message_id()
        )
        driver = self._turns()
        if driver.held is not None:  # tool calls are running: after their results
            driver.held.append(message)
        else:
            driver.one_shot(InjectionTrigger(source), message)
        return message.message_id

    def compact(self, instructions: str | None = None) -> None:
        """Compact the history (a summary of its older part, docs/semantics.md
        "Compaction"), with `instructions` for the summary if given: before the running
        turn's next step, or, while idle or when that turn ends without another step, as
        a one-shot ``compaction`` turn of its own (`when_idle` waits for it). A `cancel`
        withdraws it. Nothing is logged when there is nothing old enough to summarize.
        Instructions past `compaction.MAX_INSTRUCTIONS` characters are a `ValueError` naming it.
        """
        if self.status == "disposed":
            raise AgentDisposed(self._id)
        self._compacting().request(self._id, instructions)
        # Wakes the task when idle; when a running turn ends before another step, the
        # task finds it on its way back and runs the one-shot turn then.
        self._inbox.request_flush()

    def cancel(self, reason: str | None = None) -> None:
        """Stop all pending work: the single public stop verb.

        Clears both FIFOs (their prompts settle ``aborted`` with the reason),
        cancels the running turn's scope with `reason` (default
        ``"cancelled"``), and arms the cancel marker, but only when something
        is running or pending: an idle no-op cancel never strands the next
        prompt. Every child of the agent is cancelled the same way, busy or
        not. A no-op on a disposed agent.
        """
        if self.status == "disposed":
            return
        reason = reason or DEFAULT_CANCEL_REASON
        self._life.cancel_children(reason)
        pending = (
            self._status.name in ("running", "waiting")
            or self._inbox.queued
            or self._inbox.steering
            or (self._compactor is not None and self._compactor.requested)
        )
        if self._compactor is not None:
            self._compactor.withdraw()
        if not pending:
            return
        self._drop_queued("aborted", reason)
        self._marker.arm(reason)

    def stop(self) -> None:
        """The life's stop (`AgentLife.stop` has set ``disposing``): close the inbox, so
        that `drive` returns at its next wake-up, and cancel the turn in flight (it ends
        ``disposed``). Never checkpoints; idempotent."""
        self._inbox.close()
        self._marker.cut(DISPOSED_REASON)

    def configure(self, key: str, value: str) -> None:
        """Change a setting of the session: ``mode`` (one of `MODES`), ``model`` (an id
        of the runtime's models), ``thought_level`` (one of `THOUGHT_LEVELS`: how hard
        the model thinks) or ``titles`` (one of `TITLES`: ``model`` has the model write
        the title, once, after the next turn of a prompt that completes). It is logged
        (``config/set``): into the turn the log has open, else as a one-shot ``config``
        turn of its own; a new model or thought level answers from the next step on.
        Raises `ValueError` naming an unknown key or value.
        """
        if self.status == "disposed":
            raise AgentDisposed(self._id)
        check_setting(self._id, key, value, self._models)
        self._turns().one_shot(ConfigTrigger(USER), ConfigSet(key=key, value=value))
        if key == "titles":
            self._titling = _titling(self._session, self._options)

    @property
    def model(self) -> str:
        """The id of the model that answers the next step."""
        return self._turns().requests.model_id

    def when_idle(self) -> Awaitable[None]:
        """Wait for quiescence; the wait is registered now, at the call.

        Resolves at once when idle with nothing queued; otherwise on the next
        transition out of running, or when a cancel leaves nothing to run.
        On a disposed agent it resolves once the agent's task has exited
        (after its unregister and session detach).
        """
        compactor = self._compactor
        asked = compactor is not None and compactor.requested
        return self._status.when_idle(bool(self._inbox.queued) or asked)

    def history(self) -> list[HistoryEntry]:
        return history_of(self._session.events)

    @property
    def decisions(self) -> Decisions:
        """Its decisions, made at the first need of them: an agent that never asked one,
        nor was asked to answer one, holds none."""
        decisions = self._decisions
        if decisions is None:
            decisions = self._decisions = Decisions(
                self._session, self._status, self._marker, self._options.decision_wait
            )
        return decisions

    def decide(self, decision_id: str, answer: str, by: str = EMBEDDER) -> None:
        """Answer the open decision `decision_id` (see `Decisions.decide`)."""
        self.decisions.decide(decision_id, answer, by)

    # -- the task --------------------------------------------------------------

    def wait_for_work(self) -> Awaitable[None]:
        """Awaited by the life before `drive`, returns once the agent has work, or is
        stopped: a fresh agent parks here, in its life's frame, so that an agent that
        never had work holds no frame of its loop's (~250 B). At once, with no
        checkpoint, for a turn a crash cut (``resumed``): it is carried on first."""
        if self._resumed is not None:
            return _NOW
        return self._inbox.wait()

    async def drive(self) -> None:
        """Run turns from the first work on (`wait_for_work` waited for it) until `stop`
        (then it returns) or the owner's cancel (re-raised). A turn a crash cut
        (``resumed``) is carried on first, before any prompt. What is left to do once it
        ends is `close`'s."""
        inbox, marker = self._inbox, self._marker
        try:
            while not inbox.closed:  # else stopped: the life goes on with its teardown
                # The turns' scope: one for every turn from here on, and the idle waits
                # between them, until a cancel uses it up (its `Cancelled` raised out of
                # the turn it cut, or at the next wait). One per turn cost more than
                # anything else a turn does. Inline, not a method: no frame more to hold.
                with trio.CancelScope() as scope:
                    marker.turns = scope
                    if self._resumed is not None:
                        await self._carry_on(self._resumed)
                    else:
                        await self._wake()
                    while True:
                        await inbox.wait()
                        if inbox.closed:
                            break
                        await self._wake()
                marker.turns = None
                if scope.cancelled_caught:  # a cancel or `stop` cut a turn short
                    self._after_turn()
                if not inbox.closed:  # the scope used up: park outside any until work
                    await inbox.wait()
        finally:
            marker.turns = None

    async def close(self) -> None:
        """The loop's last word, from its life's teardown once `drive` returned or raised
        (or the first wait was cut): the agent is ``disposed``, prompts still queued
        settle ``disposed``, and whatever an earlier drain failed to write, or an idle
        inject the cancel overtook, gets a last flush (shielded by the sink)."""
        self._status.set("disposed")
        self._drop_queued("disposed")
        if self._inbox.flush_requested or (self._driver is not None and self._driver.unflushed):
            await self._turns().flush(0)

    async def _carry_on(self, resumed: Prompt[None]) -> None:
        """The cut turn `resumed` is the prompt of, carried on (`CarriedOn`) before any
        other. A method, not inline: the loop's frame, held while idle, keeps fewer
        locals."""
        self._resumed = None
        turn, start = open_turn_of(self._session)
        self._status.set("running")
        driver = self._turns()
        body = CarriedOn(self, self._session, self._hooks, driver, resumed)
        await driver.run(turn, start, [resumed], None, body)
        self._after_turn()

    async def _wake(self) -> None:
        """What one wake-up of the loop does: a flush asked for, a compaction asked for
        while nothing is queued, or the next turn, past cancel windows 1 and 2."""
        inbox, marker = self._inbox, self._marker
        driver = self._driver or self._turns()  # no call but the first time
        if inbox.flush_requested:
            inbox.flush_requested = False
            await driver.flush(0)
        if self._compactor is not None and self._compactor.requested and not inbox.queued:
            await self._compaction_turn()
            return
        # Each window looks at the marker before it takes it: no call while it is not armed.
        if (
            marker.reason is not None and self._cancelled_before_turn()
        ) or not inbox.queued:  # window 1: since the wake
            return
        self._status.set("running")
        if marker.reason is not None and self._cancelled_before_turn():  # window 2
            return  # (a cancel from an agent/status listener)
        if not inbox.queued:  # ... or it withdrew everything: no turn to run
            self._status.set("idle")
            return
        prompts = inbox.drain()
        kind = prompts[0].output
        output = None if kind is None else OutputTurn(output_spec(kind))
        session = self._session
        await driver.run(session.last_turn + 1, session.next_seq, prompts, output)
        if self._titling and self._title_due():  # its prompts are answered: then the title
            await self._title()
        self._after_turn()

    def _title_due(self) -> bool:
        """Whether the title is to be written now: a prompt's turn has completed, and no
        other work waits."""
        inbox = self._inbox
        return not inbox.queued and not inbox.steering and completed_prompt(self._session)

    async def _title(self) -> None:
        """The model writes the session's title: its one try, whatever comes of it."""
        self._titling = False
        session, driver = self._session, self._turns()
        body = TitleTurn(session, driver)
        await driver.run(session.last_turn + 1, session.next_seq, [], None, body)

    async def _compaction_turn(self) -> None:
        """`compact` while idle: the driver's one-step compaction turn, past window 1."""
        if self._cancelled_before_turn():
            return
        self._status.set("running")
        session, driver = self._session, self._turns()
        await driver.run(session.last_turn + 1, session.next_seq, [], None, driver.compaction)
        if not self._inbox.queued:
            self._status.set("idle")

    def _turns(self) -> TurnDriver:
        """The turn driver, made at the first need of it (a wake-up, an inject, a setting):
        an agent that never had work holds none (with its requests and calls, ~300 B)."""
        driver = self._driver
        if driver is None:
            session, options, marker = self._session, self._options, self._marker
            decisions, hooks, life = self.decisions, self._hooks, self._life
            driver = self._driver = TurnDriver(
                self,
                session,
                inbox=self._inbox,
                marker=marker,
                life=life,
                requests=Requests(session, options, self._models, self._prices),
                tools=self._tools,
                hooks=hooks,
                compactor=self._compacting(),
                calls=ToolCalls(self, session, hooks, marker, life.client, life, decisions),
                limits=options.limits,
                decisions=decisions,
            )
        return driver

    def _compacting(self) -> Compactor:
        """The compactor, made at the first need of it (a turn, `compact`)."""
        compactor = self._compactor
        if compactor is None:
            compactor = self._compactor = Compactor(self._session, self._compaction)
        return compactor

    def _after_turn(self) -> None:
        """Steering left leads the queued work; with none left, the agent is idle."""
        self._inbox.requeue_steering()
        compactor = self._compactor  # inline: no call more at every turn's end
        if not self._inbox.queued and not (compactor is not None and compactor.requested):
            self._status.set("idle")

    def _drop_queued(self, stop_reason: StopReason, reason: str | None = None) -> None:
        """Empty both FIFOs; their prompts settle `stop_reason` (no turn took them)."""
        cleared = self._inbox.clear()
        if cleared:
            settle(cleared, dropped(stop_reason, reason))

    def _cancelled_before_turn(self) -> bool:
        """Windows 1 and 2: a cancel since the wake-up drops the turn about to start.

        What was sent after the cancel is still queued and runs; with nothing
        queued the agent settles idle and its `when_idle` waiters are released.
        """
        if self._marker.take() is None or self._inbox.queued:
            return False
        if self._status.name == "running":  # a turn ended with work queued behind it
            self._status.set("idle")
        else:
            self._status.release()
        return True

    def _queue(
        self,
        content: Content,
        source: MessageSource | None,
        output: type[T] | None,
        limits: Limits | None,
    ) -> Prompt[T]:
        self._require_live()
        if output is None:
            output = self._options.output
        if output is not None:
            output_spec(output)
        prompt = new_prompt(self._id, self._session, content, source, output, limits, self)
        self._inbox.push(prompt)
        if AGENT_QUEUED in self._hooks.listened:
            self._hooks.emit(AGENT_QUEUED, self, prompt.id, False)
        return prompt

    def _require_live(self) -> None:
        if self._status.name == "disposed" or self._life.disposing:  # `status`, without its call
            raise AgentDisposed(self._id)


def _titling(session: Session, options: AgentOptions) -> bool:
    """Whether the model is to write `session`'s title: its ``titles`` setting (else
    `options`') is ``model``, and its log holds no try yet."""
    return session.config.get("titles", options.titles) == "model" and not titled(session.events)
