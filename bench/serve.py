"""serve: prompt throughput and round trip of ``greenroom serve`` over WebSocket, against
``greenroom acp`` over stdio, in the same run.

Both are separate processes with the zero-delay echo model (``--model scripted:0``), a
fresh JSONL store and the default sync policy, driven by the same Trio client (one
JSON-RPC reader matching answers to requests): over stdio through the process's pipes,
over WebSocket through trio-websocket on loopback. Per repeat, each server is started,
initialized, given 10 sessions and a few warm-up prompts on each, then measured for:

* throughput: prompts per second with the 10 sessions in parallel, each sending its
  prompts one after another (10 x 100; 10 x 10 with ``--quick``), goal >= 0.8x stdio,
  with ``--max-rate`` raised past it (one connection carries them all); and the
  server's CPU time per prompt meanwhile (all its threads, from ``/proc``): what the
  server spends, whatever the client;
* round trip: sequential prompts on one session, p99 in microseconds, goal <= 1.5x stdio.

Then, in this process, the traced memory of an idle session made by ``session/new`` over
one WebSocket to ``serve_acp``, beyond the same session made by ``runtime.agents.create``
(goal: at most 16 KB). Then, ``greenroom serve`` alone (``--max-connections`` raised for
it): its RSS (read off ``/proc``) with 1,000 idle WebSocket connections held, each
initialized (100 with ``--quick``), against its RSS before them (goal: at most 50 MB
more); and its RSS after 10,000 connections opened (the WebSocket handshake and
``initialize``) and dropped, one after another (1,000 with ``--quick``), against its RSS
before the storm (goal: at most 10 MB more).

Every prompt must answer ``end_turn``, or the run fails. The two alternate which goes
first from one repeat to the next.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio
from trio_websocket import open_websocket_url

from bench.report import Row, compare
from greenroom import open_runtime
from greenroom.acp.serve import serve_acp
from greenroom.acp.stdio import plug_tools
from greenroom.models.scripted import ScriptedModel
from greenroom.session.persistence import JsonlPersistence

SCENARIO = "serve"
_SESSIONS = 10
_WARMUP = 3
_PROMPT = [{"type": "text", "text": "hello"}]


class _Client:
    """Requests out through `send`, answers matched by id as `feed` is given frames."""

    def __init__(self, send: Callable[[str], Awaitable[None]]) -> None:
        self._send = send
        self._ids = itertools.count(1)
        self._waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._sending = trio.Lock()  # one writer at a time, for either transport

    def feed(self, frame: dict[str, Any]) -> None:
        if "method" not in frame and frame.get("id") in self._waiting:
            self._waiting.pop(frame["id"]).send_nowait(frame)

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = next(self._ids)
        sender, receiver = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[request_id] = sender
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        async with self._sending:
            await self._send(json.dumps(message))
        answer = await receiver.receive()
        if "result" not in answer:
            raise RuntimeError(f"{method} failed: {answer}")
        return dict(answer["result"])


def _cpu_ns(pid: int) -> int:
    """CPU time the process `pid` has run, all its threads, in ns (``schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total


async def _measure(
    client: _Client, cwd: str, n_throughput: int, n_latency: int, pid: int
) -> tuple[float, float, float]:
    await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    sessions = [
        (await client.call("session/new", {"cwd": cwd, "mcpServers": []}))["sessionId"]
        for _ in range(_SESSIONS)
    ]

    async def prompts(session: str, n: int) -> None:
        for _ in range(n):
            answer = await client.call("session/prompt", {"sessionId": session, "prompt": _PROMPT})
            if answer["stopReason"] != "end_turn":
                raise RuntimeError(f"a prompt answered {answer}")

    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(prompts, session, _WARMUP)
    started, cpu = time.perf_counter(), _cpu_ns(pid)
    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(prompts, session, n_throughput // _SESSIONS)
    throughput = n_throughput / (time.perf_counter() - started)
    cpu_per_prompt = (_cpu_ns(pid) - cpu) / n_throughput / 1000
    times = []
    for _ in range(n_latency):
        began = time.perf_counter()
        await prompts(sessions[0], 1)
        times.append((time.perf_counter() - began) * 1e6)
    p99 = statistics.quantiles(times, n=100)[98]
    return throughput, p99, cpu_per_prompt


def _command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "greenroom", *arguments, "--model", "scripted:0"]


async def _over_stdio(work: Path, n_throughput: int, n_latency: int) -> tuple[float, float, float]:
    env = {**os.environ, "GREENROOM_HOME": str(work / "home")}
    async with trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(
            _command("acp", "--store", f"jsonl:{work / 'stdio'}"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=work,
            env=env,
        )
        assert process.stdin is not None
        assert process.stdout is not None
        stdin, stdout = process.stdin, process.stdout

        async def send(text: str) -> None:
            await stdin.send_all(text.encode() + b"\n")

        client = _Client(send)

        async def read() -> None:
            buffer = b""
            while chunk := await stdout.receive_some():
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    client.feed(json.loads(line))

        nursery.start_soon(read)
        try:
            return await _measure(client, str(work), n_throughput, n_latency, process.pid)
        finally:
            await stdin.aclose()
            await process.wait()
            nursery.cancel_scope.cancel()


async def _over_websocket(
    work: Path, n_throughput: int, n_latency: int
) -> tuple[float, float, float]:
    # The one connection carries every prompt: the default 200 messages/s would be the row.
    rate = ("--max-rate", "1000000")
    listen = ("serve", "--listen", "127.0.0.1:0", "--store", f"jsonl:{work / 'ws'}", *rate)
    process = await trio.lowlevel.open_process(
        _command(*listen), stderr=subprocess.PIPE, cwd=work, env=dict(os.environ)
    )
    try:
        assert process.stderr is not None
        said = b""
        while b"/acp\n" not in said:
            chunk = await process.stderr.receive_some()
            if not chunk:
                raise RuntimeError(f"greenroom serve did not start: {said.decode()}")
            said += chunk
        url = said.decode().split("listening on ")[1].split()[0]
        async with (
            open_websocket_url("ws" + url.removeprefix("http")) as socket,
            trio.open_nursery() as nursery,
        ):
            client = _Client(socket.send_message)

            async def read() -> None:
                while True:
                    client.feed(json.loads(await socket.get_message()))

            nursery.start_soon(read)
            measured = await _measure(client, str(work), n_throughput, n_latency, process.pid)
            nursery.cancel_scope.cancel()
            return measured
    finally:
        process.terminate()
        await process.wait()


async def _per_session(work: Path, k: int) -> tuple[float, float]:
    """Traced bytes per idle session: made by ``session/new`` over one WebSocket to a
    ``serve_acp`` in this process, and made by ``runtime.agents.create`` (the session
    alone), each after a first one that is not counted. The client keeps nothing of what
    it reads, so what stays is the server's."""
    model = ScriptedModel(delay=0)
    async with open_runtime(model=model, persistence=JsonlPersistence(work / "alone")) as rt:
        for counted in (False, True):
            before = _traced()
            for _ in range(k if counted else 1):
                name = str(uuid.uuid4())
                await rt.agents.create(agent_id=name, session_id=name, cwd=str(work))
        alone = (_traced() - before) / k
    async with (
        open_runtime(model=model, persistence=JsonlPersistence(work / "served")) as rt,
        trio.open_nursery() as nursery,
    ):
        await plug_tools(rt)
        urls = await nursery.start(partial(serve_acp, rt, "127.0.0.1:0"))
        async with open_websocket_url("ws" + urls[0].removeprefix("http") + "/acp") as socket:
            client = _Client(socket.send_message)

            async def read() -> None:
                while True:
                    client.feed(json.loads(await socket.get_message()))

            nursery.start_soon(read)
            await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            new = {"cwd": str(work), "mcpServers": []}
            await client.call("session/new", new)
            await trio.sleep(0.1)  # its updates read
            before = _traced()
            for _ in range(k):
                await client.call("session/new", new)
            await trio.sleep(0.1)
            served = (_traced() - before) / k
            nursery.cancel_scope.cancel()
    return served, alone


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def _connections(work: Path, held: int, storm: int) -> tuple[float, float, float, float]:
    """RSS before and with `held` idle connections; before and after a storm of `storm`."""
    listen = ("serve", "--listen", "127.0.0.1:0", "--store", f"jsonl:{work / 'idle'}")
    limit = ("--max-connections", str(held + 10))
    process = await trio.lowlevel.open_process(
        _command(*listen, *limit), stderr=subprocess.PIPE, cwd=work, env=dict(os.environ)
    )
    try:
        assert process.stderr is not None
        said = b""
        while b"/acp\n" not in said:
            chunk = await process.stderr.receive_some()
            if not chunk:
                raise RuntimeError(f"greenroom serve did not start: {said.decode()}")
            said += chunk
        url = "ws" + said.decode().split("listening on ")[1].split()[0].removeprefix("http")
        initialize = json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}
        )

        async def one(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with open_websocket_url(url) as socket:
                await socket.send_message(initialize)
                await socket.get_message()
                task_status.started()
                await trio.sleep_forever()

        # One connection first, so that what every connection shares is in the baseline.
        async with trio.open_nursery() as warm:
            await warm.start(one)
            warm.cancel_scope.cancel()
        await trio.sleep(0.5)
        before = _rss_mb(process.pid)
        async with trio.open_nursery() as idle:
            for _ in range(held):
                await idle.start(one)
            await trio.sleep(0.5)
            holding = _rss_mb(process.pid)
            idle.cancel_scope.cancel()
        await trio.sleep(1.0)
        calm = _rss_mb(process.pid)
        for _ in range(storm):
            async with trio.open_nursery() as once:
                await once.start(one)
                once.cancel_scope.cancel()
        await trio.sleep(1.0)
        return before, holding, calm, _rss_mb(process.pid)
    finally:
        process.terminate()
        await process.wait()


def run(repeats: int, quick: bool) -> list[Row]:
    n_throughput = 100 if quick else 1000  # 10 sessions x 10 (x 100)
    n_latency = 50 if quick else 300
    held, storm = (100, 1000) if quick else (1000, 10_000)
    per_session = 20 if quick else 200
    stdio: list[tuple[float, float, float]] = []
    websocket: list[tuple[float, float, float]] = []
    memory: list[tuple[float, float, float, float]] = []
    sessions: list[tuple[float, float]] = []
    for repeat in range(repeats):
        order = [(stdio, _over_stdio), (websocket, _over_websocket)]
        for results, drive in order if repeat % 2 == 0 else reversed(order):
            with tempfile.TemporaryDirectory() as tmp:
                results.append(trio.run(drive, Path(tmp), n_throughput, n_latency))
        with tempfile.TemporaryDirectory() as tmp:
            memory.append(trio.run(_connections, Path(tmp), held, storm))
        with tempfile.TemporaryDirectory() as tmp:
            tracemalloc.start()
            try:
                sessions.append(trio.run(_per_session, Path(tmp), per_session))
            finally:
                tracemalloc.stop()
    each = n_throughput // _SESSIONS
    return [
        compare(
            SCENARIO,
            f"prompt throughput over WebSocket, {_SESSIONS} sessions x {each} sequential prompts",
            "prompts/s",
            [t for t, _, _ in websocket],
            baseline="greenroom acp over stdio",
            raw=[t for t, _, _ in stdio],
            min_ratio=0.8,
        ),
        compare(
            SCENARIO,
            "server CPU per prompt over WebSocket (the throughput run, all its threads)",
            "us",
            [c for _, _, c in websocket],
            baseline="greenroom acp over stdio",
            raw=[c for _, _, c in stdio],
        ),
        compare(
            SCENARIO,
            f"prompt round trip p99 over WebSocket, one session (N={n_latency})",
            "us",
            [p for _, p, _ in websocket],
            baseline="greenroom acp over stdio",
            raw=[p for _, p, _ in stdio],
            max_ratio=1.5,
        ),
        compare(
            SCENARIO,
            "traced memory per idle session made over WebSocket, beyond the session"
            f" (N={per_session})",
            "B",
            [served - alone for served, alone in sessions],
            max_value=16 * 1024,
            note="the session alone: runtime.agents.create, same runtime and store",
        ),
        compare(
            SCENARIO,
            f"RSS growth with {held:,} idle WebSocket connections held",
            "MB",
            [holding - before for before, holding, _, _ in memory],
            max_value=50.0,
        ),
        compare(
            SCENARIO,
            f"RSS growth after {storm:,} connections opened and dropped",
            "MB",
            [after - calm for _, _, calm, after in memory],
            max_value=10.0,
        ),
    ]
