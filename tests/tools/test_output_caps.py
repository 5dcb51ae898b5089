"""Bounded outputs: a tool's text is cut before the log and the model see it (the whole kept
in a spill file the result names); no ACP frame greenroom writes is over its reader's limit;
``greenroom sessions show`` prints bounded lines, a cut result with its marker."""

from __future__ import annotations

import json
import re
import stat
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from greenroom import open_runtime
from greenroom.acp import serve_connection
from greenroom.acp.frames import MAX_FRAME
from greenroom.acp.presenter import TEXT_CHARS
from greenroom.actors.types import ToolInvocation, ToolOutcome
from greenroom.cli import main
from greenroom.models.base import ModelAdapter
from greenroom.models.scripted import CallTool, Fail, Say, ScriptedModel
from greenroom.protocol.events import Completed, FileDiff, ToolResult
from greenroom.protocol.model import ToolTurn
from greenroom.runtime import Runtime
from greenroom.session.persistence import JsonlPersistence
from greenroom.session.transcript import SHOWN
from greenroom.spill import (
    DEFAULT_MAX_TOOL_RESULT,
    MAX_SPILLED,
    TAIL,
    SpillDir,
    TextCap,
    cut,
    find_marker,
)
from greenroom.tools import Tool
from greenroom.tools.files import files_plugin
from greenroom.tools.mcp import tool_name
from tests.acp_peer import Peer
from tests.agents_helpers import turn_ends
from tests.tools.test_mcp import served

LIMIT = DEFAULT_MAX_TOOL_RESULT
_SPILLED = re.compile(r"the whole text is in (/[^\n]*)\]$", re.M)
HEAD = LIMIT - TAIL  # what a cut keeps of a text's start


class Pad(msgspec.Struct):
    pad: str = ""


def huge(content: str, diffs: Sequence[FileDiff] = ()) -> Tool[Pad]:
    """A tool named ``huge`` whose every call returns `content` (and `diffs`)."""

    async def run(args: Pad, invocation: ToolInvocation) -> ToolOutcome:
        await trio.lowlevel.checkpoint()
        return ToolOutcome(content, diffs=list(diffs))

    return Tool("huge", "answers a lot", Pad, run)


def spilled(text: str) -> Path:
    """The spill file the marker `text` ends with names."""
    match = _SPILLED.search(text)
    assert match is not None, text[-300:]
    return Path(match.group(1))


def results(events: Sequence[object]) -> list[ToolResult]:
    return [e for e in events if isinstance(e, ToolResult)]


def the_whole(size: int, fill: str = "r") -> str:
    """`size` characters whose last one differs, so a cut that lost the end shows."""
    return fill * (size - 1) + "$"


# -- the registry: every tool's result ---------------------------------------------------------


async def test_a_huge_result_is_cut_for_the_log_and_the_model_and_kept_whole() -> None:
    size = 5_000_000
    whole = the_whole(size)
    model = ScriptedModel([[CallTool("huge")], [Say("read it")], [Say("and again")]])
    async with open_runtime(model=model, tools=[huge(whole)]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("go")
        await handle.agent.when_idle()
        handle.agent.send("more")
        await handle.agent.when_idle()
        (result,) = results(handle.agent.session.events)
        path = spilled(result.content)
        assert result.content == (
            f"{whole[:HEAD]}\n[{size - LIMIT} of {size} characters were cut here;"
            f" the whole text is in {path}]\n{whole[-TAIL:]}"
        )
        assert path.read_text() == whole
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        # The step after the call and the next turn: the model never sees more than the cut.
        later = list(model.requests)[1:]
        assert len(later) == 2
        for request in later:
            (turn,) = [m for m in request.messages if isinstance(m, ToolTurn)]
            assert turn.content == result.content
    assert not path.exists()
    assert not path.parent.exists()  # the spill directory goes with the runtime


async def test_a_1_mb_read_file_never_reaches_the_models_history_whole(tmp_path: Path) -> None:
    """Issue 23 found that a 1 MB read_file result made every later prompt fail with the
    provider's context-length error; whatever read_file's own cap, the model sees at most
    the cut."""
    (tmp_path / "one-line.txt").write_text("a" * 1_000_000)
    (tmp_path / "lines.txt").write_text(("b" * 99 + "\n") * 10_000)
    reads = [CallTool("read_file", {"path": name}) for name in ("one-line.txt", "lines.txt")]
    model = ScriptedModel([reads, [Say("read")], [Say("still fine")]])
    async with open_runtime(model=model) as rt:
        await rt.plug("tool-files", files_plugin)
        handle = await rt.agents.create(agent_id="a", session_id="s", cwd=str(tmp_path))
        handle.agent.send("read both")
        await handle.agent.when_idle()
        handle.agent.send("and now?")
        await handle.agent.when_idle()
        logged = results(handle.agent.session.events)
        assert len(logged) == 2
        assert all(not r.is_error and len(r.content) <= LIMIT + 300 for r in logged)
        later = list(model.requests)[1:]
        assert len(later) == 2
        for request in later:
            turns = [m for m in request.messages if isinstance(m, ToolTurn)]
            assert [t.content for t in turns] == [r.content for r in logged]


async def test_a_result_within_the_cap_is_untouched_and_spills_nothing() -> None:
    text = the_whole(LIMIT)
    model = ScriptedModel([[CallTool("huge")], [Say("ok")]])
    async with open_runtime(model=model, tools=[huge(text)]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("go")
        await handle.agent.when_idle()
        (result,) = results(handle.agent.session.events)
        assert result.content == text
        assert find_marker(result.content) is None


async def test_each_side_of_a_huge_diff_is_cut_and_kept_whole() -> None:
    old, new = the_whole(300_000, "o"), the_whole(200_000, "n")
    diffs = [FileDiff("big.txt", new, old), FileDiff("small.txt", "after", None)]
    model = ScriptedModel([[CallTool("huge")], [Say("ok")]])
    async with open_runtime(model=model, tools=[huge("edited", diffs)]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("go")
        await handle.agent.when_idle()
        (result,) = results(handle.agent.session.events)
        assert result.content == "edited"
        big, small = result.diffs
        assert small == FileDiff("small.txt", "after", None)
        assert big.path == "big.txt"
        assert big.new_text.startswith(new[:HEAD] + "\n[100000 of 200000 characters were cut")
        assert big.old_text is not None
        assert big.old_text.startswith(old[:HEAD] + "\n[200000 of 300000 characters were cut")
        assert spilled(big.new_text).read_text() == new
        assert spilled(big.old_text).read_text() == old


async def test_the_cap_is_the_runtimes_option() -> None:
    model = ScriptedModel([[CallTool("huge")], [Say("ok")]])
    async with open_runtime(model=model, tools=[huge("0123456789abc")], max_tool_result=10) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("go")
        await handle.agent.when_idle()
        (result,) = results(handle.agent.session.events)
        assert result.content.startswith("012345678\n[3 of 13 characters were cut here; ")
        assert result.content.endswith("]\nc")  # a tenth of the cap is kept from the end
        assert spilled(result.content).read_text() == "0123456789abc"


async def test_an_error_text_is_cut_too() -> None:
    async def fails(args: Pad, invocation: ToolInvocation) -> str:
        raise ValueError("x" * 1_000_000)

    model = ScriptedModel([[CallTool("fails")], [Say("ok")]])
    async with open_runtime(model=model, tools=[Tool("fails", "raises", Pad, fails)]) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("go")
        await handle.agent.when_idle()
        (result,) = results(handle.agent.session.events)
        assert result.is_error
        assert result.content.startswith("fails failed: ValueError: xxx")
        assert len(result.content) < LIMIT + 300
        assert spilled(result.content).read_text().endswith("x" * 1000)


async def test_a_text_utf_8_cannot_hold_is_mended_not_lost(tmp_path: Path) -> None:
    """A lone surrogate (a file name not in UTF-8, decoded as Python does) made the log
    refuse the result: the turn failed and a resume lost the call's result."""
    diffs = [FileDiff("caf\udce9.txt", "new \ud83d\ude00", None)]
    model = ScriptedModel([[CallTool("huge")], [Say("ok")]])
    store = JsonlPersistence(tmp_path)
    tools = [huge("bad \ud800 text", diffs)]
    async with open_runtime(model=model, persistence=store, tools=tools) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s")
        handle.agent.send("go")
        await handle.agent.when_idle()
        assert turn_ends(handle.agent.session.events) == [(1, Completed())]
    _header, events = await store.load("s")
    (result,) = results(events)
    assert result.content == "bad \ufffd text"
    assert result.diffs == [FileDiff("caf\ufffd.txt", "new \U0001f600", None)]


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "100"])
async def test_a_cap_that_is_not_a_positive_int_is_refused_naming_the_option(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"max_tool_result must be a positive number"):
        async with open_runtime(max_tool_result=bad):
            raise AssertionError("a runtime with a bad cap was opened")


async def test_a_spill_that_cannot_be_written_is_said_so() -> None:
    spills = SpillDir("greenroom-test-")
    spills.close()
    shown = await TextCap(4, spills, option="x")("abcdefgh")
    assert shown.startswith("abcd\n[4 of 8 characters were cut here; the whole text could not")
    assert find_marker(shown) is not None


async def test_spill_files_stop_at_their_budget_and_the_cut_says_so() -> None:
    """A model asking for a huge result again and again could fill the disk with spill files
    (each kept until the runtime's end): past the budget, the cut keeps no more."""
    assert SpillDir("greenroom-test-").budget == MAX_SPILLED
    spills = SpillDir("greenroom-test-", budget=20)
    cap = TextCap(4, spills, option="x")
    try:
        first = await cap("a" * 12)
        assert spilled(first).read_text() == "a" * 12
        over = await cap("b" * 12)
        assert over.startswith("bbbb\n[8 of 12 characters were cut here; the whole text could not")
        assert "12 bytes would take the spill files past their budget of 20 bytes" in over
        assert spilled(await cap("c" * 8)).read_text() == "c" * 8  # within what is left
    finally:
        spills.close()


def test_a_cut_keeps_the_end_where_an_exit_code_is() -> None:
    output = "line\n" * 50_000 + "[exit code: 3]"
    shown = cut(output, 20_000, "the whole text is in /spill/1.txt")
    assert len(shown) < 20_100
    assert shown.startswith("line\nline\n")
    assert shown.endswith("line\n[exit code: 3]")
    assert find_marker(shown) == (
        f"[{len(output) - 20_000} of {len(output)} characters were cut here;"
        " the whole text is in /spill/1.txt]"
    )


@pytest.mark.real_clock
async def test_a_5_mb_mcp_result_is_cut_and_kept_whole(tmp_path: Path) -> None:
    model = ScriptedModel([[CallTool(tool_name("h", "giant"), {"mb": 5})], [Say("ok")]])
    with trio.fail_after(60):
        async with open_runtime(model=model) as rt:
            handle = await rt.agents.create(
                agent_id="a", session_id="s", mcp_servers=[served("h", "hostile")]
            )
            handle.agent.send("giant")
            await handle.agent.when_idle()
            (result,) = results(handle.agent.session.events)
            assert not result.is_error
            assert result.content.startswith(
                "g" * HEAD + f"\n[{5_000_000 - LIMIT} of 5000000 characters were cut here;"
            )
            assert spilled(result.content).read_text() == "g" * 5_000_000
            (turn,) = [m for m in model.requests[-1].messages if isinstance(m, ToolTurn)]
            assert turn.content == result.content


# -- ACP: no frame over the reader's limit -------------------------------------------------------


class Tap(trio.abc.HalfCloseableStream):
    """The peer's end of the connection, measuring every line greenroom writes."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        self.inner = inner
        self.longest = 0
        self.lines = 0
        self._open = 0  # bytes of the line still being received

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        *ended, rest = data.split(b"\n")
        for part in ended:
            self.longest = max(self.longest, self._open + len(part))
            self.lines += 1
            self._open = 0
        self._open += len(rest)
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


@asynccontextmanager
async def tapped(
    root: Path,
    model: ModelAdapter,
    tools: Sequence[Tool[Any]] = (),
    capabilities: dict[str, Any] | None = None,
    **options: Any,
) -> AsyncIterator[tuple[Runtime, Peer, Tap]]:
    async with open_runtime(
        model=model, persistence=JsonlPersistence(root), tools=tools, **options
    ) as runtime:
        client, server = trio.testing.memory_stream_pair()
        tap = Tap(client)
        peer = Peer(tap)
        served = trio.Event()

        async def serve() -> None:
            try:
                await serve_connection(runtime, server)
            finally:
                served.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            nursery.start_soon(peer.read_loop)
            await peer.call(
                "initialize", {"protocolVersion": 1, "clientCapabilities": capabilities or {}}
            )
            yield runtime, peer, tap
            await peer.close()
            await served.wait()
            nursery.cancel_scope.cancel()


def texts(update: dict[str, Any]) -> list[str]:
    return [c["content"]["text"] for c in update.get("content", []) if c["type"] == "content"]


async def test_no_frame_is_over_the_limit_live_or_on_replay(tmp_path: Path) -> None:
    """The log holds a 20 MB result, a 9 MB message, 9 MB arguments and a 9 MB diff."""
    result, message, pad = the_whole(20_000_000), the_whole(9_000_000, "m"), "p" * 9_000_000
    diffs = [FileDiff("big.txt", the_whole(9_000_000, "n"), the_whole(9_000_000, "o"))]
    diffs += [FileDiff(f"f{i}.txt", "x" * 1000) for i in range(2_000)]
    model = ScriptedModel([[Say(message), CallTool("huge", {"pad": pad})], [Say("done")]])
    tools = [huge(result, diffs)]
    # A cap above the result: the log really holds all of it, as an older log might.
    async with tapped(tmp_path, model, tools, max_tool_result=30_000_000) as (rt, peer, tap):
        session = await peer.new_session()
        answer = await peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        )
        assert answer["result"] == {"stopReason": "end_turn"}
        stored = results(rt.sessions.get(session).events)  # type: ignore[union-attr]
        assert stored[0].content == result
        live = peer.updates(session)
        assert tap.longest <= MAX_FRAME
    async with tapped(tmp_path, ScriptedModel()) as (rt, peer, tap):
        loaded = await peer.call(
            "session/load", {"sessionId": session, "cwd": "/tmp", "mcpServers": []}
        )
        assert loaded["result"]["modes"]["currentModeId"] == "default"
        replayed = peer.updates(session)
        assert tap.longest <= MAX_FRAME
        assert replayed[1:] == live
    rest = "the rest is in the session's log]"
    chunk = next(u for u in live if u["sessionUpdate"] == "agent_message_chunk")
    assert chunk["content"]["text"] == cut(message, TEXT_CHARS, rest[:-1])
    start = next(u for u in live if u["sessionUpdate"] == "tool_call")
    arguments = json.dumps({"pad": pad})  # as the scripted model writes them
    assert start["rawInput"] == cut(arguments, TEXT_CHARS, rest[:-1])
    done = next(u for u in live if u.get("status") == "completed")
    shown = texts(done)
    assert shown[0] == cut(result, TEXT_CHARS, rest[:-1])
    big = done["content"][1]
    assert big["path"] == "big.txt"
    assert big["newText"] == cut(diffs[0].new_text, TEXT_CHARS, rest[:-1])
    assert big["oldText"] == cut(diffs[0].old_text or "", TEXT_CHARS, rest[:-1])
    small = [c for c in done["content"] if c["type"] == "diff"][1:]
    assert 100 < len(small) < 1000  # as many as the budget holds, each whole
    assert all(
        d == {"type": "diff", "path": f"f{i}.txt", "newText": "x" * 1000, "oldText": None}
        for i, d in enumerate(small)
    )
    assert shown[-1] == f"[{2_000 - len(small)} more diffs not shown; {rest}"


async def test_an_answer_over_the_limit_becomes_an_error_answer(tmp_path: Path) -> None:
    model = ScriptedModel([[Fail("e" * 9_000_000)]])
    async with tapped(tmp_path, model) as (_rt, peer, tap):
        session = await peer.new_session()
        answer = await peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        )
        assert answer["error"]["code"] == -32603
        assert re.fullmatch(
            r"the answer was \d+ bytes, over the 8388608-byte frame limit",
            answer["error"]["message"],
        )
        assert tap.longest <= MAX_FRAME
        # The connection goes on.
        assert (await peer.call("session/list", {}))["result"]["sessions"]


async def test_a_permission_question_is_bounded_and_a_request_too_large_fails_the_tool(
    tmp_path: Path,
) -> None:
    """An edit with 9 MB of arguments asks first (its question bounded), then writes 9 MB
    through the editor: a request over the limit is never sent, and the tool is told."""

    async def write(args: Pad, invocation: ToolInvocation) -> str:
        assert invocation.client is not None
        assert invocation.client.files is not None
        await invocation.client.files.write_text(str(tmp_path / "big.txt"), args.pad)
        return "written"

    pad = "p" * 9_000_000
    asked: list[dict[str, Any]] = []

    async def answer(request: dict[str, Any]) -> dict[str, Any]:
        asked.append(request)
        assert request["method"] == "session/request_permission"
        return {"outcome": {"outcome": "selected", "optionId": "allow_once"}}

    tools = [Tool("write_big", "writes", Pad, write, kind="edit")]
    model = ScriptedModel([[CallTool("write_big", {"pad": pad})], [Say("ok")]])
    fs = {"fs": {"readTextFile": True, "writeTextFile": True}}
    async with tapped(tmp_path, model, tools, fs) as (rt, peer, tap):
        peer.answer = answer
        session = await peer.new_session()
        answer_ = await peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        )
        assert answer_["result"] == {"stopReason": "end_turn"}
        assert tap.longest <= MAX_FRAME
        (question,) = asked  # the write itself never reached the client
        raw = question["params"]["toolCall"]["rawInput"]
        assert raw == cut(json.dumps({"pad": pad}), TEXT_CHARS, "the rest is in the session's log")
        (result,) = results(rt.sessions.get(session).events)  # type: ignore[union-attr]
        assert result.is_error
        assert re.fullmatch(
            r"write_big failed: ClientError: fs/write_text_file: not sent: the request was"
            r" \d+ bytes, over the 8388608-byte frame limit",
            result.content,
        )
        assert not (tmp_path / "big.txt").exists()


async def test_arguments_nested_too_deep_to_decode_are_shown_as_text(tmp_path: Path) -> None:
    nested = "[" * 5000 + "]" * 5000
    model = ScriptedModel([[CallTool("huge", nested)], [Say("ok")]])
    async with tapped(tmp_path, model, [huge("done")]) as (_rt, peer, _tap):
        session = await peer.new_session()
        await peer.call(
            "session/prompt", {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        )
        (start,) = [u for u in peer.updates(session) if u["sessionUpdate"] == "tool_call"]
        assert start["rawInput"] == nested


# -- greenroom sessions show -----------------------------------------------------------------------


async def _record(root: Path) -> None:
    store = JsonlPersistence(root)
    model = ScriptedModel([[Say("m" * 3_000_000), CallTool("huge")], [Say("ok")]])
    async with open_runtime(
        model=model, persistence=store, tools=[huge(the_whole(20_000_000))]
    ) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="capped")
        handle.agent.send("u" * 3_000_000)
        await handle.agent.when_idle()
        await handle.dispose()
    model = ScriptedModel([[CallTool("huge")], [Say("ok")]])
    async with open_runtime(
        model=model,
        persistence=store,
        tools=[huge(the_whole(20_000_000))],
        max_tool_result=30_000_000,
    ) as rt:
        handle = await rt.agents.create(agent_id="b", session_id="whole")
        handle.agent.send("go")
        await handle.agent.when_idle()
        await handle.dispose()


def test_sessions_show_prints_bounded_lines_and_the_marker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trio.run(_record, tmp_path, clock=trio.testing.MockClock(autojump_threshold=0))
    assert main(["sessions", "show", "capped", "--store", f"jsonl:{tmp_path}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) < 11_000
    (user,) = [i for i, line in enumerate(lines) if line.startswith("  user: ")]
    assert lines[user : user + 3] == [
        "  user: " + "u" * (SHOWN - TAIL),
        "[2990000 of 3000000 characters were cut here; the rest is in the session's log]",
        "u" * TAIL,
    ]
    (result,) = [line for line in lines if line.startswith("  tool result ")]
    assert re.fullmatch(
        "  tool result \\[call-1\\]: r{300} … \\[19900000 of 20000000 characters were cut here;"
        " the whole text is in /[^\\]]+\\]",
        result,
    )
    assert main(["sessions", "show", "whole", "--store", f"jsonl:{tmp_path}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) < 11_000
    (result,) = [line for line in lines if line.startswith("  tool result ")]
    assert result == "  tool result [call-1]: " + "r" * 300 + " …"


def test_the_marker_is_a_line_of_its_own() -> None:
    assert find_marker("plain") is None
    assert find_marker("text\n[not a marker]") is None
    text = cut("z" * 10, 3, "x")
    assert text == "zzz\n[7 of 10 characters were cut here; x]"
    assert find_marker(text) == text.splitlines()[-1]
    assert find_marker(text + " and more") is None
