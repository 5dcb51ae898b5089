"""Models: the adapters over TLS to a loopback server, against a raw pooled httpx2 client, and
each adapter's event reader against the Chat Completions adapter's.

* time to first token, steps 2..N: ours is `AnthropicModel.stream` with its pool
  held (as a runtime holds it), from the call to the first `TextDelta` (the
  request built from a short history and encoded, sent, the stream parsed);
  raw is one ``httpx2.AsyncClient`` kept open, sending the same bytes and
  reading lines up to the first ``content_block_delta``; in microseconds;
* the same with a client per call (the adapter nobody holds, as every step was
  before the pool): the handshake and the TLS context each step pays;
* connections the server saw for a session of N steps (one turn: N - 1 tool
  calls, then an answer) through `open_runtime`, for the Anthropic, Responses and
  Gemini adapters;
* request build time (``body`` + JSON encoding) against the history's length:
  10, 100 and 1,000 messages, ours per request in microseconds, against
  encoding the already built body alone;
* parse cost per event: each adapter's event reader (``_chunks``) over a
  2,000-event text reply built from the suite's documented fixtures
  (`tests.wire`), the events already split (no socket, no SSE framing), in
  microseconds per event, against the Chat Completions adapter's over its own
  2,000 events, measured in the same repeat.

The loopback server speaks HTTP/1.1 over TLS (a `trustme` certificate),
keeps connections alive, counts them and answers every request with the same
recorded-style stream of the adapter's wire format (text, or a tool call for
the session rows).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import statistics
import time
from collections.abc import AsyncIterator, Callable
from functools import partial

import httpx2
import msgspec
import trio
import trustme

from bench.report import Row, compare
from greenroom import open_runtime
from greenroom.actors.types import ToolInvocation
from greenroom.models.anthropic import AnthropicModel
from greenroom.models.base import ModelAdapter
from greenroom.models.deepseek import DeepSeekModel
from greenroom.models.gemini import GeminiModel
from greenroom.models.http import HttpModel, SseEvent
from greenroom.models.loopback import sse
from greenroom.models.openai import OpenAIChatModel
from greenroom.models.responses import OpenAIResponsesModel
from greenroom.protocol.model import (
    AssistantTurn,
    ModelRequest,
    TextDelta,
    ToolCallChunk,
    ToolTurn,
    UserTurn,
)
from greenroom.tools import Tool
from tests.wire import (
    ant_block,
    ant_delta,
    ant_end,
    ant_start,
    ant_stop_block,
    events,
    gem,
    gem_sse,
    oai,
    oai_usage,
    rsp,
    rsp_call,
    rsp_created,
    rsp_end,
    rsp_message,
)

SCENARIO = "models"
_KEY = "sk-bench"


def _events(*events: tuple[str, dict[str, object]]) -> bytes:
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )


def _stream(block: dict[str, object], delta: dict[str, object], stop: str) -> bytes:
    usage = {"input_tokens": 1200, "cache_read_input_tokens": 1100, "output_tokens": 1}
    start = {"type": "message", "role": "assistant", "content": [], "usage": usage}
    return _events(
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop},
                "usage": {"output_tokens": 9},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    )


_TEXT = _stream({"type": "text", "text": ""}, {"type": "text_delta", "text": "Done."}, "end_turn")
_CALL = _stream(
    {"type": "tool_use", "id": "c", "name": "note", "input": {}},
    {"type": "input_json_delta", "partial_json": '{"text": "x"}'},
    "tool_use",
)


class _Server:
    """HTTP/1.1 over TLS on 127.0.0.1: every request gets ``answer(n)`` (n from 1), chunked."""

    def __init__(self, context: ssl.SSLContext, answer: Callable[[int], bytes]) -> None:
        self.context = context
        self.answer = answer
        self.connections = 0
        self.requests = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        wire = trio.SSLStream(stream, self.context, server_side=True)
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = await wire.receive_some()
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(buffer) < length:
                    buffer += await wire.receive_some()
                buffer = buffer[length:]
                self.requests += 1
                body = self.answer(self.requests)
                await wire.send_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                    + f"{len(body):x}\r\n".encode()
                    + body
                    + b"\r\n0\r\n\r\n"
                )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(1),
                contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
            ):
                await wire.aclose()


class _Tls:
    def __init__(self) -> None:
        ca = trustme.CA()
        self.server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(self.server)
        self.client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ca.configure_trust(self.client)


async def _serving(
    nursery: trio.Nursery, tls: _Tls, answer: Callable[[int], bytes]
) -> tuple[_Server, str]:
    server = _Server(tls.server, answer)
    listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    return server, f"https://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


_REQUEST = ModelRequest(messages=[UserTurn("hi")], system="You are terse.")


async def _first_token_ours(model: AnthropicModel) -> float:
    t0 = time.perf_counter()
    stream = model.stream(_REQUEST)
    async for chunk in stream:
        if isinstance(chunk, TextDelta):
            took = time.perf_counter() - t0
            break
    async for _ in stream:  # the rest, so the connection goes back to the pool
        pass
    return took


async def _first_token_raw(
    client: httpx2.AsyncClient, url: str, headers: dict[str, str], body: bytes
) -> float:
    t0 = time.perf_counter()
    async with client.stream("POST", url, headers=headers, content=body) as response:
        took = 0.0
        async for line in response.aiter_lines():
            if not took and line.startswith("data:") and "content_block_delta" in line:
                took = time.perf_counter() - t0
    return took


async def _ttft(steps: int) -> tuple[float, float, float]:
    """Median microseconds of steps 2..N: (ours pooled, raw pooled, ours a client per call)."""
    tls = _Tls()
    async with trio.open_nursery() as nursery:
        _, url = await _serving(nursery, tls, lambda n: _TEXT)
        model = AnthropicModel(url, _KEY, "claude-bench", verify=tls.client)
        headers = {
            "x-api-key": _KEY,
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
        }
        body = msgspec.json.encode(model.body(_REQUEST))
        ours: list[float] = []
        raw: list[float] = []
        fresh: list[float] = []
        async with model.connections.held(), httpx2.AsyncClient(verify=tls.client) as client:
            await _first_token_ours(model)  # step 1: the handshakes
            await _first_token_raw(client, url + "/v1/messages", headers, body)
            for step in range(steps - 1):
                if step % 2:
                    ours.append(await _first_token_ours(model))
                    raw.append(await _first_token_raw(client, url + "/v1/messages", headers, body))
                else:
                    raw.append(await _first_token_raw(client, url + "/v1/messages", headers, body))
                    ours.append(await _first_token_ours(model))
        unheld = AnthropicModel(url, _KEY, "claude-bench", verify=tls.client)
        for _ in range(steps - 1):
            fresh.append(await _first_token_ours(unheld))
        nursery.cancel_scope.cancel()
    return (
        statistics.median(ours) * 1e6,
        statistics.median(raw) * 1e6,
        statistics.median(fresh) * 1e6,
    )


class _Note(msgspec.Struct):
    text: str


async def _note(args: _Note, call: ToolInvocation) -> str:
    return "noted"


#: Per adapter: how it is made for a URL, its reply calling ``note``, and its text reply.
_SESSIONS: dict[str, tuple[Callable[[str, ssl.SSLContext], ModelAdapter], bytes, bytes]] = {
    "anthropic": (
        lambda url, tls: AnthropicModel(url, _KEY, "claude-bench", verify=tls),
        _CALL,
        _TEXT,
    ),
    "responses": (
        lambda url, tls: OpenAIResponsesModel(url, _KEY, "gpt-bench", verify=tls),
        b"".join(rsp(*rsp_created(), *rsp_call(0, "c", "note", ['{"text": "x"}']), rsp_end())),
        b"".join(rsp(*rsp_created(), *rsp_message(0, ["Done."]), rsp_end())),
    ),
    "gemini": (
        lambda url, tls: GeminiModel(url, _KEY, "gemini-bench", verify=tls),
        b"".join(gem_sse(gem([{"functionCall": {"name": "note", "args": {"text": "x"}}}], "STOP"))),
        b"".join(gem_sse(gem([{"text": "Done."}], "STOP"))),
    ),
}


async def _session_connections(adapter: str, steps: int) -> int:
    make, call, text = _SESSIONS[adapter]
    tls = _Tls()
    async with trio.open_nursery() as nursery:
        server, url = await _serving(nursery, tls, lambda n: call if n < steps else text)
        tool = Tool("note", "take a note", _Note, _note)
        async with open_runtime(model=make(url, tls.client), tools=[tool]) as rt:
            handle = await rt.agents.create(agent_id="bench", session_id="bench")
            await handle.agent.send("take notes")
        nursery.cancel_scope.cancel()
    if server.requests != steps:
        raise RuntimeError(f"the {adapter} session made {server.requests} model calls, not {steps}")
    return server.connections


def _history(messages: int) -> ModelRequest:
    turns: list[UserTurn | AssistantTurn | ToolTurn] = [UserTurn("read the files")]
    while len(turns) < messages:
        n = len(turns)
        call = ToolCallChunk(f"c{n}", "read", f'{{"path": "src/file_{n}.py"}}')
        turns.append(AssistantTurn("Reading.", [call]))
        turns.append(ToolTurn(f"c{n}", "x = 1\n" * 40))
    return ModelRequest(messages=turns[:messages], system="You are terse.")


def _build(messages: int, calls: int) -> tuple[float, float]:
    """Median microseconds of one request build, and of encoding the built body alone."""
    model = AnthropicModel("https://api.example.com", _KEY, "claude-bench")
    request = _history(messages)
    built = model.body(request)
    ours: list[float] = []
    raw: list[float] = []
    for _ in range(calls):
        t0 = time.perf_counter()
        msgspec.json.encode(model.body(request))
        t1 = time.perf_counter()
        msgspec.json.encode(built)
        raw.append(time.perf_counter() - t1)
        ours.append(t1 - t0)
    return statistics.median(ours) * 1e6, statistics.median(raw) * 1e6


#: Events in each reply whose reading is timed.
_EVENTS = 2_000
_WORD = " word"


def _replies() -> dict[str, tuple[HttpModel, list[bytes]]]:
    """Per adapter: the adapter, and a text reply of `_EVENTS` events in its wire format."""
    chat = sse(
        oai({"role": "assistant", "content": ""}),
        *[oai({"content": _WORD}) for _ in range(_EVENTS - 4)],
        oai(finish="stop"),
        oai_usage(1200, _EVENTS),
        "[DONE]",
    )
    anthropic = sse(
        ant_start(),
        ant_block(0, {"type": "text", "text": ""}),
        *[ant_delta(0, {"type": "text_delta", "text": _WORD}) for _ in range(_EVENTS - 5)],
        ant_stop_block(0),
        *ant_end("end_turn"),
    )
    responses = rsp(*rsp_created(), *rsp_message(0, [_WORD] * (_EVENTS - 8)), rsp_end())
    gemini = gem_sse(
        *[gem([{"text": _WORD}]) for _ in range(_EVENTS - 1)], gem([{"text": _WORD}], "STOP")
    )
    url = "https://api.example.com"
    return {
        "chat completions": (OpenAIChatModel(url, _KEY, "gpt-bench"), chat),
        "deepseek": (DeepSeekModel(url, _KEY, "deepseek-bench"), chat),
        "anthropic": (AnthropicModel(url, _KEY, "claude-bench"), anthropic),
        "responses": (OpenAIResponsesModel(url, _KEY, "gpt-bench"), responses),
        "gemini": (GeminiModel(url, _KEY, "gemini-bench"), gemini),
    }


async def _split(pieces: list[bytes]) -> list[SseEvent]:
    split = [event async for event in events(pieces)]
    if len(split) != _EVENTS:
        raise RuntimeError(f"a reply of {len(split)} events, not {_EVENTS}")
    return split


async def _read_once(model: HttpModel, split: list[SseEvent]) -> float:
    async def feed() -> AsyncIterator[SseEvent]:
        for event in split:
            yield event

    t0 = time.perf_counter()
    async for _ in model._chunks(feed()):
        pass
    return time.perf_counter() - t0


async def _parse_costs(rounds: int) -> dict[str, float]:
    """Microseconds per event of each adapter's reader: the median of `rounds` reads, the
    adapters taken in turn within each round."""
    replies = {name: (model, await _split(pieces)) for name, (model, pieces) in _replies().items()}
    for model, split in replies.values():
        await _read_once(model, split)  # warm: the first read of each pays for imports, caches
    took: dict[str, list[float]] = {name: [] for name in replies}
    for _ in range(rounds):
        for name, (model, split) in replies.items():
            took[name].append(await _read_once(model, split))
    return {name: statistics.median(times) / _EVENTS * 1e6 for name, times in took.items()}


def run(repeats: int, quick: bool) -> list[Row]:
    steps = 20 if quick else 200
    session = 20 if quick else 100
    ours, raw, fresh = [], [], []
    connections: dict[str, list[float]] = {adapter: [] for adapter in _SESSIONS}
    for _ in range(repeats):
        o, r, f = trio.run(_ttft, steps)
        ours.append(o)
        raw.append(r)
        fresh.append(f)
        for adapter, counts in connections.items():
            counts.append(float(trio.run(_session_connections, adapter, session)))
    rows = [
        compare(
            SCENARIO,
            f"time to first token, steps 2..{steps} over TLS (pooled)",
            "us",
            ours,
            baseline="a raw pooled httpx2 client, the same request bytes",
            raw=raw,
            max_ratio=1.1,
            note="ours builds and encodes the request each step; loopback, HTTP/1.1",
        ),
        compare(
            SCENARIO,
            f"time to first token, steps 2..{steps}, a client per call (before the pool)",
            "us",
            fresh,
            baseline="a raw pooled httpx2 client, the same request bytes",
            raw=raw,
            note="each step a TCP connect, a TLS handshake and a TLS context",
        ),
    ]
    rows += [
        compare(
            SCENARIO,
            f"connections opened by a {session}-step session, {adapter}",
            "connections",
            counts,
            max_value=1,
        )
        for adapter, counts in connections.items()
    ]
    calls = 21 if quick else 201
    for messages in (10, 100, 1000):
        build = [_build(messages, calls) for _ in range(repeats)]
        rows.append(
            compare(
                SCENARIO,
                f"request build (body + encode), {messages} messages",
                "us",
                [b[0] for b in build],
                baseline="encoding the built body alone",
                raw=[b[1] for b in build],
                note="linear in the history; compaction bounds the history",
            )
        )
    costs = [trio.run(_parse_costs, 3 if quick else 15) for _ in range(repeats)]
    for name in costs[0]:
        if name == "chat completions":
            continue
        rows.append(
            compare(
                SCENARIO,
                f"parse cost per event, {name}, a {_EVENTS:,}-event text reply",
                "us",
                [cost[name] for cost in costs],
                baseline="the Chat Completions adapter's reader, its own 2,000 events",
                raw=[cost["chat completions"] for cost in costs],
                max_ratio=1.5,
                note="the events already split; each reader decodes every event's JSON",
            )
        )
    return rows
