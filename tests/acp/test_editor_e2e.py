"""An editor's view of greenroom, end to end: ``greenroom acp`` as a real subprocess, the
official ACP Python SDK as the client, loopback model servers speaking the OpenAI and
Anthropic wire formats.

Permission (allow once, allow always, reject, a cancel and a disconnect while asking),
the modes, the model as a config option switched between two steps, edits through the
editor's files, a path escape, and a session that was never prompted, loaded after a
restart. The SDK parses every frame greenroom sends with its schema models. These are
plain (non-Trio) tests running an asyncio loop; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import acp
import pytest
from acp import schema

from tests.model_servers import model_server
from tests.sse_server import Served, SseServer
from tests.wire import anthropic_text, openai_text, openai_tool

LIMIT = 30.0
OPENAI = "openai:gpt-test"
ANTHROPIC = "anthropic:claude-test"

Decide = Callable[["Editor", schema.ToolCallUpdate], Awaitable[schema.RequestPermissionResponse]]


def allow(option: str) -> Decide:
    async def decide(editor: Editor, call: schema.ToolCallUpdate) -> Any:
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(outcome="selected", option_id=option)
        )

    return decide


class Editor:
    """The client: records updates and permission questions, answers them, serves a buffer."""

    def __init__(self, decide: Decide | None = None) -> None:
        self.decide = decide or allow("allow_once")
        self.updates: list[Any] = []
        self.asked: list[schema.ToolCallUpdate] = []
        self.buffers: dict[str, str] = {}
        self.conn: Any = None
        self.session = ""

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    async def request_permission(
        self, session_id: str, tool_call: schema.ToolCallUpdate, options: Any, **kwargs: Any
    ) -> schema.RequestPermissionResponse:
        assert {o.kind for o in options} == {
            "allow_once",
            "allow_always",
            "reject_once",
            "reject_always",
        }
        self.asked.append(tool_call)
        return await self.decide(self, tool_call)

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> schema.ReadTextFileResponse:
        return schema.ReadTextFileResponse(content=self.buffers[path])

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> schema.WriteTextFileResponse:
        self.buffers[path] = content
        return schema.WriteTextFileResponse()

    def statuses(self, call_id: str) -> list[str]:
        return [
            u.status
            for u in self.updates
            if isinstance(u, schema.ToolCallStart | schema.ToolCallProgress)
            and u.tool_call_id == call_id
        ]

    def text(self) -> str:
        return "".join(
            u.content.text for u in self.updates if isinstance(u, schema.AgentMessageChunk)
        )


@contextmanager
def servers(
    openai: list[Served], anthropic: list[Served] | None = None
) -> Iterator[tuple[SseServer, SseServer]]:
    with ExitStack() as stack:
        first = stack.enter_context(model_server(openai))
        second = stack.enter_context(model_server(anthropic or []))
        yield first, second


def _env(home: Path, first: SseServer, second: SseServer) -> dict[str, str]:
    return {
        "GREENROOM_HOME": str(home),
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": first.url,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "ANTHROPIC_BASE_URL": second.url,
    }


@contextmanager
def workspace(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    yield home, work


async def _session(
    editor: Editor,
    home: Path,
    work: Path,
    first: SseServer,
    second: SseServer,
    body: Callable[[Any, str], Awaitable[None]],
    *,
    files: bool = False,
    load: str | None = None,
) -> int:
    """Run `body(conn, session)` against a fresh ``greenroom acp``; its exit code after."""
    command = (sys.executable, "-m", "greenroom", "acp", "--model", OPENAI, "--model", ANTHROPIC)
    async with acp.spawn_agent_process(
        editor, *command, env=_env(home, first, second), cwd=work
    ) as (conn, process):
        fs = schema.FileSystemCapabilities(read_text_file=files, write_text_file=files)
        await conn.initialize(
            protocol_version=1, client_capabilities=schema.ClientCapabilities(fs=fs)
        )
        if load is None:
            session = (await conn.new_session(cwd=str(work), mcp_servers=[])).session_id
        else:
            session = load
            await conn.load_session(cwd=str(work), session_id=session, mcp_servers=[])
        editor.session = session
        await body(conn, session)
    return await asyncio.wait_for(process.wait(), 10)


def run(scenario: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario, LIMIT))


def text(words: str) -> list[schema.TextContentBlock]:
    return [acp.text_block(words)]


def write(call_id: str, path: str = "a.txt", content: str = "new") -> Served:
    return Served(
        pieces=openai_tool(call_id, "write_file", json.dumps({"path": path, "content": content}))
    )


def says(words: str) -> Served:
    return Served(pieces=openai_text(words))


# -- permission -------------------------------------------------------------------------------


def test_allow_once_asks_runs_and_renders_the_edit(tmp_path: Path) -> None:
    editor = Editor()
    with workspace(tmp_path) as (home, work), servers([write("c1"), says("Written.")]) as (a, b):

        async def body(conn: Any, session: str) -> None:
            answer = await conn.prompt(session_id=session, prompt=text("write a.txt"))
            assert answer.stop_reason == "end_turn"

        assert run(_session(editor, home, work, a, b, body)) == 0
        assert (work / "a.txt").read_text() == "new"
    (asked,) = editor.asked
    assert (asked.tool_call_id, asked.kind, asked.title) == ("c1", "edit", "a.txt")
    assert editor.statuses("c1") == ["pending", "in_progress", "completed"]
    start = next(u for u in editor.updates if isinstance(u, schema.ToolCallStart))
    assert [loc.path for loc in start.locations or []] == [str(work / "a.txt")]  # absolute
    done = [u for u in editor.updates if isinstance(u, schema.ToolCallProgress)][-1]
    diffs = [c for c in done.content or [] if isinstance(c, schema.FileEditToolCallContent)]
    assert [(d.path, d.old_text, d.new_text) for d in diffs] == [(str(work / "a.txt"), None, "new")]
    assert editor.text() == "Written."


def test_allow_always_is_remembered_across_a_restart(tmp_path: Path) -> None:
    editor = Editor(allow("allow_always"))
    replies = [write("c1"), says("one"), write("c2"), says("two")]
    with workspace(tmp_path) as (home, work), servers(replies) as (a, b):

        async def twice(conn: Any, session: str) -> None:
            for words in ("first", "second"):
                answer = await conn.prompt(session_id=session, prompt=text(words))
                assert answer.stop_reason == "end_turn"

        assert run(_session(editor, home, work, a, b, twice)) == 0
        assert [c.tool_call_id for c in editor.asked] == ["c1"]  # the second call was not asked
        a.replies.extend([write("c3"), says("three")])
        later = Editor(allow("reject_once"))

        async def again(conn: Any, session: str) -> None:
            answer = await conn.prompt(session_id=session, prompt=text("third"))
            assert answer.stop_reason == "end_turn"

        assert run(_session(later, home, work, a, b, again, load=editor.session)) == 0
    assert later.asked == []  # "always" outlived the process: it is in the log
    assert later.statuses("c3")[-1] == "completed"


def test_reject_refuses_the_tool_and_the_model_hears_why(tmp_path: Path) -> None:
    editor = Editor(allow("reject_once"))
    with workspace(tmp_path) as (home, work), servers([write("c1"), says("Understood.")]) as (a, b):

        async def body(conn: Any, session: str) -> None:
            answer = await conn.prompt(session_id=session, prompt=text("write a.txt"))
            assert answer.stop_reason == "end_turn"

        assert run(_session(editor, home, work, a, b, body)) == 0
        assert not (work / "a.txt").exists()
        told = a.requests[1].body["messages"][-1]
    assert editor.statuses("c1") == ["pending", "failed"]
    assert told["role"] == "tool"
    assert "refused" in told["content"]


def test_a_cancel_while_asking_answers_cancelled_once_and_the_next_prompt_works(
    tmp_path: Path,
) -> None:
    async def cancel_then_answer(editor: Editor, call: schema.ToolCallUpdate) -> Any:
        await editor.conn.cancel(session_id=editor.session)
        await asyncio.sleep(0.2)  # our cancel arrives first; the agent withdraws its question
        return schema.RequestPermissionResponse(outcome=schema.DeniedOutcome(outcome="cancelled"))

    editor = Editor(cancel_then_answer)
    with workspace(tmp_path) as (home, work), servers([write("c1"), says("Still here.")]) as (a, b):

        async def body(conn: Any, session: str) -> None:
            answer = await conn.prompt(session_id=session, prompt=text("write a.txt"))
            assert answer.stop_reason == "cancelled"
            after = await conn.prompt(session_id=session, prompt=text("are you there?"))
            assert after.stop_reason == "end_turn"

        assert run(_session(editor, home, work, a, b, body)) == 0
        assert not (work / "a.txt").exists()
        told = next(m for m in a.requests[1].body["messages"] if m["role"] == "tool")
    assert editor.statuses("c1") == ["pending", "failed"]  # never in_progress
    assert told["content"].startswith("not run: the turn was cancelled")
    assert editor.text() == "Still here."


def test_a_disconnect_while_asking_parks_the_turn_and_a_new_process_asks_again(
    tmp_path: Path,
) -> None:
    asking = asyncio.Event()

    async def never(editor: Editor, call: schema.ToolCallUpdate) -> Any:
        asking.set()
        await asyncio.sleep(3600)

    editor = Editor(never)
    with workspace(tmp_path) as (home, work), servers([write("c1")]) as (a, b):

        async def body(conn: Any, session: str) -> None:
            prompt = asyncio.create_task(conn.prompt(session_id=session, prompt=text("go")))
            await asyncio.wait_for(asking.wait(), 10)
            prompt.cancel()  # leaving the context closes greenroom's stdin mid-question

        assert run(_session(editor, home, work, a, b, body)) == 0
        assert not (work / "a.txt").exists()
        (log,) = (home / "sessions").glob("*.jsonl")
        lines = log.read_bytes().splitlines()
        # Parked in the log for the session's next holder: the question, and no end.
        assert b'"type":"decision/requested"' in lines[-1]
        last_start = max(i for i, line in enumerate(lines) if b'"type":"turn/start"' in line)
        assert not any(b'"type":"turn/end"' in line for line in lines[last_start:])

        # A new `greenroom acp` loads it: asked again after the load's replay, then on.
        a.replies.append(says("Written."))
        later = Editor()

        async def load(conn: Any, session: str) -> None:
            while "Written." not in later.text():
                await asyncio.sleep(0.05)

        replayed_when_asked: list[bool] = []

        async def check_then_allow(editor: Editor, call: schema.ToolCallUpdate) -> Any:
            replayed_when_asked.append(
                any(isinstance(u, schema.UserMessageChunk) for u in editor.updates)
            )
            return await allow("allow_once")(editor, call)

        later.decide = check_then_allow
        assert run(_session(later, home, work, a, b, load, load=editor.session)) == 0
        assert (work / "a.txt").read_text() == "new"
        # A third load replays what was asked and who answered.
        third = Editor()

        async def look(conn: Any, session: str) -> None:
            pass

        assert run(_session(third, home, work, a, b, look, load=editor.session)) == 0
    assert [c.tool_call_id for c in later.asked] == ["c1"]
    assert replayed_when_asked == [True]
    assert "Asked: permission asked for write_file" in later.text()
    assert "Decided by " not in later.text()  # answered live, not replayed
    assert "Asked: permission asked for write_file" in third.text()
    assert "Decided by client: allow_once" in third.text()
    assert third.asked == []
    assert len(a.requests) == 2  # the model step that asked is not repeated
    assert later.statuses("c1")[-2:] == ["in_progress", "completed"]


# -- modes -------------------------------------------------------------------------------------


def test_each_mode_does_what_it_says(tmp_path: Path) -> None:
    bash = json.dumps({"command": "touch ran", "description": "d"})
    replies = [
        write("c1"),  # read-only: refused, unasked
        says("Cannot."),
        write("c2"),  # accept-edits: runs, unasked
        says("Done."),
        Served(pieces=openai_tool("c3", "bash", bash)),  # accept-edits: sandboxed, unasked
        says("Ran."),
    ]
    editor = Editor()
    with workspace(tmp_path) as (home, work), servers(replies) as (a, b):

        async def body(conn: Any, session: str) -> None:
            await conn.set_session_mode(session_id=session, mode_id="read-only")
            await conn.prompt(session_id=session, prompt=text("write it"))
            assert not (work / "a.txt").exists()
            await conn.set_session_mode(session_id=session, mode_id="accept-edits")
            await conn.prompt(session_id=session, prompt=text("write it now"))
            await conn.prompt(session_id=session, prompt=text("run it"))

        assert run(_session(editor, home, work, a, b, body)) == 0
        assert (work / "a.txt").read_text() == "new"
        assert (work / "ran").exists()
    assert editor.statuses("c1") == ["pending", "failed"]
    assert editor.statuses("c2") == ["pending", "in_progress", "completed"]
    assert editor.asked == []
    modes = [u.current_mode_id for u in editor.updates if isinstance(u, schema.CurrentModeUpdate)]
    assert modes == ["read-only", "accept-edits"]


# -- the model ---------------------------------------------------------------------------------


def test_the_model_config_option_switches_the_model_between_two_steps(tmp_path: Path) -> None:
    async def switch_then_allow(editor: Editor, call: schema.ToolCallUpdate) -> Any:
        answer = await editor.conn.set_config_option(
            config_id="model", session_id=editor.session, value=ANTHROPIC
        )
        model = next(o for o in answer.config_options if o.root.id == "model")
        assert model.root.current_value == ANTHROPIC
        return await allow("allow_once")(editor, call)

    editor = Editor(switch_then_allow)
    claude = [Served(pieces=anthropic_text("From the second model."))]
    with workspace(tmp_path) as (home, work), servers([write("c1")], claude) as (a, b):

        async def body(conn: Any, session: str) -> None:
            answer = await conn.prompt(session_id=session, prompt=text("write, then switch"))
            assert answer.stop_reason == "end_turn"

        assert run(_session(editor, home, work, a, b, body)) == 0
        assert len(a.requests) == 1
        assert len(b.requests) == 1  # the step after the tool went to the chosen model
    assert editor.text() == "From the second model."
    assert any(isinstance(u, schema.ConfigOptionUpdate) for u in editor.updates)


# -- files -------------------------------------------------------------------------------------


def test_an_edit_goes_through_the_editors_buffer_not_the_disk(tmp_path: Path) -> None:
    edit = json.dumps({"path": "a.txt", "old_string": "world", "new_string": "there"})
    replies = [Served(pieces=openai_tool("c1", "edit_file", edit)), says("Edited.")]
    editor = Editor()
    with workspace(tmp_path) as (home, work), servers(replies) as (a, b):
        (work / "a.txt").write_text("hello world (on disk)")
        editor.buffers[str(work / "a.txt")] = "hello world (unsaved)"

        async def body(conn: Any, session: str) -> None:
            answer = await conn.prompt(session_id=session, prompt=text("edit a.txt"))
            assert answer.stop_reason == "end_turn"

        assert run(_session(editor, home, work, a, b, body, files=True)) == 0
        assert (work / "a.txt").read_text() == "hello world (on disk)"
    assert editor.buffers[str(work / "a.txt")] == "hello there (unsaved)"
    assert editor.statuses("c1") == ["pending", "in_progress", "completed"]


def test_a_path_escaping_the_session_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("nope")
    replies = [
        Served(pieces=openai_tool("c1", "read_file", json.dumps({"path": "../secret.txt"}))),
        says("I may not."),
    ]
    editor = Editor()
    with workspace(tmp_path) as (home, work), servers(replies) as (a, b):
        (work / "link").symlink_to(tmp_path / "secret.txt")

        async def body(conn: Any, session: str) -> None:
            await conn.prompt(session_id=session, prompt=text("read it"))

        assert run(_session(editor, home, work, a, b, body)) == 0
        told = a.requests[1].body["messages"][-1]["content"]
    assert "'../secret.txt'" in told
    assert "outside the session's directories" in told
    assert editor.statuses("c1") == ["pending", "in_progress", "failed"]


# -- sessions ----------------------------------------------------------------------------------


def test_a_session_never_prompted_loads_after_a_restart(tmp_path: Path) -> None:
    with workspace(tmp_path) as (home, work), servers([says("Here.")]) as (a, b):
        first = Editor()

        async def nothing(conn: Any, session: str) -> None:
            pass

        assert run(_session(first, home, work, a, b, nothing)) == 0
        second = Editor()

        async def prompt(conn: Any, session: str) -> None:
            listed = await conn.list_sessions(cwd=str(work))
            assert [s.session_id for s in listed.sessions] == [session]
            answer = await conn.prompt(session_id=session, prompt=text("hello"))
            assert answer.stop_reason == "end_turn"

        assert run(_session(second, home, work, a, b, prompt, load=first.session)) == 0
    titles = [u.title for u in second.updates if isinstance(u, schema.SessionInfoUpdate)]
    assert titles == ["hello"]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
