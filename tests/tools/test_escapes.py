"""Holes found by attacking issue 23's promises as a hostile model and repository would.

Each test is the attack that broke a promise, on real files: arguments nested past the
decoder's depth, a file that grows while it is edited or read, a file that is not UTF-8.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
import trio

from greenroom import Image, Text, open_runtime
from greenroom.acp.frames import MAX_FRAME, Bad, FrameScan, Unread, dropped
from greenroom.acp.params import RpcError, check_cwd, check_roots
from greenroom.acp.presenter import Presenter
from greenroom.actors.types import ToolInvocation
from greenroom.cli import main
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.acp import ToolCallProgress
from greenroom.protocol.events import Completed, SessionHeader, ToolResult
from greenroom.session.persistence import PersistenceError
from greenroom.session.persistence.postgres import PostgresPersistence
from greenroom.tools import Tool, confine
from greenroom.tools.bash.local import LocalBashExecutor
from greenroom.tools.bash.seam import BashExecRequest, BashRunResult, StreamOutput
from greenroom.tools.bash.tools import render_output, render_result
from greenroom.tools.files import ReadCaps, file_tools
from tests.acp_peer import allow_once
from tests.agents_helpers import turn_ends
from tests.tools.test_files import ARGUMENTS, FLIPPER, _line, call, refused
from tests.tools.test_files import fifo_passes as fifo_passes  # the fixture, used by name
from tests.tools.test_output_caps import tapped

NESTED = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "arguments",
    [
        '{"path": "a.txt", "deep": ' + NESTED + "}",  # skipped as an unknown field
        '{"path": ' + NESTED + "}",
        NESTED,
    ],
)
async def test_arguments_nested_past_the_decoders_depth_are_an_error_result(
    arguments: str, tmp_path: Path
) -> None:
    """A call the decoder cannot take is the model's error to read, not a failed turn."""
    model = ScriptedModel([[CallTool("read_file", arguments)], [Say("ok")]])
    async with open_runtime(model=model, tools=file_tools()) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", cwd=str(tmp_path))
        handle.agent.send("go")
        await handle.agent.when_idle()
        events = handle.agent.session.events
    assert turn_ends(events) == [(1, Completed())]
    (result,) = [e for e in events if isinstance(e, ToolResult)]
    assert result.is_error
    assert "read_file" in result.content
    assert result.error is not None
    assert result.error.code == "invalid-arguments"


# -- a file too large, or growing, to be read whole ------------------------------------------

CAPS = ReadCaps(edit_bytes=1024 * 1024)


async def test_a_file_larger_than_the_edit_cap_is_not_edited_and_write_shows_its_head(
    tmp_path: Path,
) -> None:
    big = tmp_path / "big.txt"
    data = b"a" * CAPS.edit_bytes + b"needle\n"
    big.write_bytes(data)
    edited = await call(
        "edit_file", tmp_path, caps=CAPS, path="big.txt", old_string="needle", new_string="pin"
    )
    assert refused(edited, "big.txt", "more than 1,048,576 bytes", "write_file")
    assert edited.error is not None
    assert edited.error.code == "too-large"
    assert big.read_bytes() == data
    written = await call("write_file", tmp_path, caps=CAPS, path="big.txt", content="small")
    assert not written.is_error
    assert big.read_text() == "small"
    (diff,) = written.diffs
    assert diff.old_text == "a" * CAPS.edit_bytes + (
        "\n[the old file held more than 1,048,576 bytes; only these are shown]"
    )


@contextmanager
def growing(path: Path, ceiling: int) -> Iterator[threading.Event]:
    """A thread appending 1 MiB at a time to `path`, as ``yes >> path`` would, until the
    block ends or the file reaches `ceiling` bytes (so a reader that chases it ends)."""
    stop = threading.Event()
    block = b"y\n" * (512 * 1024)

    def append() -> None:
        with open(path, "ab") as file:
            while not stop.is_set() and file.tell() < ceiling:
                file.write(block)
                file.flush()

    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    try:
        yield stop
    finally:
        stop.set()
        writer.join()


@pytest.mark.real_clock
async def test_an_edit_of_a_file_that_grows_while_it_is_read_holds_memory_to_the_cap(
    tmp_path: Path,
) -> None:
    """Read whole, the growing file took the process's memory (2.6 GB in 15 s, measured)."""
    path = tmp_path / "grows.log"
    path.write_bytes(b"")
    ceiling = 200 * 1024 * 1024
    tracemalloc.start()
    try:
        with growing(path, ceiling), trio.fail_after(60):
            while path.stat().st_size < 2 * CAPS.edit_bytes:
                await trio.sleep(0.01)
            tracemalloc.reset_peak()
            edited = await call(
                "edit_file", tmp_path, caps=CAPS, path="grows.log", old_string="y", new_string="n"
            )
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused(edited, "more than 1,048,576 bytes")
    assert peak < 8 * CAPS.edit_bytes


async def test_a_read_shows_the_file_as_far_as_its_size_when_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines appended once the file is open are not chased: a command appending forever
    cannot keep a read (with a far offset) going."""
    path = tmp_path / "log.txt"
    path.write_text("one\ntwo\n")
    opened = confine.open_regular

    def open_then_grow(roots: confine.Roots, name: str) -> tuple[int, os.stat_result, str]:
        found = opened(roots, name)
        with open(path, "a") as file:
            file.write("late\n" * 100_000)
        return found

    monkeypatch.setattr("greenroom.tools.files.open_regular", open_then_grow)
    shown = await call("read_file", tmp_path, path="log.txt")
    assert shown.content == "one\ntwo\n"
    path.write_text("one\ntwo\n")
    past = await call("read_file", tmp_path, path="log.txt", offset=50_000)
    assert past.content == "(nothing from line 50000: log.txt has fewer lines)"
    monkeypatch.undo()
    assert "late" in (await call("read_file", tmp_path, path="log.txt")).content


# -- bytes that are not UTF-8 ------------------------------------------------------------------


async def test_an_edit_changes_only_what_it_replaces_in_a_file_not_in_utf_8(
    tmp_path: Path,
) -> None:
    """An edit decoded the file with replacement characters and wrote them back: every
    byte that was not UTF-8 (Latin-1 text, a binary blob) was lost."""
    path = tmp_path / "latin1.txt"
    data = "café = 1\n".encode("latin-1") + b"\xff\xfe\x00blob\xc3(\xed\xa0\x80\n"
    path.write_bytes(data)
    edited = await call("edit_file", tmp_path, path="latin1.txt", old_string="1", new_string="2")
    assert not edited.is_error, edited.content
    assert path.read_bytes() == data.replace(b"= 1", b"= 2")


# -- the temporary file of a write ---------------------------------------------------------------


@pytest.mark.real_clock
async def test_a_private_files_new_text_is_never_readable_by_others_before_the_rename(
    tmp_path: Path,
) -> None:
    """The temporary file was made 0666 less the umask and written before its mode was set
    to the target's: another user could open a 0600 file's new text (or, under umask 0,
    write it) in between."""
    secret = tmp_path / "secret.env"
    secret.write_text("old")
    secret.chmod(0o600)
    seen: set[int] = set()
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for entry in os.scandir(tmp_path):
                if entry.name.startswith(".greenroom-"):
                    with suppress(FileNotFoundError):
                        seen.add(stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode))

    watcher = threading.Thread(target=watch, daemon=True)
    old = os.umask(0)
    watcher.start()
    try:
        with trio.fail_after(120):
            for _ in range(200):
                written = await call(
                    "write_file", tmp_path, path="secret.env", content="k" * 2_000_000
                )
                assert not written.is_error, written.content
                if seen:
                    break
    finally:
        stop.set()
        watcher.join()
        os.umask(old)
    assert seen  # the watcher did see temporary files
    assert all(mode & 0o077 == 0 for mode in seen), sorted(oct(m) for m in seen)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


# -- reads and edits while a directory flips ---------------------------------------------------


@pytest.mark.real_clock
async def test_no_read_or_edit_reaches_outside_while_a_directory_flips_to_a_link(
    tmp_path: Path,
) -> None:
    """The write race of tests/tools/test_files.py, for the two tools that read a file first: the
    directory ``d`` flips between itself and a link to a directory outside that holds a file
    of the same name."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "d").mkdir(parents=True)
    outside.mkdir()
    (work / "d" / "f.txt").write_text("inside: x")
    (outside / "f.txt").write_text("outside: x")
    counts = {"read": 0, "edited": 0, "refused": 0}

    async def reader(first: int) -> None:
        for _ in range(first, CALLS, 2):
            read = await call("read_file", work, path="d/f.txt")
            assert "outside:" not in read.content
            counts["read"] += not read.is_error
            for old, new in (("x", "y"), ("y", "x")):
                edited = await call(
                    "edit_file", work, path="d/f.txt", old_string=old, new_string=new
                )
                counts["edited"] += not edited.is_error
                counts["refused"] += "outside the session's directories" in edited.content

    command = [sys.executable, "-c", FLIPPER, str(work / "d"), str(work / "d-parked"), str(outside)]
    with trio.fail_after(180):
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert process.stdin is not None
        assert process.stdout is not None
        try:
            assert await _line(process.stdout) == "ready"
            async with trio.open_nursery() as nursery:
                for first in range(2):
                    nursery.start_soon(reader, first)
        finally:
            await process.stdin.aclose()
            flips = int(await _line(process.stdout))
            await process.wait()
    assert flips > 0
    assert (outside / "f.txt").read_text() == "outside: x"
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]
    # The race ran: calls met the directory and met the link.
    assert counts["read"] > 0
    assert counts["edited"] > 0
    assert counts["refused"] > 0


CALLS = 600  # reads, each followed by two edits: 1,800 calls


# -- a terminal client's replay ----------------------------------------------------------------


class _Command(msgspec.Struct):
    command: str = ""


def _named(name: str, content: str) -> Tool[_Command]:
    async def run(args: _Command, invocation: ToolInvocation) -> str:
        await trio.lowlevel.checkpoint()
        return content

    return Tool(name, "a stand-in", _Command, run)


async def test_a_terminal_exit_is_the_results_own_calls_when_a_later_call_reuses_its_id(
    tmp_path: Path,
) -> None:
    """Call ids are the model's: some servers number them per reply (``call_0`` each time).
    The exit was read off the last call of that id in the whole log (a later turn's), so a
    bash call's end lost its exit, or another tool's end got one; and each result scanned
    the log from its end, quadratic on a long replay."""
    model = ScriptedModel(
        [
            [CallTool("bash", {"command": "exit 3"}, call_id="call_0")],
            [Say("ran")],
            [CallTool("other", call_id="call_0")],
            [Say("read")],
        ]
    )
    tools = [_named("bash", "out\n[exit code: 3]"), _named("other", "x\n[exit code: 9]")]
    async with open_runtime(model=model, tools=tools) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", cwd=str(tmp_path))
        for prompt in ("one", "two"):
            handle.agent.send(prompt)
            await handle.agent.when_idle()
        session = handle.agent.session
        presenter = Presenter(["scripted"], {})
        presenter.terminal = True
        ends = [
            update
            for event in session.events
            for update in presenter.present(session, event, replay=True)
            if isinstance(update, ToolCallProgress) and update.status == "completed"
        ]
    bash, other = ends
    assert bash.meta == {"terminal_exit": {"terminal_id": "call_0", "exit_code": 3, "signal": None}}
    assert other.meta is None


# -- the editor's files --------------------------------------------------------------------------


UINT32 = 2**32 - 1


async def test_a_read_through_the_editor_of_a_file_over_the_frame_limit_answers(
    tmp_path: Path,
) -> None:
    """An editor holding a 9 MB file answered fs/read_text_file in one frame over the 8 MiB
    reader limit: the reply was dropped, and the read waited for it for ever."""
    big = tmp_path / "big.log"
    lines = [f"line {i:07d} " + "x" * 80 for i in range(1, 100_001)]
    big.write_text("\n".join(lines) + "\n")
    asked: list[dict[str, Any]] = []

    async def editor(request: dict[str, Any]) -> dict[str, Any]:
        asked.append(request["params"])
        assert request["method"] == "fs/read_text_file"
        text = big.read_text()
        line, limit = request["params"].get("line"), request["params"].get("limit")
        if not all(0 <= n <= UINT32 for n in (line or 0, limit or 0)):  # ACP: uint32
            return {"error": "line and limit are uint32"}
        if line is not None or limit is not None:  # ACP: 1-based first line, how many
            start = (line or 1) - 1
            kept = text.splitlines(keepends=True)[start : None if limit is None else start + limit]
            text = "".join(kept)
        return {"content": text}

    model = ScriptedModel(
        [
            [CallTool("read_file", {"path": "big.log"})],
            [CallTool("read_file", {"path": "big.log", "offset": 99_999})],
            [CallTool("read_file", {"path": "big.log", "offset": 10**12, "limit": 10**12})],
            [Say("read")],
        ]
    )
    fs = {"fs": {"readTextFile": True, "writeTextFile": True}}
    async with tapped(tmp_path, model, file_tools(), fs) as (rt, peer, tap):
        peer.answer = editor
        session = await peer.new_session(str(tmp_path))
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        with trio.fail_after(60):
            answer = await peer.call("session/prompt", prompt)
        assert answer["result"] == {"stopReason": "end_turn"}
        first, last, far = [e for e in rt.sessions.get(session).events if isinstance(e, ToolResult)]  # type: ignore[union-attr]
    assert not first.is_error
    assert first.content.startswith(lines[0] + "\n")
    assert first.content.endswith(
        "[lines 1-2000 of big.log; more follows: read on with offset=2001]"
    )
    assert not last.is_error
    assert last.content == "\n".join(lines[-2:]) + "\n[lines 99999-100000 of big.log]"
    assert far.content == "(nothing from line 1000000000000: big.log has fewer lines)"
    assert tap.longest <= MAX_FRAME


# -- an abandoned read stops ------------------------------------------------------------------


@pytest.mark.real_clock
@pytest.mark.usefixtures("fifo_passes")
async def test_a_cancelled_read_that_never_reaches_its_offset_stops_reading(
    tmp_path: Path,
) -> None:
    """A file whose size says 0 and that never ends (a /proc file; a FIFO here, let past the
    type check) read from a far offset: the cancel answered, but the abandoned thread read
    on for ever, holding its thread and a token of Trio's limiter."""
    pipe = tmp_path / "endless"
    os.mkfifo(pipe)
    keeper = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # a reader that never reads
    writer = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    stop = threading.Event()
    written = [0]

    def write() -> None:
        while not stop.is_set():
            try:
                written[0] += os.write(writer, b"z" * 4096)  # no newline: line 2 never comes
            except BlockingIOError:  # the pipe is full: nobody reads
                time.sleep(0.001)

    feeding = threading.Thread(target=write, daemon=True)
    feeding.start()
    try:
        with trio.fail_after(30):
            with trio.CancelScope() as waited:  # cancelled once it has read a MiB

                async def cancel_once_reading() -> None:
                    while written[0] <= 1024 * 1024:
                        await trio.sleep(0.01)
                    waited.cancel()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(cancel_once_reading)
                    await call("read_file", tmp_path, path="endless", offset=2)
            assert waited.cancelled_caught
            await trio.sleep(0.5)
            before = written[0]
            await trio.sleep(0.5)
            assert written[0] == before  # the pipe is full: nothing reads it any more
    finally:
        stop.set()
        feeding.join(5)
        os.close(writer)  # an abandoned reader that still reads sees its end
        os.close(keeper)


# -- a special file is refused without being opened ---------------------------------------------


@pytest.mark.real_clock
@pytest.mark.parametrize("tool", ["read_file", "write_file", "edit_file"])
async def test_a_fifo_is_refused_without_being_opened(tool: str, tmp_path: Path) -> None:
    """The last name was opened (O_NONBLOCK) and only then found to be a FIFO: the open
    itself is what a FIFO's writer waits for (and a device's driver runs on), so a
    refused read woke a writer waiting on the pipe, whose first write then broke."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    opened = threading.Event()

    def writer() -> None:
        fd = os.open(pipe, os.O_WRONLY)  # waits until a reader opens the pipe
        opened.set()
        os.close(fd)

    waiting = threading.Thread(target=writer, daemon=True)
    waiting.start()
    try:
        with trio.fail_after(30):
            await trio.sleep(0.2)  # the writer is in its open
            outcome = await call(tool, tmp_path, path="pipe", **ARGUMENTS[tool])
            assert refused(outcome, "is a FIFO (named pipe), not a regular file")
            await trio.sleep(0.3)
            assert not opened.is_set()
    finally:
        reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer go
        waiting.join(5)
        os.close(reader)


# -- a path longer than any the kernel takes -----------------------------------------------


async def test_a_path_longer_than_path_max_is_refused_at_once_naming_its_length(
    tmp_path: Path,
) -> None:
    """A path outside the roots is named with where it resolves, and working that out took
    time quadratic in its length: 160 KB took 1.9 s of a worker thread holding the GIL, 2 MB
    of arguments would take minutes."""
    (tmp_path / "d").mkdir()
    for path in ("/nowhere/" + "a/" * 3000 + "f", "d/../" * 1000 + "f"):
        for tool in ("read_file", "write_file", "edit_file"):
            outcome = await call(tool, tmp_path, path=path, **ARGUMENTS[tool])
            assert refused(outcome, f"is {len(path):,} characters long", "4,096")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


# -- an editor's reply over the frame limit ----------------------------------------------------


@pytest.mark.parametrize("tool", ["edit_file", "write_file"])
async def test_an_editors_reply_over_the_frame_limit_fails_its_request(
    tool: str, tmp_path: Path
) -> None:
    """The editor answered fs/read_text_file with 9 MB in one frame, past the reader's 8 MiB:
    the reply was dropped unread and the tool call waited for it until a cancel. Now the
    dropped reply's id (found by a scan of it) fails the request, naming the limit."""
    (tmp_path / "big.txt").write_text("x")
    written: list[str] = []

    async def editor(request: dict[str, Any]) -> dict[str, Any]:
        if request["method"] == "session/request_permission":
            return await allow_once(request)
        if request["method"] == "fs/write_text_file":
            written.append(request["params"]["content"])
            return {}
        assert request["method"] == "fs/read_text_file"
        return {"content": "old " + "x" * 9_000_000}

    arguments = {"path": "big.txt", **ARGUMENTS[tool]}
    model = ScriptedModel([[CallTool(tool, arguments)], [Say("done")]])
    fs = {"fs": {"readTextFile": True, "writeTextFile": True}}
    async with tapped(tmp_path, model, file_tools(), fs) as (rt, peer, _):
        peer.answer = editor
        session = await peer.new_session(str(tmp_path))
        prompt = {"sessionId": session, "prompt": [{"type": "text", "text": "go"}]}
        with trio.fail_after(60):
            answer = await peer.call("session/prompt", prompt)
        assert answer["result"] == {"stopReason": "end_turn"}
        (result,) = [e for e in rt.sessions.get(session).events if isinstance(e, ToolResult)]  # type: ignore[union-attr]
    # The reply is not answered as if it were a request of the editor's.
    assert not [f for f in peer.frames if "error" in f and f.get("id") is None]
    if tool == "edit_file":
        assert result.is_error
        assert f"longer than {MAX_FRAME:,} bytes" in result.content
        assert "fs/read_text_file" in result.content
        assert written == []
    else:  # what the editor holds could not be read: written as a new file's text
        assert not result.is_error
        assert written == [ARGUMENTS["write_file"]["content"]]


# -- a bash stream's spill file is capped ------------------------------------------------------


@pytest.mark.real_clock
async def test_a_bash_streams_spill_file_stops_at_its_cap_and_the_output_says_so(
    tmp_path: Path,
) -> None:
    """A background `yes` wrote 4.1 GB of spill file in 3 s: nothing bounded it. Past the
    executor's cap a stream is counted, not kept, and both tools' texts say how much."""
    cap, size = 1_000_000, 5_000_000
    command = f"yes | head -c {size}; echo end >&2"
    with trio.fail_after(60):
        async with LocalBashExecutor(str(tmp_path), max_spill=cap) as executor:
            spec = executor.resolve(BashExecRequest(command=command))
            task = await executor.start(spec)
            await executor.wait(task.id)
            output = executor.read_output(task.id)
            result = await executor.run(spec)
            runs = [
                (result.stdout.spill_path, result.stdout.dropped, render_result(result)),
                (output.stdout_spill_path, output.dropped, render_output(output)),
            ]
            for path, dropped, text in runs:
                assert path is not None
                assert os.path.getsize(path) == cap
                assert dropped == size - cap
                assert f"the {size - cap:,} bytes after it were counted, not kept" in text
                assert path in text
    assert result.stdout.text.endswith("y\n")
    assert result.stdout.truncated
    assert result.stderr.text == "end\n"
    assert result.stderr.dropped == 0
    assert "not kept" not in render_result(
        BashRunResult(
            exit_code=0,
            signal=None,
            timed_out=False,
            timeout_ms=1,
            stdout=StreamOutput("x", True, "/spill"),
            stderr=StreamOutput(""),
        )
    )


def test_a_spill_cap_that_is_not_a_positive_int_is_refused_naming_it(tmp_path: Path) -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_spill"):
            LocalBashExecutor(str(tmp_path), max_spill=bad)  # type: ignore[arg-type]


# -- a structured output nested past the decoder's depth -------------------------------------


class _City(msgspec.Struct):
    name: str
    population: int


DEEP_ANSWER = '{"name": "Lyon", "population": 1, "deep": ' + "[" * 10_000 + "]" * 10_000 + "}"


@pytest.mark.parametrize("how", ["text", "call"])
async def test_a_final_answer_nested_past_the_decoders_depth_is_an_invalid_answer(
    how: str,
) -> None:
    """An answer nested 10,000 levels raised RecursionError out of the decoder and failed the
    turn; it is an invalid answer like any other: the model is told, and gets one more step."""
    deep = Say(DEEP_ANSWER) if how == "text" else CallTool("final_answer", DEEP_ANSWER)
    valid = {"name": "Lyon", "population": 522000}
    model = ScriptedModel([[deep], [CallTool("final_answer", valid)]], delay=0)
    async with open_runtime(model=model) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        answer = await agent.run("which city?", output=_City)
    assert answer.stop_reason == "completed"
    assert answer.output == _City("Lyon", 522000)
    told = model.requests[1].messages[-1]
    assert "nested too deep" in told.content


# -- reading a PostgreSQL store changes nothing ------------------------------------------------


PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63f8ff9fa11e000782027f3dc848ef0000000049454e44ae426082"
)


def _catalog(dsn: str) -> list[tuple[str, str]]:
    """Every relation (table, sequence, index) of the test's schema, and its kind."""
    with psycopg.connect(dsn) as db:
        rows = db.execute(
            "SELECT relname, relkind::text FROM pg_class"
            " WHERE relnamespace = current_schema()::regnamespace ORDER BY relname"
        ).fetchall()
    return [(name, kind) for name, kind in rows]


@pytest.mark.postgres
def test_reading_a_postgres_store_made_before_the_blobs_table_creates_nothing(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sessions list|show` ran CREATE TABLE IF NOT EXISTS greenroom_blobs, changing a store
    made before that table existed. A reader now creates nothing, and reads no blobs there."""
    png = PNG

    async def record() -> None:
        store = PostgresPersistence(postgres_dsn)
        try:
            async with open_runtime(model=ScriptedModel(delay=0), persistence=store) as rt:
                agent = (await rt.agents.create(agent_id="a", session_id="old")).agent
                await agent.run([Text("what is this?"), Image(png, "image/png")])
        finally:
            store.close()

    trio.run(record)
    with psycopg.connect(postgres_dsn) as db:
        db.execute("DROP TABLE greenroom_blobs")  # as a store of a version before it was
    before = _catalog(postgres_dsn)
    assert ("greenroom_blobs", "r") not in before
    assert main(["sessions", "list", "--store", postgres_dsn]) == 0
    assert capsys.readouterr().out.startswith("old  ")
    assert main(["sessions", "show", "old", "--store", postgres_dsn]) == 0
    out = capsys.readouterr().out
    assert "what is this?" in out
    assert f"{len(png)} bytes" in out
    assert _catalog(postgres_dsn) == before


@pytest.mark.postgres
@pytest.mark.real_clock  # the store's writer thread waits in real time
async def test_a_read_only_postgres_store_refuses_to_write_naming_why(postgres_dsn: str) -> None:
    PostgresPersistence(postgres_dsn).close()  # the tables
    before = _catalog(postgres_dsn)
    store = PostgresPersistence(postgres_dsn, read_only=True)
    try:
        header = SessionHeader(id="s", created_at=0)
        attempts = [
            store.create(header),
            store.open("s"),
            store.delete("s"),
            store.put_blobs("s", {"0" * 64: b"x"}),
        ]
        for attempt in attempts:
            with pytest.raises(PersistenceError, match="read-only"), trio.fail_after(60):
                await attempt
        assert await store.list() == []
        assert await store.read_blobs("s", ["0" * 64]) == {}
    finally:
        store.close()
    assert _catalog(postgres_dsn) == before


# -- a long path in a parameter's error keeps its end -----------------------------------------


def test_a_long_path_in_a_params_error_keeps_its_head_and_its_end(tmp_path: Path) -> None:
    """check_cwd cut a path at 80 characters, so a long tmp path lost its last component
    (tests/acp/test_params.py failed under xdist: 'missin'). Each message keeps head and tail."""
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    missing = str(deep / "missing-root")
    huge = "/" + "x" * 1_000_000 + "/end-of-it"
    checks: list[tuple[Callable[[], None], str]] = [
        (lambda: check_roots([str(tmp_path), missing]), missing),
        (lambda: check_cwd(missing, must_exist=True), missing),
        (lambda: check_cwd(huge[1:], must_exist=False), huge[1:]),  # not absolute
        (lambda: check_cwd(huge + "\x00", must_exist=False), huge + "\x00"),
        (lambda: check_cwd(huge, must_exist=True), huge),
    ]
    for check, path in checks:
        with pytest.raises(RpcError) as caught:
            check()
        message = caught.value.message
        assert repr(path)[:60] in message
        assert repr(path)[-100:] in message
        assert len(message) < 300


@pytest.mark.parametrize(
    ("line", "request_id", "reply"),
    [
        (b'{"jsonrpc":"2.0","id":"gr-3","result":{"content":"xx"}}', "gr-3", True),
        (b'{"jsonrpc": "2.0", "id": 7, "error": {"message": "m"}}', 7, True),
        (b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"p":""}}', 7, False),
        (b'{"id":"x","params":{"a":""},"method":"m"}', "x", False),  # the method last
        (b'{"result":"' + b"x" * 5000 + b'","id":"gr-3"}', "gr-3", True),  # the id past 4 KiB
        # Quotes inside a value are escaped: no key, so no id, can be forged there.
        (b'{"jsonrpc":"2.0","result":{"c":"a\\"}, \\"id\\": \\"gr-9\\", \\""}}', None, True),
        (b"x" * 4096, None, False),
    ],
)
def test_a_dropped_frame_is_told_by_a_scan_of_all_of_it(
    line: bytes, request_id: str | int | None, reply: bool
) -> None:
    scan = FrameScan()
    for start in range(0, len(line), 7):
        scan.feed(line[start : start + 7])
    frame = dropped(scan.end())
    if reply:
        assert frame == Unread(request_id, frame.why)
        assert f"longer than {MAX_FRAME:,} bytes" in frame.why
    else:
        assert isinstance(frame, Bad)
        assert frame.id == request_id
        assert f"longer than {MAX_FRAME:,} bytes" in frame.message
