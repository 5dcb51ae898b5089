"""Prompts of content blocks: images and embedded resources, from `send` to each wire format,
their blobs kept beside the log (side files, a PostgreSQL table) and read back."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from greenroom import open_runtime
from greenroom.models.anthropic import AnthropicModel
from greenroom.models.openai import OpenAIChatModel
from greenroom.models.parts import takes_images
from greenroom.protocol.content import (
    MAX_IMAGE_BYTES,
    Image,
    ImageRef,
    Resource,
    ResourceRef,
    Text,
)
from greenroom.protocol.events import Errored, TurnEnd, UserMessage
from greenroom.protocol.model import Finish, ModelRequest, StreamChunk, TextDelta, UserTurn
from greenroom.session.persistence import JsonlPersistence, SqlitePersistence
from greenroom.session.transcript import transcript
from tests.sse_server import Reply, client_tls
from tests.sse_server import sse_server as tls_server
from tests.test_model_adapters import KEY, LIMIT, STREAMS

#: A 1x1 PNG, and bytes standing for a bigger one.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg=="
)
PNG_B64 = base64.b64encode(PNG).decode()
DIGEST = hashlib.sha256(PNG).hexdigest()
PROMPT = [
    Text("what is in this picture?"),
    Image(PNG, "image/png"),
    Resource("file:///w/notes.md", text="# notes\nthe cat is grey"),
]


class Recorder:
    """A model that answers "ok" and keeps every request it was sent."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        self.requests.append(request)
        yield TextDelta("ok")
        yield Finish("stop")


def user_parts(request: ModelRequest) -> list[object]:
    return [part for m in request.messages if isinstance(m, UserTurn) for part in m.parts]


# -- the wire formats -----------------------------------------------------------------------


@pytest.mark.real_clock
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_an_image_prompt_reaches_both_formats(kind: str) -> None:
    with trio.fail_after(LIMIT):
        async with tls_server([Reply(pieces=STREAMS[kind]["text"])], tls=True) as server:
            model: OpenAIChatModel | AnthropicModel
            if kind == "openai":
                model = OpenAIChatModel(server.url + "/v1", KEY, "gpt-4o", verify=client_tls())
            else:
                model = AnthropicModel(server.url, KEY, "claude-sonnet-4-5", verify=client_tls())
            async with open_runtime(model=model) as rt:
                agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
                answer = await agent.run(PROMPT)
    assert answer.stop_reason == "completed", answer
    (seen,) = server.requests
    user = seen.body["messages"][-1]
    assert user["role"] == "user"
    resource = '<resource uri="file:///w/notes.md">\n# notes\nthe cat is grey\n</resource>'
    if kind == "openai":
        assert user["content"] == [
            {"type": "text", "text": "what is in this picture?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
            {"type": "text", "text": resource},
        ]
    else:
        image = {"type": "base64", "media_type": "image/png", "data": PNG_B64}
        content = [
            {k: v for k, v in block.items() if k != "cache_control"} for block in user["content"]
        ]
        assert content == [
            {"type": "text", "text": "what is in this picture?"},
            {"type": "image", "source": image},
            {"type": "text", "text": resource},
        ]


@pytest.mark.real_clock
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_text_only_model_refuses_an_image_before_any_request(kind: str) -> None:
    with trio.fail_after(LIMIT):
        async with tls_server([Reply(pieces=STREAMS[kind]["text"])], tls=True) as server:
            model: OpenAIChatModel | AnthropicModel
            if kind == "openai":
                model = OpenAIChatModel(
                    server.url + "/v1", KEY, "gpt-4o", verify=client_tls(), images=False
                )
            else:
                model = AnthropicModel(
                    server.url, KEY, "claude-sonnet-4-5", verify=client_tls(), images=False
                )
            async with open_runtime(model=model) as rt:
                agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
                refused = await agent.run(PROMPT)
                assert server.requests == []
                # The image stays in the log; the next prompt is sent, the image left out.
                answered = await agent.run("and now?")
    assert refused.stop_reason == "error"
    name = "gpt-4o" if kind == "openai" else "claude-sonnet-4-5"
    assert refused.reason is not None
    assert f"model {name!r} takes text only" in refused.reason
    assert "content block 1 of the prompt is an image (image/png)" in refused.reason
    assert answered.stop_reason == "completed"
    (seen,) = server.requests
    assert PNG_B64 not in seen.raw.decode()
    assert f"an image (image/png) was left out: {name} takes text only" in seen.raw.decode()


def test_text_only_families() -> None:
    assert takes_images("gpt-4o-mini")
    assert takes_images("claude-sonnet-4-5")
    assert not takes_images("gpt-3.5-turbo")
    assert not takes_images("gpt-4-0613")
    assert not takes_images("o3-mini")
    assert takes_images("o3")
    assert takes_images("llama3.2-vision")  # no family listed: the server decides


# -- send ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blocks", "error", "words"),
    [
        ([], ValueError, "at least one block"),
        ([Text("a"), "b"], TypeError, "content block 1: expected Text, Image or Resource, got str"),
        ([Text("  ")], ValueError, "content block 0: the text is empty"),
        ([Image(PNG, "image/bmp")], ValueError, "content block 0: image type 'image/bmp'"),
        ([Resource("file:///x")], ValueError, "needs exactly one of text and blob"),
        ([Resource("file:///x", blob=b"1")], ValueError, "needs its mime_type"),
        (
            [Text("a"), Image(b"x" * (MAX_IMAGE_BYTES + 1), "image/png")],
            ValueError,
            f"content block 1: the image is {MAX_IMAGE_BYTES + 1:,} bytes, over the limit of"
            f" {MAX_IMAGE_BYTES:,} bytes",
        ),
        (
            [Image(b"x" * MAX_IMAGE_BYTES, "image/png")] * 4 + [Text("a")],
            ValueError,
            "content block 4: the prompt's blocks pass the limit of 20,971,520 bytes in all",
        ),
    ],
)
async def test_bad_blocks_are_refused_naming_the_block(
    blocks: list[object], error: type[Exception], words: str
) -> None:
    async with open_runtime(model=Recorder()) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        with pytest.raises(error, match=None) as raised:
            agent.send(blocks)  # type: ignore[arg-type]
        assert words in str(raised.value)
        assert "agent 'a'" in str(raised.value)
        assert agent.inbox.queued == 0
        assert not any(isinstance(e, UserMessage) for e in agent.session.events)


async def test_send_str_is_unchanged() -> None:
    model = Recorder()
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        await agent.run("hello")
    (message,) = [e for e in agent.session.events if isinstance(e, UserMessage)]
    assert message.content == "hello"
    assert message.parts == []
    assert model.requests[0].messages[0] == UserTurn("hello")


# -- the log and its side files --------------------------------------------------------------


async def test_the_log_points_at_side_files_and_a_resume_reads_them(tmp_path: Path) -> None:
    blob = b"%PDF-1.4 binary" * 100
    blob_digest = hashlib.sha256(blob).hexdigest()
    prompt = [*PROMPT, Resource("file:///w/a.pdf", blob=blob, mime_type="application/pdf")]
    model = Recorder()
    async with open_runtime(model=model, persistence=JsonlPersistence(tmp_path)) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        await agent.run(prompt)
    log = (tmp_path / "s.jsonl").read_bytes()
    assert PNG_B64.encode() not in log
    assert b"PDF" not in log
    side = tmp_path / "s.blobs"
    assert (side / DIGEST).read_bytes() == PNG
    assert (side / blob_digest).read_bytes() == blob
    (message,) = [e for e in agent.session.events if isinstance(e, UserMessage)]
    assert message.content == "what is in this picture?"
    assert message.parts == [
        Text("what is in this picture?"),
        ImageRef("image/png", DIGEST, len(PNG)),
        PROMPT[2],
        ResourceRef("file:///w/a.pdf", "application/pdf", blob_digest, len(blob)),
    ]
    assert model.requests[0].blobs == {DIGEST: PNG, blob_digest: blob}

    model = Recorder()
    async with open_runtime(model=model, persistence=JsonlPersistence(tmp_path)) as rt:
        agent = (await rt.agents.create(agent_id="b", session_id="t")).agent
        resumed = (await rt.agents.resume(agent_id="a", session_id="s")).agent
        await resumed.run("and the pdf?")
    (request,) = model.requests
    assert request.blobs == {DIGEST: PNG, blob_digest: blob}  # read back from the side files
    assert user_parts(request)[:4] == message.parts

    lines = list(transcript(*await JsonlPersistence(tmp_path).load("s")))
    text = "\n".join(lines)
    assert f"[image image/png, {len(PNG)} bytes, sha256 {DIGEST[:12]}]" in text
    assert "[resource file:///w/notes.md: 23 characters]" in text


async def test_a_missing_side_file_is_a_marker_not_a_crash(tmp_path: Path) -> None:
    async with open_runtime(model=Recorder(), persistence=JsonlPersistence(tmp_path)) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        await agent.run(PROMPT)
    (tmp_path / "s.blobs" / DIGEST).unlink()
    model = Recorder()
    async with open_runtime(model=model, persistence=JsonlPersistence(tmp_path)) as rt:
        resumed = (await rt.agents.resume(agent_id="a", session_id="s")).agent
        answer = await resumed.run("still there?")
    assert answer.stop_reason == "completed"
    assert DIGEST not in model.requests[0].blobs
    # The adapters send a marker for it (tests/test_content.py's wire tests show the format).
    (ref,) = [p for p in user_parts(model.requests[0]) if isinstance(p, ImageRef)]
    from greenroom.models.parts import wire_parts

    first = model.requests[0].messages[0]
    assert isinstance(first, UserTurn)
    wire = list(wire_parts(first, model.requests[0].blobs, True, "m", False))
    assert wire[1] == (
        f"[image (image/png, {len(PNG)} bytes, sha256 {DIGEST[:12]}) is missing from the"
        " session's store]"
    )
    assert ref.sha256 == DIGEST


async def test_sqlite_keeps_blobs_beside_the_database_and_delete_removes_them(
    tmp_path: Path,
) -> None:
    store = SqlitePersistence(tmp_path / "db.sqlite")
    try:
        async with open_runtime(model=Recorder(), persistence=store) as rt:
            agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
            await agent.run(PROMPT)
        side = store.blob_dir("s")
        assert side.parent == tmp_path / "db.sqlite.blobs"
        assert (side / DIGEST).read_bytes() == PNG
        assert await store.read_blobs("s", [DIGEST, "0" * 64]) == {DIGEST: PNG}
        model = Recorder()
        async with open_runtime(model=model, persistence=store) as rt:
            resumed = (await rt.agents.resume(agent_id="a", session_id="s")).agent
            await resumed.run("again")
        assert model.requests[0].blobs == {DIGEST: PNG}
        await store.delete("s")
        assert not side.exists()
    finally:
        store.close()


async def test_a_blob_store_failure_fails_the_turn_and_keeps_the_prompt(tmp_path: Path) -> None:
    (tmp_path / "s.blobs").write_text("a file where the directory goes")
    async with open_runtime(model=Recorder(), persistence=JsonlPersistence(tmp_path)) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        answer = await agent.run(PROMPT)
    assert answer.stop_reason == "error"
    assert answer.reason is not None
    assert "cannot store a blob" in answer.reason
    events = agent.session.events
    assert any(isinstance(e, UserMessage) and e.parts for e in events)
    end = [e for e in events if isinstance(e, TurnEnd)][-1]
    assert isinstance(end.reason, Errored)
