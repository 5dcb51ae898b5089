"""Every request greenroom sends the ACP client is settled exactly once, and its tool goes on.

By its reply; by a reply that could not be read (nested too deep to decode, or a
line over the reader's limit, its id anywhere in it, found by a scan); by a cancel
or the connection's end; and, for ``fs/*`` only, by a deadline. In-process: the
bridge on memory streams, the client a `Peer` writing raw frames, virtual time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.acp import serve_connection
from greenroom.acp.client import FILES_DEADLINE
from greenroom.acp.frames import MAX_FRAME
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import ToolResult
from greenroom.runtime import Runtime
from greenroom.session.persistence import JsonlPersistence
from greenroom.tools.ask import ask_plugin
from greenroom.tools.files import files_plugin
from tests.acp_peer import Peer

CAPABILITIES = {
    "fs": {"readTextFile": True, "writeTextFile": True},
    "elicitation": {"form": {}},
}
PROMPT = [{"type": "text", "text": "go"}]


@asynccontextmanager
async def connected(root: Path, model: ScriptedModel) -> AsyncIterator[tuple[Runtime, Peer]]:
    """A runtime with the file tools and ``ask_user``, serving a `Peer` that offers the
    editor's files and questions."""
    async with open_runtime(
        model=model, persistence=JsonlPersistence(root / "sessions"), workdir=str(root)
    ) as runtime:
        await runtime.plug("tool-files", files_plugin)
        await runtime.plug("tool-ask", ask_plugin)
        client, server = trio.testing.memory_stream_pair()
        peer = Peer(client)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.read_loop)
            served = trio.Event()

            async def serve() -> None:
                try:
                    await serve_connection(runtime, server)
                finally:
                    served.set()

            nursery.start_soon(serve)
            await peer.call(
                "initialize", {"protocolVersion": 1, "clientCapabilities": CAPABILITIES}
            )
            yield runtime, peer
            await peer.close()
            await served.wait()
            nursery.cancel_scope.cancel()


def deep_reply(request_id: str) -> bytes:
    """A reply nested 5,000 levels deep (msgspec reads about 1,000), its id last."""
    nesting = b"[" * 5000 + b"]" * 5000
    end = json.dumps(request_id).encode()
    return b'{"jsonrpc":"2.0","result":{"outcome":%s},"id":%s}\n' % (nesting, end)


def huge_reply(request_id: str) -> bytes:
    """A reply one line past the reader's limit, its id last: past its first 4 KiB."""
    end = json.dumps(request_id).encode()
    return b'{"jsonrpc":"2.0","result":{"content":"%s"},"id":%s}\n' % (b"x" * MAX_FRAME, end)


Reply = Callable[[str], bytes]
#: Each kind of request: the call that makes it, the method, and what its tool says.
ASKS = {
    "permission": (
        CallTool("write_file", {"path": "a.txt", "content": "new"}),
        "session/request_permission",
        "write_file was not run: asking permission failed: session/request_permission: ",
    ),
    "question": (
        CallTool("ask_user", {"question": "Which?", "choices": ["red", "blue"]}),
        "elicitation/create",
        "ask_user failed: ClientError: elicitation/create: ",
    ),
    "file": (
        CallTool("read_file", {"path": "a.txt"}),
        "fs/read_text_file",
        "read_file failed: ClientError: fs/read_text_file: ",
    ),
}


@pytest.mark.parametrize("asked", list(ASKS))
@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (deep_reply, "the client's reply is nested too deep to decode"),
        (huge_reply, f"the client's reply is a frame longer than {MAX_FRAME:,} bytes"),
    ],
)
async def test_a_reply_that_cannot_be_read_fails_its_request_once_and_the_turn_goes_on(
    tmp_path: Path, asked: str, reply: Reply, why: str
) -> None:
    """A reply nested too deep answered with an error frame, and one over the limit whose
    id lay past its first 4 KiB dropped: either way the request waited on, its tool call
    hung until a cancel."""
    call, method, said = ASKS[asked]
    (tmp_path / "a.txt").write_text("old")
    requests: list[dict[str, Any]] = []

    async def unreadable(request: dict[str, Any]) -> dict[str, Any]:
        requests.append(request)
        await peer.send_raw(reply(request["id"]))
        # Then a reply that can be read: too late, the request was settled.
        late = {"jsonrpc": "2.0", "id": request["id"], "result": {}}
        await peer.send_raw(json.dumps(late).encode() + b"\n")
        await trio.sleep_forever()

    model = ScriptedModel([[call], [Say("after")]], delay=0)
    async with connected(tmp_path, model) as (runtime, peer):
        peer.answer = unreadable
        session = await peer.new_session(str(tmp_path))
        with trio.fail_after(60):
            answer = await peer.call("session/prompt", {"sessionId": session, "prompt": PROMPT})
        assert answer["result"] == {"stopReason": "end_turn"}
        events = runtime.sessions.get(session).events  # type: ignore[union-attr]
    (request,) = requests
    assert request["method"] == method
    (result,) = [e for e in events if isinstance(e, ToolResult)]
    assert result.is_error
    assert result.content.startswith(said + why), result.content
    assert "after" in "".join(
        u["content"]["text"]
        for u in peer.updates(session)
        if u["sessionUpdate"] == "agent_message_chunk"
    )
    # The reply was not answered as if the client had asked something, nor withdrawn.
    assert not [f for f in peer.frames if "error" in f and f.get("id") in (None, request["id"])]
    assert not [f for f in peer.frames if f.get("method") == "$/cancel_request"]
    assert (tmp_path / "a.txt").read_text() == "old"


async def test_a_file_request_the_client_never_answers_fails_after_its_deadline(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.txt").write_text("old")
    asked_at: list[float] = []

    async def never(request: dict[str, Any]) -> dict[str, Any]:
        asked_at.append(trio.current_time())
        await trio.sleep_forever()

    model = ScriptedModel([[CallTool("read_file", {"path": "a.txt"})], [Say("after")]], delay=0)
    async with connected(tmp_path, model) as (runtime, peer):
        peer.answer = never
        session = await peer.new_session(str(tmp_path))
        answer = await peer.call("session/prompt", {"sessionId": session, "prompt": PROMPT})
        answered_at = trio.current_time()
        assert answer["result"] == {"stopReason": "end_turn"}
        events = runtime.sessions.get(session).events  # type: ignore[union-attr]
    (result,) = [e for e in events if isinstance(e, ToolResult)]
    assert result.is_error
    assert f"fs/read_text_file: the client did not answer within {FILES_DEADLINE:g} s" in (
        result.content
    )
    assert answered_at - asked_at[0] == pytest.approx(FILES_DEADLINE, abs=1)
    (request,) = [f for f in peer.frames if f.get("method") == "fs/read_text_file"]
    withdrawn = [f for f in peer.frames if f.get("method") == "$/cancel_request"]
    assert [f["params"] for f in withdrawn] == [{"requestId": request["id"]}]


@pytest.mark.parametrize("asked", ["permission", "question"])
async def test_a_person_is_waited_for_without_a_deadline(tmp_path: Path, asked: str) -> None:
    call, method, _ = ASKS[asked]

    async def after_ten_minutes(request: dict[str, Any]) -> dict[str, Any]:
        if request["method"] == "fs/read_text_file":
            return {"content": "old"}
        if request["method"] == "fs/write_text_file":
            return {}
        await trio.sleep(600)
        if method == "elicitation/create":
            return {"action": "accept", "content": {"answer": "blue"}}
        return {"outcome": {"outcome": "selected", "optionId": "allow_once"}}

    model = ScriptedModel([[call], [Say("after")]], delay=0)
    async with connected(tmp_path, model) as (runtime, peer):
        peer.answer = after_ten_minutes
        session = await peer.new_session(str(tmp_path))
        answer = await peer.call("session/prompt", {"sessionId": session, "prompt": PROMPT})
        assert answer["result"] == {"stopReason": "end_turn"}
        events = runtime.sessions.get(session).events  # type: ignore[union-attr]
    (result,) = [e for e in events if isinstance(e, ToolResult)]
    assert not result.is_error, result.content
    assert not [f for f in peer.frames if f.get("method") == "$/cancel_request"]
