"""Prompts of content blocks: images and embedded resources, from `send` to each wire format,
their blobs kept beside the log (side files, a PostgreSQL table) and read back."""

from __future__ import annotations

import base64
import hashlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import trio

from greenroom import Image, Resource, Text, open_runtime
from greenroom.acp.prompts import LINK_BYTES
from greenroom.cli import main
from greenroom.models.anthropic import AnthropicModel
from greenroom.models.openai import OpenAIChatModel
from greenroom.models.parts import takes_images
from greenroom.protocol.content import MAX_IMAGE_BYTES, ImageRef, ResourceRef
from greenroom.protocol.events import Errored, TurnEnd, UserMessage
from greenroom.protocol.model import Finish, ModelRequest, StreamChunk, TextDelta, UserTurn
from greenroom.session.persistence import JsonlPersistence, SqlitePersistence
from greenroom.session.transcript import transcript
from tests.acp_peer import Bridge, bridge
from tests.models.test_adapters import KEY, LIMIT, STREAMS
from tests.sse_server import Served, client_tls
from tests.sse_server import sse_server as tls_server

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
        async with tls_server([Served(pieces=STREAMS[kind]["text"])], tls=True) as server:
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
        async with tls_server([Served(pieces=STREAMS[kind]["text"])], tls=True) as server:
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
            [Text("a"), Image("iVBORw0KGgo=", "image/png")],  # type: ignore[arg-type]
            TypeError,
            "content block 1: the image's data must be bytes (not base64 text), got str",
        ),
        (
            [Resource("file:///x", blob="AAEC", mime_type="application/pdf")],  # type: ignore[arg-type]
            TypeError,
            "content block 0: the blob's data must be bytes (not base64 text), got str",
        ),
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
    # The adapters send a marker for it (this file's wire tests show the format).
    (ref,) = [p for p in user_parts(model.requests[0]) if isinstance(p, ImageRef)]
    from greenroom.models.parts import Encoded, wire_parts

    first = model.requests[0].messages[0]
    assert isinstance(first, UserTurn)
    wire = list(wire_parts(first, model.requests[0].blobs, Encoded(), True, "m", False))
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
        side = Path(store.blob_dir("s"))
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


# -- over ACP ---------------------------------------------------------------------------------


def image_block(data: bytes = PNG, mime: str = "image/png") -> dict[str, object]:
    return {"type": "image", "data": base64.b64encode(data).decode(), "mimeType": mime}


async def acp_prompt(b: Bridge, session: str, prompt: list[dict[str, object]]) -> dict[str, object]:
    return await b.peer.call("session/prompt", {"sessionId": session, "prompt": prompt})


async def test_acp_says_it_takes_images_and_embedded_context(tmp_path: Path) -> None:
    async with bridge(tmp_path, Recorder()) as b:
        answer = await b.peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    capabilities = answer["result"]["agentCapabilities"]["promptCapabilities"]
    assert capabilities == {"image": True, "audio": False, "embeddedContext": True}


async def test_acp_image_and_resource_blocks_reach_the_model(tmp_path: Path) -> None:
    model = Recorder()
    pdf = b"%PDF-1.4"
    async with bridge(tmp_path, model) as b:
        session = await b.peer.new_session(str(tmp_path))
        prompt = [
            {"type": "text", "text": "look"},
            image_block(),
            {"type": "resource", "resource": {"uri": "file:///w/a.md", "text": "# a"}},
            {
                "type": "resource",
                "resource": {
                    "uri": "file:///w/a.pdf",
                    "mimeType": "application/pdf",
                    "blob": base64.b64encode(pdf).decode(),
                },
            },
        ]
        answer = await acp_prompt(b, session, prompt)
    assert answer["result"]["stopReason"] == "end_turn"
    (request,) = model.requests
    assert user_parts(request) == [
        Text("look"),
        ImageRef("image/png", DIGEST, len(PNG)),
        Resource("file:///w/a.md", text="# a"),
        ResourceRef("file:///w/a.pdf", "application/pdf", hashlib.sha256(pdf).hexdigest(), 8),
    ]
    assert request.blobs[DIGEST] == PNG


@pytest.mark.parametrize(
    ("block", "words"),
    [
        (
            image_block(b"x" * (MAX_IMAGE_BYTES + 3)),
            f"prompt[1]: the image is {MAX_IMAGE_BYTES + 3:,} bytes, over the limit of"
            f" {MAX_IMAGE_BYTES:,} bytes",
        ),
        (
            image_block(b"x" * (MAX_IMAGE_BYTES + 1)),
            f"prompt[1]: the image is {MAX_IMAGE_BYTES + 1:,} bytes, over the limit of"
            f" {MAX_IMAGE_BYTES:,} bytes",
        ),
        (
            {"type": "image", "data": "not base64!", "mimeType": "image/png"},
            "prompt[1]: the image is not base64",
        ),
        (image_block(mime="image/tiff"), "prompt[1]: image type 'image/tiff' is not one of"),
        (
            {"type": "resource", "resource": {"uri": "file:///x"}},
            "prompt[1]: resource 'file:///x' needs exactly one of text and blob",
        ),
        ({"type": "audio", "data": "", "mimeType": "audio/wav"}, "invalid params"),
    ],
)
async def test_acp_refuses_a_bad_block_naming_it_and_the_limit(
    tmp_path: Path, block: dict[str, object], words: str
) -> None:
    model = Recorder()
    async with bridge(tmp_path, model) as b:
        session = await b.peer.new_session(str(tmp_path))
        answer = await acp_prompt(b, session, [{"type": "text", "text": "see"}, block])
        # The connection goes on: the next prompt is answered.
        after = await acp_prompt(b, session, [{"type": "text", "text": "and now"}])
    assert answer["error"]["code"] == -32602
    assert words in answer["error"]["message"]
    assert after["result"]["stopReason"] == "end_turn"
    assert len(model.requests) == 1


async def test_acp_inlines_a_resource_link_inside_the_roots_only(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.md").write_text("the notes")
    (work / "big.txt").write_text("x" * (LINK_BYTES + 1))
    (tmp_path / "secret.txt").write_text("outside")
    model = Recorder()
    async with bridge(tmp_path / "store", model) as b:
        session = await b.peer.new_session(str(work))

        def link(path: Path) -> dict[str, object]:
            return {"type": "resource_link", "uri": path.as_uri(), "name": path.name}

        await acp_prompt(b, session, [{"type": "text", "text": "read"}, link(work / "notes.md")])
        await acp_prompt(
            b, session, [{"type": "text", "text": "and"}, link(tmp_path / "secret.txt")]
        )
        await acp_prompt(b, session, [{"type": "text", "text": "big"}, link(work / "big.txt")])
    inside, outside, big = model.requests
    assert user_parts(inside) == [
        Text("read"),
        Resource((work / "notes.md").as_uri(), text="the notes"),
    ]
    # Outside the roots (and past the cap): the link as text, the file never read.
    last = outside.messages[-1]
    assert isinstance(last, UserTurn)
    assert last == UserTurn(f"and\n[secret.txt]({(tmp_path / 'secret.txt').as_uri()})")
    assert "outside" not in repr(outside)
    assert big.messages[-1] == UserTurn(f"big\n[big.txt]({(work / 'big.txt').as_uri()})")


async def test_steering_refuses_an_image_naming_it(tmp_path: Path) -> None:
    async with bridge(tmp_path, Recorder()) as b:
        session = await b.peer.new_session(str(tmp_path))
        answer = await b.peer.call(
            "_session/steering",
            {"sessionId": session, "prompt": [{"type": "text", "text": "x"}, image_block()]},
        )
    assert answer["error"]["code"] == -32602
    assert "prompt[1]: steering takes text" in answer["error"]["message"]


# -- ACP replay with the official SDK client, across two processes ---------------------------


def test_acp_load_replays_the_image_as_an_image_block(tmp_path: Path) -> None:
    import asyncio

    import acp
    from acp import schema

    from tests.acp.test_e2e import Recorder as Client

    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    command = (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0")
    prompt = [
        acp.text_block("what is this?"),
        schema.ImageContentBlock(type="image", data=PNG_B64, mime_type="image/png"),
    ]

    async def first() -> str:
        async with acp.spawn_agent_process(
            Client(), *command, env={"GREENROOM_HOME": str(home)}, cwd=work
        ) as (conn, _):
            await conn.initialize(protocol_version=1)
            session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
            answer = await conn.prompt(session_id=session, prompt=prompt)
            assert answer.stop_reason == "end_turn"
            return session

    async def second(session: str, client: Client) -> None:
        async with acp.spawn_agent_process(
            client, *command, env={"GREENROOM_HOME": str(home)}, cwd=work
        ) as (conn, _):
            await conn.initialize(protocol_version=1)
            await conn.load_session(session_id=session, cwd=str(work), mcp_servers=[])

    async def scenario() -> tuple[Client, Client]:
        session = await asyncio.wait_for(first(), 30)
        loaded = Client()
        await asyncio.wait_for(second(session, loaded), 30)
        blobs = next((home / "sessions").rglob("*.blobs"))
        (blobs / DIGEST).unlink()
        missing = Client()
        await asyncio.wait_for(second(session, missing), 30)
        return loaded, missing

    loaded, missing = asyncio.run(scenario())
    users = [u.content for _, u in loaded.updates if isinstance(u, schema.UserMessageChunk)]
    assert users[0] == schema.TextContentBlock(type="text", text="what is this?")
    assert isinstance(users[1], schema.ImageContentBlock)
    assert users[1].data == PNG_B64
    assert users[1].mime_type == "image/png"
    # The side file gone: a marker, and the load still answered.
    users = [u.content for _, u in missing.updates if isinstance(u, schema.UserMessageChunk)]
    assert isinstance(users[1], schema.TextContentBlock)
    assert "is missing from the session's store" in users[1].text


# -- every store, the command, a fork ---------------------------------------------------------


def test_sessions_show_reads_the_side_files_and_marks_a_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def one() -> None:
        async with open_runtime(model=Recorder(), persistence=JsonlPersistence(tmp_path)) as rt:
            agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
            await agent.run(PROMPT)

    trio.run(one)
    assert main(["sessions", "--store", f"jsonl:{tmp_path}", "show", "s"]) == 0
    shown = capsys.readouterr().out
    assert f"    [image image/png, {len(PNG)} bytes, sha256 {DIGEST[:12]}]" in shown
    (tmp_path / "s.blobs" / DIGEST).unlink()
    assert main(["sessions", "--store", f"jsonl:{tmp_path}", "show", "s"]) == 0
    shown = capsys.readouterr().out
    assert "    what is in this picture?" in shown
    assert f"sha256 {DIGEST[:12]}) is missing from the session's store]" in shown


async def test_a_fork_carries_the_prompts_blobs(tmp_path: Path) -> None:
    async with open_runtime(model=Recorder(), persistence=JsonlPersistence(tmp_path)) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        await agent.run(PROMPT)
        await rt.agents.fork("s", "copy")
    assert (tmp_path / "copy.blobs" / DIGEST).read_bytes() == PNG
    await JsonlPersistence(tmp_path).delete("s")
    assert not (tmp_path / "s.blobs").exists()
    model = Recorder()
    async with open_runtime(model=model, persistence=JsonlPersistence(tmp_path)) as rt:
        forked = (await rt.agents.resume(agent_id="a", session_id="copy")).agent
        await forked.run("and?")
    assert model.requests[0].blobs == {DIGEST: PNG}


def test_postgres_keeps_blobs_in_a_table(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import psycopg

    from greenroom.session.persistence.postgres import PostgresPersistence

    model = Recorder()

    async def scenario() -> None:
        store = PostgresPersistence(postgres_dsn)
        try:
            async with open_runtime(model=Recorder(), persistence=store) as rt:
                agent = (await rt.agents.create(agent_id="a", session_id="pg")).agent
                await agent.run(PROMPT)
            assert await store.read_blobs("pg", [DIGEST, "0" * 64]) == {DIGEST: PNG}
            async with open_runtime(model=model, persistence=store) as rt:
                resumed = (await rt.agents.resume(agent_id="a", session_id="pg")).agent
                await resumed.run("again")
        finally:
            store.close()

    trio.run(scenario)
    assert model.requests[0].blobs == {DIGEST: PNG}
    assert main(["sessions", "--store", postgres_dsn, "show", "pg"]) == 0
    assert f"[image image/png, {len(PNG)} bytes, sha256 {DIGEST[:12]}]" in capsys.readouterr().out

    async def delete() -> None:
        store = PostgresPersistence(postgres_dsn)
        try:
            await store.delete("pg")
        finally:
            store.close()

    trio.run(delete)
    with psycopg.connect(postgres_dsn) as db:
        assert db.execute("SELECT count(*) FROM greenroom_blobs").fetchone() == (0,)


def test_an_adapter_encodes_an_image_once_for_every_step() -> None:
    from greenroom.models.parts import Encoded

    encoded = Encoded()
    first = encoded.of(DIGEST, PNG)
    assert first == PNG_B64
    assert encoded.of(DIGEST, PNG) is first  # the next step's request reuses it


async def test_a_turn_a_crash_cut_is_carried_on_with_its_image(tmp_path: Path) -> None:
    from greenroom.protocol.events import USER, MessageTrigger, TurnStart
    from greenroom.session import new_header

    store = JsonlPersistence(tmp_path)
    log = await store.create(new_header("s"))
    parts = [Text(TEXT_OF_PROMPT), ImageRef("image/png", DIGEST, len(PNG))]
    await log.put_blobs({DIGEST: PNG})
    for seq, event in enumerate(
        [
            TurnStart(turn=1, trigger=MessageTrigger(USER)),
            UserMessage(content=TEXT_OF_PROMPT, source=USER, message_id="m-1", parts=parts),
        ]
    ):
        msgspec.structs.force_setattr(event, "seq", seq)
        log.append(event)
    await log.close()  # no turn/end: as a crash leaves it
    model = Recorder()
    async with open_runtime(model=model, persistence=store) as rt:
        handle = await rt.agents.resume(agent_id="a", session_id="s", interrupted="continue")
        assert handle.resumed is not None
        with trio.fail_after(10):
            answer = await handle.resumed
    assert answer.stop_reason == "completed"
    (request,) = model.requests
    assert user_parts(request) == parts
    assert request.blobs == {DIGEST: PNG}


TEXT_OF_PROMPT = "what is in this picture?"
