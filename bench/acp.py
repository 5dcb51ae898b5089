"""ACP: prompt round trip and prompt throughput of ``greenroom acp`` against an SDK agent.

Both agents are separate processes on stdio, driven by the same client code,
the official ACP Python SDK's client side (asyncio,
``acp.spawn_agent_process``):

* greenroom: ``python -m greenroom acp --model scripted:0``, a zero-delay
  echo model (one chunk per word; the prompt is one word, so one chunk),
  with ``GREENROOM_HOME`` and the cwd in a fresh temporary directory, and
  sessions persisted with the default sync policy (``turn``); again with
  ``--sync always``, and with its sessions in memory only
  (``python -m bench._acp_memory_agent``: no log, no fsync, as the SDK agent
  keeps nothing, so that what persistence costs is told apart), each
  reported beside it;
* SDK agent: ``python -m bench._acp_sdk_agent``, the least an agent can do
  with the official SDK's agent side: one ``agent_message_chunk`` back per
  prompt, then ``end_turn``; no model, no log, no persistence;
* the least agent: ``python -m bench._acp_null_agent``, the same answers with
  no SDK and no event loop (blocking reads, one write per read): what the
  client itself allows, the ceiling of every throughput ratio here (informational).

Per repeat, each agent is spawned once, initialized, given 10 sessions and a
few warm-up prompts on each, then measured for:

* round trip: sequential ``session/prompt``s on one session, each timed
  from the request to its response, p50 and p99 in microseconds;
* throughput: prompts per second with the 10 sessions in parallel
  (``asyncio.gather``), each session sending its prompts one after another;
* what a prompt costs the client, the machine-independent figures: the frames
  it reads and their bytes (each as compact JSON and its newline, the same
  for every agent), over `_COUNTED` sequential prompts on one session after
  the timed phases (the SDK's frame observer copies each frame, so it is
  attached only then).

Once per run, not timed: the Python calls per prompt of the agent's process
(all its threads, under ``sys.setprofile``: `bench._counted_calls`), greenroom
in memory against the SDK agent, each the difference between runs of 2M and M
sequential prompts on one session, over M: the machine-independent figure of
what a prompt costs the agent. The durable default's is in the row's note: it
moves from run to run with how many turns each fsync covers, which timing
decides.

Then, greenroom alone, with a client that grants every permission at once:
the p50 round trip of a prompt that makes one ``bash`` call (the echo model
runs ``bash: true``) already allowed always, against the same session's
prompt with no tool; and what asking permission adds to that call (a fresh
session, asked every time), against one client round trip: ``initialize`` again, with
the same parameters (the one request every ACP agent must answer, and answers without side
effects when repeated alike; ``authenticate`` was used before and is refused by an agent that
advertises no auth method, as greenroom does). The three prompts are timed in
turn (one of each, then again), each `_GAP` after the one before (its turn's fsync done),
the client round trip alone after them, back to back. Beside
it, informational, the same question asked by the SDK agent (a prompt ``ask``)
through the same client against its own client round trip: what the client
itself charges to answer one (the floor of the row above).

Live output (issue 28): a command printing 10 MB (``_FLOOD``) run by the
bash executor with a progress listener against the same command without
one, alternated (the ratio is what live output costs the command, goal
<= 1.05x); and through ``greenroom acp``, the progress updates the client
got for the same 10 MB printed over about a second against the most the
rate limit allows for the call's duration (one per 100 ms, plus one), goal
<= 1.

Every prompt must answer ``end_turn`` and every prompt's one chunk must reach
the client's ``session_update`` (counted per session), or the run fails. The
agents alternate which one goes first from one repeat to the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import acp
from acp import schema
from acp.client.connection import ClientSideConnection
from acp.connection import StreamDirection, StreamEvent

from bench.report import Row, compare

SCENARIO = "acp"
#: Seconds one agent's whole run (spawn to exit) may take before it counts as a hang.
_TIMEOUT = 120.0
#: Seconds to wait for the chunks of the prompts answered to reach ``session_update``.
_SETTLE = 5.0
_SESSIONS = 10
_WARMUP = 5  # prompts per session before measuring
_COUNTED = 20  # prompts whose frames and bytes are counted
_PROMPT = "ping"

_GREENROOM = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
_AGENTS: dict[str, tuple[str, ...]] = {
    "greenroom": _GREENROOM,
    "greenroom always": (*_GREENROOM, "--sync", "always"),
    "greenroom in memory": (sys.executable, "-m", "bench._acp_memory_agent"),
    "sdk": (sys.executable, "-m", "bench._acp_sdk_agent"),
    "least": (sys.executable, "-m", "bench._acp_null_agent"),
}


class _Counter:
    """The client: counts the ``agent_message_chunk``s each session receives; nothing else."""

    def __init__(self) -> None:
        self.chunks: dict[str, int] = {}
        self.other: list[tuple[str, Any]] = []  # any update that is not the echoed chunk
        self.changed = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if (
            isinstance(update, schema.AgentMessageChunk)
            and isinstance(update.content, schema.TextContentBlock)
            and update.content.text == _PROMPT
        ):
            self.chunks[session_id] = self.chunks.get(session_id, 0) + 1
        elif not isinstance(update, schema.SessionInfoUpdate | schema.AvailableCommandsUpdate):
            # Not a title (greenroom names sessions) nor its slash commands (sent after new).
            self.other.append((session_id, update))
        self.changed.set()

    async def request_permission(self, **kwargs: Any) -> Any:
        raise RuntimeError("no agent of this bench asks for permission")

    def on_connect(self, conn: Any) -> None:
        pass

    async def settled(self, expected: dict[str, int]) -> None:
        """Wait until every session has its expected chunk count; raise on too many or a timeout."""
        deadline = time.monotonic() + _SETTLE
        while True:
            self.changed.clear()
            over = {
                s: self.chunks.get(s, 0) for s, n in expected.items() if self.chunks.get(s, 0) > n
            }
            if over or self.other:
                raise RuntimeError(
                    f"unexpected updates: chunks {over} against {expected}, others {self.other[:3]}"
                )
            if all(self.chunks.get(s, 0) == n for s, n in expected.items()):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                got = {s: self.chunks.get(s, 0) for s in expected}
                raise RuntimeError(f"chunks received {got}, expected {expected}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)


class _SdkLog(logging.Handler):
    """Keeps what the SDK logs at WARNING or above (a frame it failed on, a dead task)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))


class _Wire:
    """The frames the agent writes the client and their bytes, as the SDK's observer sees
    them (decoded: each counted as compact JSON and its newline)."""

    def __init__(self) -> None:
        self.frames = 0
        self.bytes = 0

    def __call__(self, event: StreamEvent) -> None:
        if event.direction is StreamDirection.INCOMING:
            self.frames += 1
            self.bytes += len(json.dumps(event.message, separators=(",", ":"))) + 1


@dataclass
class _Result:
    p50_us: float
    p99_us: float
    prompts_per_s: float
    frames_per_prompt: float
    bytes_per_prompt: float


async def _prompt(conn: ClientSideConnection, session_id: str, words: str = _PROMPT) -> None:
    answer = await conn.prompt(session_id=session_id, prompt=[acp.text_block(words)])
    if answer.stop_reason != "end_turn":
        raise RuntimeError(f"session {session_id}: stop reason {answer.stop_reason!r}")


async def _sequential(conn: ClientSideConnection, session_id: str, n: int) -> None:
    for _ in range(n):
        await _prompt(conn, session_id)


async def _drive(name: str, n_latency: int, n_throughput: int, tmp: Path, stderr: int) -> _Result:
    command, *args = _AGENTS[name]
    home, work = tmp / "home", tmp / "work"
    work.mkdir()
    client = _Counter()
    sent: dict[str, int] = {}
    async with acp.spawn_agent_process(
        cast(acp.Client, client),  # implements only what these agents call
        command,
        *args,
        env={"GREENROOM_HOME": str(home)},
        cwd=work,
        transport_kwargs={"stderr": stderr},
    ) as (conn, process):
        init = await conn.initialize(protocol_version=1)
        if init.protocol_version != 1:
            raise RuntimeError(f"{name}: initialize answered {init.protocol_version}")
        sessions = [
            (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
            for _ in range(_SESSIONS)
        ]
        if len(set(sessions)) != _SESSIONS:
            raise RuntimeError(f"{name}: session ids are not distinct: {sessions}")

        for session_id in sessions:
            await _sequential(conn, session_id, _WARMUP)
            sent[session_id] = _WARMUP
        await client.settled(sent)

        # (a) round trip, sequential on one session
        samples: list[int] = []
        first = sessions[0]
        for _ in range(n_latency):
            t0 = time.perf_counter_ns()
            await _prompt(conn, first)
            samples.append(time.perf_counter_ns() - t0)
        sent[first] += n_latency
        await client.settled(sent)

        # (b) throughput, every session in parallel, each one prompt at a time
        each = n_throughput // _SESSIONS
        t0 = time.perf_counter_ns()
        await asyncio.gather(*(_sequential(conn, s, each) for s in sessions))
        elapsed = time.perf_counter_ns() - t0
        for session_id in sessions:
            sent[session_id] += each
        await client.settled(sent)

        # (c) what a prompt costs the client, counted (the connection's own observers:
        # the client side has no other way to attach one once connected)
        wire = _Wire()
        conn._conn.add_observer(wire)
        await _sequential(conn, first, _COUNTED)
        sent[first] += _COUNTED
        await client.settled(sent)
    code = await process.wait()
    if code != 0:
        raise RuntimeError(f"{name} exited {code}")
    percentiles = statistics.quantiles(samples, n=100, method="inclusive")
    return _Result(
        p50_us=statistics.median(samples) / 1e3,
        p99_us=percentiles[98] / 1e3,
        prompts_per_s=each * _SESSIONS / (elapsed / 1e9),
        frames_per_prompt=wire.frames / _COUNTED,
        bytes_per_prompt=wire.bytes / _COUNTED,
    )


class _Approver:
    """The client of the tool scenario: grants every permission it is asked, at once."""

    def __init__(self) -> None:
        self.asked = 0

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        pass

    async def request_permission(self, **kwargs: Any) -> schema.RequestPermissionResponse:
        self.asked += 1
        option = "allow_always" if self.asked == 1 else "allow_once"
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(outcome="selected", option_id=option)
        )

    def on_connect(self, conn: Any) -> None:
        pass


#: Seconds between two timed prompts: past the end of a turn's background work (under the
#: default sync policy its fsync starts 2 ms after the turn ends), so no prompt is timed
#: beside the one before's. Without it the previous turn's fdatasync lands inside the
#: next prompt's bash spawn at a place that depends on the order of the prompts (the
#: asking one, coming after the approved one, had it mid-spawn: 50-350 us more to spawn),
#: charged to what asking adds. Not between client round trips: the one a prompt asks is
#: taken with both processes awake, as back-to-back round trips are (after a pause each
#: also pays both processes' wake-up, ~150 us on this machine).
_GAP = 0.005


async def _interleaved(
    n: int, calls: Mapping[str, Callable[[], Awaitable[object]]], gap: float = 0.0
) -> dict[str, float]:
    """Median microseconds of `n` sequential calls of each of `calls`, taken in turn (one of
    each, then again), so a change of the machine's load lands on all alike: what asking
    adds is a difference of two medians of a ~3 ms bash call, and ~150 us of it is lost in
    the drift between two phases run one after the other. Each call starts `gap` seconds
    after the one before it ended."""
    samples: dict[str, list[int]] = {name: [] for name in calls}
    for _ in range(n):
        for name, call in calls.items():
            if gap:
                await asyncio.sleep(gap)
            t0 = time.perf_counter_ns()
            await call()
            samples[name].append(time.perf_counter_ns() - t0)
    return {name: statistics.median(taken) / 1e3 for name, taken in samples.items()}


async def _tools(n: int, tmp: Path, stderr: int) -> dict[str, float]:
    """Round trips of greenroom: no tool, an approved-always bash call, one that asks."""
    home, work = tmp / "home", tmp / "work"
    work.mkdir()
    client = _Approver()
    async with acp.spawn_agent_process(
        cast(acp.Client, client),
        *_GREENROOM,
        env={"GREENROOM_HOME": str(home)},
        cwd=work,
        transport_kwargs={"stderr": stderr},
    ) as (conn, process):
        await conn.initialize(protocol_version=1)
        approved = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        asking = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id

        async def prompt(session: str, words: str) -> None:
            answer = await conn.prompt(session_id=session, prompt=[acp.text_block(words)])
            if answer.stop_reason != "end_turn":
                raise RuntimeError(f"{words!r}: stop reason {answer.stop_reason!r}")

        await prompt(approved, "bash: true")  # asked once: allowed always from here on
        asked_before = client.asked
        figures = await _interleaved(
            n,
            {
                "no tool": lambda: prompt(approved, _PROMPT),
                "approved": lambda: prompt(approved, "bash: true"),
                "asking": lambda: prompt(asking, "bash: true"),
            },
            _GAP,
        )
        # Alone: taken between prompts it would carry their leftovers (a bash call's
        # reaping), a baseline made larger than one round trip.
        rounds = {"client round trip": lambda: conn.initialize(protocol_version=1)}
        figures |= await _interleaved(n, rounds)
        if client.asked - asked_before != n:
            raise RuntimeError(f"asked {client.asked - asked_before} times, expected {n}")
    await process.wait()
    return figures


#: A command printing 10 MB: 100,000 lines of 99 characters and a newline.
_FLOOD = "head -c 9900000 /dev/zero | tr '\\0' a | fold -w 99"
#: The same 10 MB over about a second (a megabyte, a pause, ...), so its run spans ticks.
_PACED_FLOOD = (
    "for i in $(seq 10); do head -c 990000 /dev/zero | tr '\\0' a | fold -w 99; sleep 0.1; done"
)


class _Progress:
    """The live-output client: grants permission, counts each call's progress updates and
    times its run (``in_progress`` to its result)."""

    def __init__(self) -> None:
        self.live = 0
        self.started = 0.0
        self.ended = 0.0

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if isinstance(update, schema.ToolCallProgress):
            if update.status == "in_progress" and not update.content:
                self.started = time.monotonic()
            elif update.status == "in_progress":
                self.live += 1
            else:
                self.ended = time.monotonic()

    async def request_permission(self, **kwargs: Any) -> schema.RequestPermissionResponse:
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(outcome="selected", option_id="allow_once")
        )

    def on_connect(self, conn: Any) -> None:
        pass


async def _flood_over_acp(tmp: Path, stderr: int) -> tuple[int, float]:
    """The progress updates of one 10 MB command, and the most the rate limit allows."""
    home, work = tmp / "home", tmp / "work"
    work.mkdir()
    client = _Progress()
    async with acp.spawn_agent_process(
        cast(acp.Client, client),
        *_GREENROOM,
        env={"GREENROOM_HOME": str(home)},
        cwd=work,
        transport_kwargs={"stderr": stderr},
    ) as (conn, process):
        await conn.initialize(protocol_version=1)
        session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        flood = acp.text_block(f"bash: {_PACED_FLOOD}")
        answer = await conn.prompt(session_id=session, prompt=[flood])
        if answer.stop_reason != "end_turn":
            raise RuntimeError(f"the flood: stop reason {answer.stop_reason!r}")
    await process.wait()
    return client.live, (client.ended - client.started) / 0.1 + 1


def _run_flood_over_acp() -> tuple[int, float]:
    with (
        tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp,
        tempfile.TemporaryFile() as stderr,
    ):
        return asyncio.run(asyncio.wait_for(_flood_over_acp(Path(tmp), stderr.fileno()), _TIMEOUT))


def _run_flood(n: int) -> tuple[float, float]:
    """Median seconds of the 10 MB command with a progress listener and without, alternated."""
    import trio

    from greenroom.tools.bash import BashExecRequest, LocalBashExecutor

    async def main() -> tuple[float, float]:
        times: dict[bool, list[float]] = {True: [], False: []}

        def listen(_output: str, _total: int) -> None:
            pass

        with tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp:
            async with LocalBashExecutor(tmp) as bash:
                spec = bash.resolve(BashExecRequest(command=_FLOOD))
                for index in range(2 * n):
                    live = index % 4 in (0, 3)  # on, off, off, on: neither always goes first
                    t0 = time.perf_counter()
                    result = await bash.run(spec, listen if live else None)
                    times[live].append(time.perf_counter() - t0)
                    if result.exit_code != 0:
                        raise RuntimeError(f"the flood exited {result.exit_code}")
        return statistics.median(times[True]), statistics.median(times[False])

    return trio.run(main)


def _run_tools(n: int) -> dict[str, float]:
    with (
        tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp,
        tempfile.TemporaryFile() as stderr,
    ):
        return asyncio.run(asyncio.wait_for(_tools(n, Path(tmp), stderr.fileno()), _TIMEOUT))


async def _sdk_asking(n: int, work: Path, stderr: int) -> dict[str, float]:
    """Round trips of the SDK agent: a prompt, one that asks permission first, interleaved;
    then the client round trip alone (as `_tools` takes them)."""
    client = _Approver()
    async with acp.spawn_agent_process(
        cast(acp.Client, client), *_AGENTS["sdk"], cwd=work, transport_kwargs={"stderr": stderr}
    ) as (conn, process):
        await conn.initialize(protocol_version=1)
        session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        figures = await _interleaved(
            n,
            {
                "no tool": lambda: _prompt(conn, session),
                "asking": lambda: _prompt(conn, session, "ask"),
            },
            _GAP,
        )
        rounds = {"client round trip": lambda: conn.initialize(protocol_version=1)}
        figures |= await _interleaved(n, rounds)
        if client.asked != n:
            raise RuntimeError(f"the SDK agent asked {client.asked} times, expected {n}")
    await process.wait()
    return figures


def _run_sdk_asking(n: int) -> dict[str, float]:
    with (
        tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp,
        tempfile.TemporaryFile() as stderr,
    ):
        asking = _sdk_asking(n, Path(tmp), stderr.fileno())
        return asyncio.run(asyncio.wait_for(asking, _TIMEOUT))


async def _calls(name: str, m: int, tmp: Path, stderr: int) -> int:
    """The Python calls of agent `name`'s threads over its whole run (spawn to exit): one
    session, `_WARMUP` prompts, then `m` sequential ones (`bench._counted_calls`)."""
    python, flag, *module = _AGENTS[name]
    home, work, out = tmp / "home", tmp / "work", tmp / "calls"
    work.mkdir()
    client = _Counter()
    async with acp.spawn_agent_process(
        cast(acp.Client, client),
        python,
        "-m",
        "bench._counted_calls",
        str(out),
        flag,
        *module,
        env={"GREENROOM_HOME": str(home)},
        cwd=work,
        transport_kwargs={"stderr": stderr},
    ) as (conn, process):
        await conn.initialize(protocol_version=1)
        session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        await _sequential(conn, session, _WARMUP + m)
        await client.settled({session: _WARMUP + m})
    code = await process.wait()
    if code != 0:
        raise RuntimeError(f"{name}, counted, exited {code}")
    return int(out.read_text())


def _calls_per_prompt(name: str, m: int) -> float:
    """Python calls per prompt of agent `name`: the difference between runs of 2m and m
    prompts, over m (start-up and teardown cancel out)."""
    counts = []
    for prompts in (m, 2 * m):
        with (
            tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp,
            tempfile.TemporaryFile() as stderr,
        ):
            counting = _calls(name, prompts, Path(tmp), stderr.fileno())
            counts.append(asyncio.run(asyncio.wait_for(counting, _TIMEOUT)))
    return (counts[1] - counts[0]) / m


def _run_one(name: str, n_latency: int, n_throughput: int) -> _Result:
    """Spawn, drive and reap one agent in a fresh asyncio loop and temporary directory."""
    log = _SdkLog()
    root = logging.getLogger()
    root.addHandler(log)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp,
            tempfile.TemporaryFile() as stderr,
        ):
            try:
                drive = _drive(name, n_latency, n_throughput, Path(tmp), stderr.fileno())
                result = asyncio.run(asyncio.wait_for(drive, _TIMEOUT))
            finally:
                stderr.seek(0)
                said = stderr.read()[-4000:].decode(errors="replace")
                if said.strip():
                    sys.stderr.write(f"bench acp: {name} wrote to stderr:\n{said}\n")
    finally:
        root.removeHandler(log)
    if log.records:
        raise RuntimeError(f"{name}: the SDK client logged:\n" + "\n".join(log.records[:5]))
    return result


def run(repeats: int, quick: bool) -> list[Row]:
    n_latency = 60 if quick else 300  # sequential prompts on one session
    n_throughput = 100 if quick else 1000  # prompts over the 10 parallel sessions

    n_tools = 30 if quick else 150
    n_flood = 2 if quick else 5  # runs of the 10 MB command each way, per repeat
    m_counted = 20 if quick else 200  # prompts of the shorter counted run (once, not timed)
    results: dict[str, list[_Result]] = {name: [] for name in _AGENTS}
    tools: list[dict[str, float]] = []
    sdk_asking: list[dict[str, float]] = []
    floods: list[tuple[float, float]] = []
    over_acp: list[tuple[int, float]] = []
    names = list(_AGENTS)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            gc.collect()
            results[name].append(_run_one(name, n_latency, n_throughput))
        gc.collect()
        tools.append(_run_tools(n_tools))
        sdk_asking.append(_run_sdk_asking(n_tools))
        floods.append(_run_flood(n_flood))
        over_acp.append(_run_flood_over_acp())

    counted = ("greenroom in memory", "greenroom", "sdk")
    calls = {name: _calls_per_prompt(name, m_counted) for name in counted}
    ours, raw, always = results["greenroom"], results["sdk"], results["greenroom always"]
    least, memory = results["least"], results["greenroom in memory"]
    baseline = "SDK agent (acp.run_agent)"
    each = n_throughput // _SESSIONS
    return [
        compare(
            SCENARIO,
            f"a command printing 10 MB, live output on (median of {n_flood})",
            "s",
            [on for on, _ in floods],
            baseline="the same command, live output off",
            raw=[off for _, off in floods],
            max_ratio=1.05,
        ),
        compare(
            SCENARIO,
            "progress updates of a command printing 10 MB over 1 s, over ACP",
            "updates",
            [float(sent) for sent, _ in over_acp],
            baseline="the rate limit's most for its run (one per 100 ms, plus one)",
            raw=[bound for _, bound in over_acp],
            max_ratio=1.0,
        ),
        compare(
            SCENARIO,
            f"prompt round trip p50, one auto-approved bash call (N={n_tools})",
            "us",
            [t["approved"] for t in tools],
            baseline="the same prompt, no tool",
            raw=[t["no tool"] for t in tools],
        ),
        compare(
            SCENARIO,
            f"what asking permission adds to a bash call, p50 (N={n_tools})",
            "us",
            [t["asking"] - t["approved"] for t in tools],
            baseline="one client round trip (initialize, repeated alike)",
            raw=[t["client round trip"] for t in tools],
            max_ratio=1.0,
        ),
        compare(
            SCENARIO,
            f"what asking permission adds to an SDK agent's prompt, p50 (N={n_tools})",
            "us",
            [t["asking"] - t["no tool"] for t in sdk_asking],
            baseline="one client round trip (initialize, repeated alike)",
            raw=[t["client round trip"] for t in sdk_asking],
        ),
        compare(
            SCENARIO,
            f"prompt throughput, sync=always, {_SESSIONS} sessions x {each} sequential prompts",
            "prompts/s",
            [r.prompts_per_s for r in always],
            baseline=baseline,
            raw=[r.prompts_per_s for r in raw],
        ),
        compare(
            SCENARIO,
            f"prompt round trip p99, sync=always, one session (N={n_latency})",
            "us",
            [r.p99_us for r in always],
            baseline=baseline,
            raw=[r.p99_us for r in raw],
        ),
        compare(
            SCENARIO,
            f"prompt throughput, sessions in memory, {_SESSIONS} sessions x {each}: like for like",
            "prompts/s",
            [r.prompts_per_s for r in memory],
            baseline=baseline,
            raw=[r.prompts_per_s for r in raw],
        ),
        compare(
            SCENARIO,
            f"prompt round trip p99, sessions in memory, one session (N={n_latency})",
            "us",
            [r.p99_us for r in memory],
            baseline=baseline,
            raw=[r.p99_us for r in raw],
        ),
        compare(
            SCENARIO,
            f"Python calls per prompt in the agent's process, sessions in memory (M={m_counted})",
            "calls",
            [calls["greenroom in memory"]],
            baseline=baseline,
            raw=[calls["sdk"]],
            note=f"durable (sync turn): {calls['greenroom']:.0f} calls, a figure that moves by"
            " some 15 from run to run with how the turns' fsyncs coalesce",
        ),
        compare(
            SCENARIO,
            f"prompt throughput of the least agent (no SDK), {_SESSIONS} sessions x {each}: the"
            " client's ceiling",
            "prompts/s",
            [r.prompts_per_s for r in least],
            baseline=baseline,
            raw=[r.prompts_per_s for r in raw],
        ),
        compare(
            SCENARIO,
            f"prompt throughput, {_SESSIONS} sessions x {each} sequential prompts in parallel",
            "prompts/s",
            [r.prompts_per_s for r in ours],
            baseline=baseline,
            raw=[r.prompts_per_s for r in raw],
            min_ratio=1.5,
        ),
        compare(
            SCENARIO,
            "frames the client reads per prompt (one session, sequential)",
            "frames",
            [r.frames_per_prompt for r in ours],
            baseline=baseline,
            raw=[r.frames_per_prompt for r in raw],
            max_ratio=1.0,
        ),
        compare(
            SCENARIO,
            "bytes the client reads per prompt (compact JSON, one session, sequential)",
            "bytes",
            [r.bytes_per_prompt for r in ours],
            baseline=baseline,
            raw=[r.bytes_per_prompt for r in raw],
        ),
        compare(
            SCENARIO,
            f"prompt round trip p50, one session (N={n_latency})",
            "us",
            [r.p50_us for r in ours],
            baseline=baseline,
            raw=[r.p50_us for r in raw],
        ),
        compare(
            SCENARIO,
            f"prompt round trip p99, one session (N={n_latency})",
            "us",
            [r.p99_us for r in ours],
            baseline=baseline,
            raw=[r.p99_us for r in raw],
            max_ratio=1.0,
        ),
    ]
