"""ACP: prompt round trip and prompt throughput of ``greenroom acp`` against an SDK agent.

Both agents are separate processes on stdio, driven by the same client code,
the official ACP Python SDK's client side (asyncio,
``acp.spawn_agent_process``):

* greenroom: ``python -m greenroom acp --model scripted:0``, a zero-delay
  echo model (one chunk per word; the prompt is one word, so one chunk),
  with ``GREENROOM_HOME`` and the cwd in a fresh temporary directory, and
  sessions persisted with the default sync policy (``turn``); again with
  ``--sync always``, reported beside it;
* SDK agent: ``python -m bench._acp_sdk_agent``, the least an agent can do
  with the official SDK's agent side: one ``agent_message_chunk`` back per
  prompt, then ``end_turn``; no model, no log, no persistence.

Per repeat, each agent is spawned once, initialized, given 10 sessions and a
few warm-up prompts on each, then measured for:

* round trip: sequential ``session/prompt``s on one session, each timed
  from the request to its response, p50 and p99 in microseconds;
* throughput: prompts per second with the 10 sessions in parallel
  (``asyncio.gather``), each session sending its prompts one after another.

Then, greenroom alone, with a client that grants every permission at once:
the p50 round trip of a prompt that makes one ``bash`` call (the echo model
runs ``bash: true``) already allowed always, against the same session's
prompt with no tool; and what asking permission adds to that call (a fresh
session, asked every time), against one client round trip: ``initialize`` again, with
the same parameters (the one request every ACP agent must answer, and answers without side
effects when repeated alike; ``authenticate`` was used before and is refused by an agent that
advertises no auth method, as greenroom does).

Every prompt must answer ``end_turn`` and every prompt's one chunk must reach
the client's ``session_update`` (counted per session), or the run fails. The
agents alternate which one goes first from one repeat to the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import acp
from acp import schema
from acp.client.connection import ClientSideConnection

from bench.report import Row, compare

SCENARIO = "acp"
#: Seconds one agent's whole run (spawn to exit) may take before it counts as a hang.
_TIMEOUT = 120.0
#: Seconds to wait for the chunks of the prompts answered to reach ``session_update``.
_SETTLE = 5.0
_SESSIONS = 10
_WARMUP = 5  # prompts per session before measuring
_PROMPT = "ping"

_GREENROOM = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
_AGENTS: dict[str, tuple[str, ...]] = {
    "greenroom": _GREENROOM,
    "greenroom always": (*_GREENROOM, "--sync", "always"),
    "sdk": (sys.executable, "-m", "bench._acp_sdk_agent"),
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
        elif not isinstance(update, schema.SessionInfoUpdate):  # a title: greenroom names sessions
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


@dataclass
class _Result:
    p50_us: float
    p99_us: float
    prompts_per_s: float


async def _prompt(conn: ClientSideConnection, session_id: str) -> None:
    answer = await conn.prompt(session_id=session_id, prompt=[acp.text_block(_PROMPT)])
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
    code = await process.wait()
    if code != 0:
        raise RuntimeError(f"{name} exited {code}")
    percentiles = statistics.quantiles(samples, n=100, method="inclusive")
    return _Result(
        p50_us=statistics.median(samples) / 1e3,
        p99_us=percentiles[98] / 1e3,
        prompts_per_s=each * _SESSIONS / (elapsed / 1e9),
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


async def _timed(n: int, call: Callable[[], Awaitable[object]]) -> float:
    """Median microseconds of `n` sequential calls."""
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await call()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e3


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
        figures = {
            "no tool": await _timed(n, lambda: prompt(approved, _PROMPT)),
            "approved": await _timed(n, lambda: prompt(approved, "bash: true")),
            "asking": await _timed(n, lambda: prompt(asking, "bash: true")),
            "client round trip": await _timed(n, lambda: conn.initialize(protocol_version=1)),
        }
        if client.asked - asked_before != n:
            raise RuntimeError(f"asked {client.asked - asked_before} times, expected {n}")
    await process.wait()
    return figures


def _run_tools(n: int) -> dict[str, float]:
    with (
        tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp,
        tempfile.TemporaryFile() as stderr,
    ):
        return asyncio.run(asyncio.wait_for(_tools(n, Path(tmp), stderr.fileno()), _TIMEOUT))


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
    n_throughput = 200 if quick else 1000  # prompts over the 10 parallel sessions

    n_tools = 30 if quick else 150
    results: dict[str, list[_Result]] = {name: [] for name in _AGENTS}
    tools: list[dict[str, float]] = []
    names = list(_AGENTS)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            gc.collect()
            results[name].append(_run_one(name, n_latency, n_throughput))
        gc.collect()
        tools.append(_run_tools(n_tools))

    ours, raw, always = results["greenroom"], results["sdk"], results["greenroom always"]
    baseline = "SDK agent (acp.run_agent)"
    each = n_throughput // _SESSIONS
    return [
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
            f"prompt throughput, {_SESSIONS} sessions x {each} sequential prompts in parallel",
            "prompts/s",
            [r.prompts_per_s for r in ours],
            baseline=baseline,
            raw=[r.prompts_per_s for r in raw],
            min_ratio=1.5,
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
