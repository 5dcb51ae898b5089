"""``greenroom demo``: the whole story of greenroom in about twelve seconds.

Three agents under the runtime's supervisor, on the embedded defaults (a
slow echoing model, JSONL sessions under the demo's state directory, which
it empties first and names at the end, or in ``--store``; real ``bash``):
a burst of prompts batched into one turn; a steer that joins a running turn;
a cancel that drops a queued prompt; a background bash task whose completion
notice reaches its owner while another session is refused; a reload of the
bash tool plugin that keeps that ownership; a dispose mid-turn whose closing
``turn/end`` is read back from disk; a resume that continues the turn
numbering. It ends with a summary table.

On a terminal it draws a live view (the supervision tree with each agent's
status, inbox depths and current turn, and a scrolling event feed);
``--plain``, or output that is not a terminal, prints the same story as lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TextIO

import trio

from greenroom.actors.events import AGENT_QUEUED, AGENT_STATUS, AGENT_TURN_END, AGENT_TURN_START
from greenroom.actors.loop import LoopAgent
from greenroom.actors.types import Agent, ToolInvocation
from greenroom.protocol.events import (
    ContextMessage,
    SessionEvent,
    SteeringMessage,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)
from greenroom.protocol.model import (
    Finish,
    ModelRequest,
    StreamChunk,
    TextDelta,
    ToolCallChunk,
    UserTurn,
)
from greenroom.runtime import Runtime, open_runtime
from greenroom.session import SESSION_EVENT, Session
from greenroom.session.persistence import JsonlPersistence, Persistence
from greenroom.session.transcript import describe_reason
from greenroom.tools.bash.tools import bash_plugin


class DemoModel:
    """Echoes the prompt a word at a time; ``bash: CMD`` starts CMD in the background instead."""

    def __init__(self, pace: float) -> None:
        self._word = 0.3 * pace
        self._calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        last = request.messages[-1] if request.messages else None
        if isinstance(last, UserTurn) and last.content.startswith("bash: "):
            self._calls += 1
            command = last.content.removeprefix("bash: ")
            arguments = {"command": command, "description": "demo", "run_in_background": True}
            yield ToolCallChunk(f"call-{self._calls}", "bash", json.dumps(arguments))
            yield Finish("tool-calls")
            return
        users = [m.content for m in request.messages if isinstance(m, UserTurn)]
        for word in (users[-1] if users else "ok").split():
            await trio.sleep(self._word)
            yield TextDelta(word + " ")
        yield Finish("stop")


class Narrator:
    """The event feed and the summary; `LiveView` draws it, plain mode prints it."""

    def __init__(self, out: TextIO, live: bool) -> None:
        self.out = out
        self.live = live
        self.start = trio.current_time()
        self.feed: deque[str] = deque(maxlen=14)
        self.summary: list[tuple[str, str, bool]] = []

    def say(self, text: str) -> None:
        line = f"[{trio.current_time() - self.start:5.1f}s] {text}"
        self.feed.append(line)
        if not self.live:
            print(line, file=self.out, flush=True)

    def check(self, what: str, result: str, ok: bool) -> None:
        self.summary.append((what, result, ok))
        self.say(f"{'✔' if ok else '✘'} {what}: {result}")

    def table(self) -> str:
        width = max(len(w) for w, _, _ in self.summary)
        lines = [f"{'what the demo showed'.ljust(width)}  ok  result", "-" * (width + 40)]
        lines += [
            f"{what.ljust(width)}  {'✔' if ok else '✘'}   {result}"
            for what, result, ok in self.summary
        ]
        return "\n".join(lines)


def live_view(runtime: Runtime, narrator: Narrator) -> str:
    """One frame: the supervision tree with agent state, the bash tasks, the feed."""
    lines = [f"greenroom demo   {trio.current_time() - narrator.start:5.1f}s", ""]
    tree = runtime.supervisor.tree()
    lines.append(f"{tree.name} [{tree.strategy}]")
    for index, child in enumerate(tree.children):
        branch = "└── " if index == len(tree.children) - 1 else "├── "
        agent = runtime.agents.get(child.name.removeprefix("agent:"))
        if isinstance(agent, LoopAgent):
            turn = agent.session.open_turn or agent.session.last_turn
            detail = (
                f"{agent.status:8} turn {turn:<3} queued {agent.inbox.queued}"
                f" steering {agent.inbox.steering}"
            )
        else:
            detail = child.state
        lines.append(f"{branch}{child.name:18} {detail}")
    tasks = runtime.bash.list()
    if tasks:
        lines.append("")
        lines += [
            f"{t.id}: {t.status} (owner {runtime.bash.owner_of(t.id)})  {t.command}" for t in tasks
        ]
    lines += ["", "events " + "─" * 50, *narrator.feed]
    return "\n".join(lines)


class Watching:
    """Wakes waiters whenever an agent's status changes or any session grows."""

    def __init__(self, runtime: Runtime) -> None:
        self._changed = trio.Event()
        runtime.hooks.on(AGENT_STATUS, self._poke)
        runtime.hooks.on(SESSION_EVENT, self._poke)

    def _poke(self, *_: object) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()


def _turns(session: Session) -> dict[int, list[SessionEvent]]:
    turns: dict[int, list[SessionEvent]] = {}
    current = 0
    for event in session.events:
        if isinstance(event, TurnStart):
            current = event.turn
        turns.setdefault(current, []).append(event)
    return turns


async def story(
    runtime: Runtime, narrator: Narrator, pace: float, store: Persistence, work: Path, tag: str
) -> None:
    """The demo's body: each beat runs, then checks what the log shows. Each agent's
    session id is its name followed by `tag`."""
    say = narrator.say
    agents = runtime.agents
    watch = Watching(runtime)
    handles = {
        name: await agents.create(agent_id=name, session_id=name + tag, cwd=str(work))
        for name in ("planner", "builder", "reviewer")
    }
    planner, builder, reviewer = (handles[n].agent for n in ("planner", "builder", "reviewer"))
    say("three agents under the runtime's supervisor: planner, builder, reviewer")

    # 1. A burst of prompts is one turn.
    for text in ("outline the release", "list the risks", "name an owner"):
        planner.send(text)
    say("planner: three prompts sent in one burst")
    await planner.when_idle()
    taken = [e.content for e in _turns(planner.session)[1] if isinstance(e, UserMessage)]
    narrator.check(
        "a burst is batched into one turn", f"turn 1 took {len(taken)} prompts", len(taken) == 3
    )

    # 2. A steer joins the running turn.
    reviewer.send("review the plan step by step with care")
    await watch.until(lambda: reviewer.status == "running")
    await trio.sleep(3 * 0.3 * pace)
    reviewer.steer("focus on the tests")
    say("reviewer: steered mid-turn: 'focus on the tests'")
    await reviewer.when_idle()
    turn = _turns(reviewer.session)[1]
    joined = any(isinstance(e, SteeringMessage) for e in turn)
    narrator.check("a steer joins the running turn", "steering/message inside turn 1", joined)

    # 3. A cancel drops a queued prompt.
    builder.send("compile every module of the project now")
    await watch.until(lambda: builder.status == "running")
    queued = builder.send("and then deploy it")
    say("builder: a second prompt waits in the queue; cancelling")
    builder.cancel("changed my mind")
    await builder.when_idle()
    events = builder.session.events
    ran = any(isinstance(e, UserMessage) and e.message_id == queued.id for e in events)
    ended = [e.reason for e in builder.session.events if isinstance(e, TurnEnd)]
    narrator.check(
        "a cancel drops a queued prompt",
        f"queued prompt never ran; turn 1 {describe_reason(ended[-1])}",
        not ran and len(ended) == 1,
    )

    # 4. A background task, its notice, and another session refused.
    builder.send(f"bash: sleep {max(0.5, 4 * pace):.1f}; echo built")
    await builder.when_idle()
    (task,) = runtime.bash.list()
    say(f"builder started {task.id} in the background, owned by session 'builder{tag}'")
    refusal = await runtime.tools.execute(
        ToolInvocation("peek", "bash_output", json.dumps({"task_id": task.id}), reviewer)
    )
    narrator.check("another session is refused the task", refusal.content, refusal.is_error)

    # 5. A reload of the tool plugin keeps the ownership.
    await runtime.reload("tool-bash")
    say("the tool-bash plugin was reloaded (its module re-imported)")
    again = await runtime.tools.execute(
        ToolInvocation("peek", "bash_kill", json.dumps({"task_id": task.id}), reviewer)
    )
    owner = runtime.bash.owner_of(task.id)
    narrator.check(
        "ownership survives the reload",
        f"owner still {owner!r}; reviewer still refused",
        owner == "builder" + tag and again.is_error,
    )
    await watch.until(lambda: any(isinstance(e, ContextMessage) for e in builder.session.events))
    notice = next(e for e in builder.session.events if isinstance(e, ContextMessage))
    narrator.check(
        "the completion notice reaches its owner",
        notice.content[:60] + "…",
        notice.content.startswith(f"background bash task {task.id} finished"),
    )

    # 6. A dispose mid-turn: the closing turn/end is on disk.
    planner.send("write the full release notes for every component in detail")
    await watch.until(lambda: planner.status == "running")
    await trio.sleep(4 * 0.3 * pace)
    await handles["planner"].dispose()
    _, stored = await store.load("planner" + tag)
    closing = stored[-1]
    shown = describe_reason(closing.reason) if isinstance(closing, TurnEnd) else "missing"
    say(f"planner disposed mid-turn; read back from disk: last event is turn/end {shown}")
    narrator.check(
        "a dispose writes the closing turn/end to disk",
        f"turn {closing.turn if isinstance(closing, TurnEnd) else '?'} ended {shown}",
        isinstance(closing, TurnEnd) and shown == "disposed",
    )

    # 7. A resume continues the turn numbering.
    resumed = await agents.resume(agent_id="planner-again", session_id="planner" + tag)
    before = resumed.agent.session.last_turn
    resumed.agent.send("pick up where we left off")
    await resumed.agent.when_idle()
    after = resumed.agent.session.last_turn
    narrator.check(
        "a resume continues the turn numbering",
        f"turns 1..{before} on disk, next turn {after}",
        after == before + 1,
    )


def _listen(runtime: Runtime, narrator: Narrator) -> None:
    def status(agent: Agent, value: str) -> None:
        narrator.say(f"{agent.id}: {value}")

    def turn_start(agent: Agent, turn: int) -> None:
        narrator.say(f"{agent.id}: turn {turn} started")

    def turn_end(agent: Agent, turn: int, reason: TurnEndReason) -> None:
        narrator.say(f"{agent.id}: turn {turn} ended {describe_reason(reason)}")

    def queued(agent: Agent, message_id: str, steering: bool) -> None:
        narrator.say(f"{agent.id}: {'steering' if steering else 'prompt'} queued")

    def notices(session: Session, event: SessionEvent) -> None:
        if isinstance(event, ContextMessage):
            narrator.say(f"{session.id}: notice injected: {event.content[:50]}…")

    runtime.hooks.on(AGENT_STATUS, status)
    runtime.hooks.on(AGENT_TURN_START, turn_start)
    runtime.hooks.on(AGENT_TURN_END, turn_end)
    runtime.hooks.on(AGENT_QUEUED, queued)
    runtime.hooks.on(SESSION_EVENT, notices)


async def run_story(
    state_dir: Path,
    *,
    out: TextIO = sys.stdout,
    live: bool = False,
    pace: float = 1.0,
    store: Persistence | None = None,
    tag: str = "",
) -> list[tuple[str, str, bool]]:
    """Tell the story with state in `state_dir` (sessions in `store`, default JSONL under
    it, each named after its agent followed by `tag`); returns the summary rows (what,
    result, ok)."""
    store = store or JsonlPersistence(state_dir / "sessions")
    work = state_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    async with open_runtime(
        model=DemoModel(pace), persistence=store, workdir=str(work), name="demo"
    ) as runtime:
        await runtime.plug("tool-bash", bash_plugin)
        narrator = Narrator(out, live)
        _listen(runtime, narrator)
        with alternate_screen(out, live):
            async with trio.open_nursery() as nursery:
                if live:

                    async def redraw() -> None:
                        while True:
                            out.write(frame(live_view(runtime, narrator)))
                            out.flush()
                            await trio.sleep(0.1)

                    nursery.start_soon(redraw)
                await story(runtime, narrator, pace, store, work, tag)
                nursery.cancel_scope.cancel()
        if live:  # the last frame stays on the main screen, above the summary
            out.write("\n".join(fit(live_view(runtime, narrator))) + "\n")
    print("\n" + narrator.table(), file=out, flush=True)
    return narrator.summary


#: The terminal the live view fits: the classic 80 x 24.
WIDTH, HEIGHT = 80, 24


def fit(view: str) -> list[str]:
    """`view`'s lines clipped to `WIDTH`; past `HEIGHT` lines, the oldest feed lines go first."""
    lines = [line[:WIDTH] for line in view.splitlines()]
    if len(lines) > HEIGHT - 1:
        feed = lines.index(next(line for line in lines if line.startswith("events ")))
        keep = HEIGHT - 1 - (feed + 1)
        lines = lines[: feed + 1] + lines[len(lines) - max(keep, 0) :]
    return lines[: HEIGHT - 1]


def frame(view: str) -> str:
    """One redraw: home, each line then clear to its end, then clear below."""
    return "\x1b[H" + "".join(line + "\x1b[K\n" for line in fit(view)) + "\x1b[J"


@contextlib.contextmanager
def alternate_screen(out: TextIO, live: bool) -> Iterator[None]:
    """Draw on the terminal's alternate screen, cursor hidden; give the screen back on any exit
    (a Ctrl-C included)."""
    if not live:
        yield
        return
    out.write("\x1b[?1049h\x1b[?25l")
    out.flush()
    try:
        yield
    finally:
        out.write("\x1b[?25h\x1b[?1049l")
        out.flush()


def command() -> str:
    """How to run ``greenroom`` from here: its name if the ``greenroom`` on PATH is this
    one, else the script beside this interpreter (``.venv/bin/greenroom``, relative to the
    current directory when under it), else ``python -m greenroom``."""
    script = Path(sys.executable).parent / "greenroom"
    on_path = shutil.which("greenroom")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "greenroom"
    if script.is_file():
        with contextlib.suppress(ValueError):
            return str(script.absolute().relative_to(Path.cwd()))
        return str(script)
    return f"{sys.executable} -m greenroom"


def run_demo(*, plain: bool, state_dir: Path, fresh: bool, store: Persistence | None) -> int:
    """Run the story with its state in `state_dir` (emptied first if `fresh`: it is the demo's
    own) and its sessions in `store` (default JSONL under `state_dir`), then say where they
    are. In a store or state directory that is not the demo's own, the sessions' names get
    a suffix of this run's: nothing stored there is touched, and a second run works."""
    live = not plain and sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    if fresh:
        for part in ("sessions", "work"):
            shutil.rmtree(state_dir / part, ignore_errors=True)
    tag = "" if fresh and store is None else f"-{secrets.token_hex(4)}"
    summary = trio.run(lambda: run_story(state_dir, live=live, store=store, tag=tag))
    run = command()
    print(
        "\nthe demo's model is an echo: it says each prompt back, a word at a time, and calls"
        f" no model API ({run} acp --model anthropic:MODEL runs a real one)"
    )
    if store is None:
        print(
            f"the echo's sessions are in {state_dir / 'sessions'}:"
            f" {run} sessions list --state-dir {state_dir}"
        )
    else:
        names = ", ".join(name + tag for name in ("planner", "builder", "reviewer"))
        print(f"the echo's sessions in the store you gave: {names}")
    return 0 if all(ok for _, _, ok in summary) else 1
