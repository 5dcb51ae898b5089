"""The file tools on real files: confinement without races, only regular files, bounded reads.

Real directories, links, FIFOs, sockets and devices; the race runs real
threads against the tools; the hung read runs a real ``greenroom acp`` whose
read blocks in the kernel (``tests/files_hang_child.py``).
"""

from __future__ import annotations

import json
import os
import random
import socket
import stat
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import trio

from greenroom import Agent, open_runtime
from greenroom.actors.types import SessionClient, ToolInvocation, ToolOutcome
from greenroom.models import CallTool, Say, ScriptedModel
from greenroom.protocol.events import Aborted, Disposed, ToolResult, TurnEnd
from greenroom.session.persistence import JsonlPersistence
from greenroom.tools import confine
from greenroom.tools.files import ReadArgs, ReadCaps, file_tools
from tests import TESTS
from tests.acp_process import AcpProcess, acp_process

HANG_CHILD = TESTS / "files_hang_child.py"


class _Header:
    def __init__(self, cwd: Path, others: list[Path]) -> None:
        self.cwd = str(cwd)
        self.additional_directories = [str(d) for d in others]


class _Session:
    def __init__(self, cwd: Path, others: list[Path]) -> None:
        self.header = _Header(cwd, others)


class _Agent:
    """All the file tools read of a caller: its session's directories."""

    def __init__(self, cwd: Path, others: list[Path]) -> None:
        self.session = _Session(cwd, others)


class Editor:
    """An editor's files: a buffer per path; every path it was asked for is kept. A read
    gives ``limit`` lines from ``line`` (1-based), as ACP's fs/read_text_file does."""

    def __init__(self, buffers: dict[str, str]) -> None:
        self.buffers = buffers
        self.asked: list[str] = []

    async def read_text(self, path: str, line: int | None, limit: int | None) -> str:
        self.asked.append(path)
        lines = self.buffers[path].splitlines(keepends=True)
        start = (line or 1) - 1
        return "".join(lines[start : None if limit is None else start + limit])

    async def write_text(self, path: str, content: str) -> None:
        self.asked.append(path)
        self.buffers[path] = content


async def call(
    name: str,
    cwd: Path,
    *others: Path,
    caps: ReadCaps | None = None,
    editor: Editor | None = None,
    **arguments: Any,
) -> ToolOutcome:
    """Run file tool `name` for a session in `cwd` (and `others`); its outcome."""
    (tool,) = [t for t in file_tools(caps) if t.name == name]
    client = SessionClient(files=editor) if editor is not None else None
    agent = cast(Agent, _Agent(cwd, list(others)))
    invocation = ToolInvocation("c", name, json.dumps(arguments), agent, client=client)
    result = await tool.run(msgspec.convert(arguments, tool.args), invocation)
    return result if isinstance(result, ToolOutcome) else ToolOutcome(result)


def refused(outcome: ToolOutcome, *words: str) -> bool:
    return outcome.is_error and all(word in outcome.content for word in words)


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """A session's cwd and a directory outside it holding a secret."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    return work, outside


# -- confinement ------------------------------------------------------------------------------


async def test_a_write_replaces_the_file_whole_keeping_its_mode(places: tuple[Path, Path]) -> None:
    work, _ = places
    (work / "a.txt").write_text("old")
    (work / "a.txt").chmod(0o640)
    inode = (work / "a.txt").stat().st_ino
    outcome = await call("write_file", work, path="a.txt", content="new")
    assert not outcome.is_error, outcome.content
    assert [(d.old_text, d.new_text) for d in outcome.diffs] == [("old", "new")]
    assert (work / "a.txt").read_text() == "new"
    assert stat.S_IMODE((work / "a.txt").stat().st_mode) == 0o640
    assert (work / "a.txt").stat().st_ino != inode  # a new file renamed over, not rewritten
    assert sorted(p.name for p in work.iterdir()) == ["a.txt"]  # no temporary left
    edited = await call("edit_file", work, path="a.txt", old_string="ew", new_string="ow")
    assert [(d.old_text, d.new_text) for d in edited.diffs] == [("new", "now")]
    assert (work / "a.txt").read_text() == "now"
    assert stat.S_IMODE((work / "a.txt").stat().st_mode) == 0o640


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
async def test_a_write_keeps_the_files_owner(places: tuple[Path, Path]) -> None:
    work, _ = places
    (work / "a.txt").write_text("old")
    os.chown(work / "a.txt", 65534, 65534)
    outcome = await call("edit_file", work, path="a.txt", old_string="old", new_string="new")
    assert not outcome.is_error, outcome.content
    info = (work / "a.txt").stat()
    assert (info.st_uid, info.st_gid) == (65534, 65534)
    assert (work / "a.txt").read_text() == "new"


async def test_links_are_followed_only_while_they_stay_inside(places: tuple[Path, Path]) -> None:
    work, outside = places
    (work / "sub").mkdir()
    (work / "sub" / "a.txt").write_text("inside")
    (work / "in").symlink_to("sub")  # relative, inside
    (work / "sub" / "up").symlink_to("../sub/a.txt")  # climbs, still inside
    (work / "abs").symlink_to(work / "sub")  # absolute, inside
    (work / "out").symlink_to(outside)
    (work / "sub" / "sneak").symlink_to("../../outside/secret.txt")
    for path in ("in/a.txt", "sub/up", "in/up", "abs/a.txt", str(work / "in" / "a.txt")):
        outcome = await call("read_file", work, path=path)
        assert outcome.content == "inside", path
    for path in ("out/secret.txt", "sub/sneak", "../outside/secret.txt", "sub/../../outside/x"):
        outcome = await call("read_file", work, path=path)
        assert refused(outcome, repr(path), "outside the session's directories"), path
    secret = await call("read_file", work, path="out/secret.txt")
    assert repr(str(outside / "secret.txt")) in secret.content  # where it resolved
    written = await call("write_file", work, path="out/new.txt", content="x")
    assert refused(written, "outside the session's directories")
    (work / "dangling").symlink_to(outside / "new.txt")
    dangling = await call("write_file", work, path="dangling", content="x")
    assert refused(dangling, "outside the session's directories")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    (work / "sub" / "later").symlink_to("b.txt")  # a link to a file not there yet, inside
    assert not (await call("write_file", work, path="sub/later", content="b")).is_error
    assert (work / "sub" / "b.txt").read_text() == "b"
    assert (work / "sub" / "later").is_symlink()  # the link stays; its target was written


async def test_a_sibling_root_is_reached_by_dotdot_and_links_but_nothing_between(
    places: tuple[Path, Path], tmp_path: Path
) -> None:
    work, _ = places
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "s.txt").write_text("shared")
    (work / "to-shared").symlink_to("../shared")
    for path in ("../shared/s.txt", "to-shared/s.txt", str(shared / "s.txt")):
        assert (await call("read_file", work, shared, path=path)).content == "shared", path
    outcome = await call("read_file", work, shared, path="../outside/secret.txt")
    assert refused(outcome, "outside the session's directories")
    assert (await call("read_file", work, path="../shared/s.txt")).is_error  # not a root now


async def test_a_root_given_through_a_link_is_named_either_way(
    places: tuple[Path, Path], tmp_path: Path
) -> None:
    work, _ = places
    (work / "a.txt").write_text("here")
    (tmp_path / "via").symlink_to(work)
    via = tmp_path / "via"
    for path in ("a.txt", str(via / "a.txt"), str(work / "a.txt")):
        assert (await call("read_file", via, path=path)).content == "here", path
    written = await call("write_file", via, path=str(via / "b.txt"), content="b")
    assert [d.path for d in written.diffs] == [str(work / "b.txt")]  # where it really is


@pytest.mark.real_clock
async def test_a_reader_sees_the_old_file_or_the_new_never_half(
    places: tuple[Path, Path],
) -> None:
    work, _ = places
    texts = ("a" * 300_000, "b" * 200_000)
    (work / "f.txt").write_text(texts[0])
    seen: set[str] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.add((work / "f.txt").read_text())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        with trio.fail_after(60):
            for i in range(100):
                outcome = await call("write_file", work, path="f.txt", content=texts[i % 2])
                assert not outcome.is_error, outcome.content
    finally:
        stop.set()
        thread.join()
    assert seen <= set(texts)
    assert len(seen) == 2  # the reader ran through the writes


async def test_a_link_loop_and_a_missing_directory_are_errors_naming_the_path(
    places: tuple[Path, Path],
) -> None:
    work, _ = places
    (work / "a").symlink_to("b")
    (work / "b").symlink_to("a")
    looped = await call("read_file", work, path="a")
    assert refused(looped, "'a'", f"more than {confine.MAX_LINKS} symbolic links")
    missing = await call("write_file", work, path="no/such/file.txt", content="x")
    assert refused(missing, "'no/such/file.txt'", "No such file")
    for path in (".", "", "x/", "a\x00b"):
        assert (await call("read_file", work, path=path)).is_error, path


#: Flips ``d`` between a real directory and a link to outside until its stdin closes, then
#: prints how many times. A process of its own, so the flips run beside the writes rather
#: than in turns with them under the GIL.
FLIPPER = """
import os, sys, threading, time
flip, parked, outside = sys.argv[1:]
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
flips = 0
print("ready", flush=True)
while not done.is_set():
    os.rename(flip, parked)
    os.symlink(outside, flip)
    time.sleep(0.0002)
    os.unlink(flip)
    os.rename(parked, flip)
    time.sleep(0.0002)
    flips += 1
print(flips, flush=True)
"""


async def _line(stream: trio.abc.ReceiveStream) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some()
        assert chunk, "the flipper ended early"
        data += chunk
    return data.decode().strip()


@pytest.mark.real_clock
async def test_no_write_lands_outside_while_a_directory_flips_to_a_link(
    places: tuple[Path, Path],
) -> None:
    work, outside = places
    flip = work / "d"
    flip.mkdir()
    landed = seen_outside = 0

    async def writer(first: int) -> None:
        nonlocal landed, seen_outside
        for i in range(first, WRITES, WRITERS):
            outcome = await call("write_file", work, path=f"d/f{i}.txt", content="x")
            landed += not outcome.is_error
            seen_outside += "outside the session's directories" in outcome.content

    command = [sys.executable, "-c", FLIPPER, str(flip), str(work / "d-parked"), str(outside)]
    with trio.fail_after(120):
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert process.stdin is not None
        assert process.stdout is not None
        try:
            assert await _line(process.stdout) == "ready"
            async with trio.open_nursery() as nursery:
                for first in range(WRITERS):
                    nursery.start_soon(writer, first)
        finally:
            await process.stdin.aclose()
            flips = int(await _line(process.stdout))
            await process.wait()
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert flips > 0
    # The race ran: writes met the directory and met the link (refused as outside).
    assert len(list(flip.iterdir())) == landed > 0  # and every write that succeeded is inside
    assert seen_outside > 0


WRITES, WRITERS = 1200, 4


# -- links and special files ------------------------------------------------------------------


async def test_a_hard_link_is_treated_as_outside_for_reads_and_writes(
    places: tuple[Path, Path],
) -> None:
    work, outside = places
    os.link(outside / "secret.txt", work / "linked.txt")
    read = await call("read_file", work, path="linked.txt")
    assert refused(read, "linked.txt", "has 2 hard links", "outside the session's directories")
    assert "secret" not in read.content.replace("secret.txt", "")
    edit = await call("edit_file", work, path="linked.txt", old_string="secret", new_string="x")
    write = await call("write_file", work, path="linked.txt", content="x")
    for outcome in (edit, write):
        assert refused(outcome, "has 2 hard links")
    assert (outside / "secret.txt").read_text() == "secret"
    assert (work / "linked.txt").stat().st_ino == (outside / "secret.txt").stat().st_ino


#: Each file tool's arguments besides the path.
ARGUMENTS: dict[str, dict[str, Any]] = {
    "read_file": {},
    "write_file": {"content": "x"},
    "edit_file": {"old_string": "a", "new_string": "b"},
}


@pytest.mark.real_clock
async def test_a_fifo_a_socket_and_a_device_are_refused_naming_the_kind(
    places: tuple[Path, Path],
) -> None:
    work, _ = places
    os.mkfifo(work / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(work / "sock"))
    try:
        with trio.fail_after(20):  # a FIFO with no writer must not be waited on
            for tool, args in ARGUMENTS.items():
                pipe = await call(tool, work, path="pipe", **args)
                assert refused(pipe, str(work / "pipe"), "is a FIFO (named pipe), not a regular")
                sock_ = await call(tool, work, path="sock", **args)
                assert refused(sock_, str(work / "sock"), "is a socket, not a regular file")
            # /dev as one of the session's roots: a real character device inside the roots.
            zero = await call("read_file", work, Path("/dev"), path="/dev/zero")
            assert refused(zero, "/dev/zero", "is a character device, not a regular file")
            # And made in the cwd where mknod is allowed (root, a file system without nodev):
            # /dev/zero's numbers, and a loop device's (opening one reads nothing).
            for name, mode, kind in (
                ("zero", stat.S_IFCHR, "character device"),
                ("loop", stat.S_IFBLK, "block device"),
            ):
                try:
                    os.mknod(
                        work / name,
                        mode | 0o600,
                        os.makedev(1, 5) if name == "zero" else os.makedev(7, 0),
                    )
                except PermissionError:
                    continue  # the FIFO above stands in
                for tool, args in ARGUMENTS.items():
                    outcome = await call(tool, work, path=name, **args)
                    assert refused(outcome, f"is a {kind}, not a regular file"), tool
            sub = await call("read_file", work, path=".")
            assert refused(sub, "names a directory")
            (work / "sub").mkdir()
            assert refused(await call("read_file", work, path="sub"), "is a directory")
    finally:
        sock.close()
    assert stat.S_ISFIFO((work / "pipe").lstat().st_mode)  # nothing was written over them


# -- bounded reads ----------------------------------------------------------------------------


async def test_reading_on_as_each_result_says_gives_the_whole_file_once(
    places: tuple[Path, Path],
) -> None:
    work, _ = places
    rng = random.Random(23)
    words = ["a", "bé", "日本語", "x" * 40, ""]
    lines = [" ".join(rng.choices(words, k=rng.randint(0, 6))) for _ in range(300)]
    text = "\n".join(lines) + "\n"
    (work / "f.txt").write_text(text)
    for caps, limit in ((ReadCaps(lines=7, bytes=400), None), (ReadCaps(bytes=300), 11)):
        offset, pieces = 1, []
        while True:
            extra: dict[str, Any] = {"limit": limit} if limit else {}
            outcome = await call("read_file", work, caps=caps, path="f.txt", offset=offset, **extra)
            body, _, note = outcome.content.rpartition("\n[")
            assert note.startswith(f"lines {offset}-"), note
            shown = body + "\n"
            assert len(shown.encode()) <= caps.bytes
            assert shown.count("\n") <= (limit or caps.lines)
            pieces.append(shown)
            if "read on with offset=" not in note:
                break
            offset = int(note.rsplit("offset=", 1)[1].rstrip("]"))
        assert "".join(pieces) == text


async def test_a_read_without_caps_hit_is_the_file_and_a_read_past_the_end_says_so(
    places: tuple[Path, Path],
) -> None:
    work, _ = places
    (work / "f.txt").write_text("one\ntwo\nthree")
    assert (await call("read_file", work, path="f.txt")).content == "one\ntwo\nthree"
    second = await call("read_file", work, path="f.txt", offset=2, limit=1)
    assert second.content == "two\n[lines 2-2 of f.txt; more follows: read on with offset=3]"
    past = await call("read_file", work, path="f.txt", offset=9)
    assert not past.is_error
    assert past.content == "(nothing from line 9: f.txt has fewer lines)"
    (work / "e.txt").write_text("")
    assert (await call("read_file", work, path="e.txt")).content == "(empty)"


async def test_a_line_longer_than_the_cap_is_cut_at_a_character_and_says_so(
    places: tuple[Path, Path],
) -> None:
    work, _ = places
    (work / "f.txt").write_text("é" * 100 + "\nnext\n")
    outcome = await call("read_file", work, caps=ReadCaps(bytes=51), path="f.txt")
    assert outcome.content.startswith("é" * 25 + "\n[lines 1-1 of f.txt; line 1 is longer")
    assert "only its first 50 are shown" in outcome.content
    assert outcome.content.endswith("read on with offset=2]")


async def test_a_100_mb_one_line_file_is_read_capped_in_small_memory(
    places: tuple[Path, Path],
) -> None:
    work, _ = places
    with open(work / "big.txt", "wb") as file:
        block = b"y" * (1 << 20)
        for _ in range(100):
            file.write(block)
    tracemalloc.start()
    try:
        outcome = await call("read_file", work, path="big.txt")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    caps = ReadCaps()
    assert outcome.content.startswith("y" * caps.bytes + "\n[lines 1-1 of big.txt; line 1")
    assert len(outcome.content) < caps.bytes + 300
    assert peak < 8 * caps.bytes  # a few copies of the cap (2 MiB at most), never the file


async def test_caps_and_arguments_that_cannot_be_used_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match=r"ReadCaps\.lines must be 1 or more, not 0"):
        ReadCaps(lines=0)
    with pytest.raises(ValueError, match=r"ReadCaps\.bytes must be 1 or more, not -1"):
        ReadCaps(bytes=-1)
    for field in ("offset", "limit"):
        with pytest.raises(
            msgspec.ValidationError, match=rf"Expected `int` >= 1 - at `\$.{field}`"
        ):
            msgspec.json.decode(json.dumps({"path": "a", field: 0}), type=ReadArgs)


async def test_caps_given_to_the_runtime_hold_for_its_agents_calls(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    reads = [
        CallTool("read_file", {"path": "f.txt"}),
        CallTool("read_file", {"path": "f.txt", "offset": 0}),
    ]
    model = ScriptedModel([reads, [Say("done")]], delay=0)
    async with open_runtime(model=model, tools=file_tools(ReadCaps(lines=3))) as rt:
        handle = await rt.agents.create(agent_id="a", session_id="s", cwd=str(tmp_path))
        handle.agent.send("read")
        await handle.agent.when_idle()
        capped, bad = [e for e in handle.agent.session.events if isinstance(e, ToolResult)]
    assert capped.content == (
        "line 1\nline 2\nline 3\n[lines 1-3 of f.txt; more follows: read on with offset=4]"
    )
    assert bad.is_error
    assert "`$.offset`" in bad.content


# -- the editor's files -----------------------------------------------------------------------


async def test_the_editors_files_are_used_after_the_path_is_confined(
    places: tuple[Path, Path],
) -> None:
    work, outside = places
    (work / "a.txt").write_text("on disk")
    (work / "al").symlink_to("a.txt")
    editor = Editor({str(work / "a.txt"): "one\ntwo\nthree\n"})
    read = await call("read_file", work, editor=editor, path="al", offset=2, limit=1)
    assert read.content == "two\n[lines 2-2 of al; more follows: read on with offset=3]"
    edit = await call(
        "edit_file", work, editor=editor, path="a.txt", old_string="two", new_string="2"
    )
    assert not edit.is_error, edit.content
    assert editor.buffers[str(work / "a.txt")] == "one\n2\nthree\n"
    assert (work / "a.txt").read_text() == "on disk"
    asked = list(editor.asked)
    for path in ("../outside/secret.txt", "../outside/new.txt"):
        outcome = await call("write_file", work, editor=editor, path=path, content="x")
        assert refused(outcome, "outside the session's directories")
    os.link(outside / "secret.txt", work / "hard.txt")
    assert refused(await call("read_file", work, editor=editor, path="hard.txt"), "hard links")
    assert editor.asked == asked  # the editor was never asked for a refused path


# -- a read that never returns ----------------------------------------------------------------


@contextmanager
def held_fifo(path: Path) -> Iterator[None]:
    """A FIFO at `path` with a writer that never writes: a reader's read blocks until the end."""
    os.mkfifo(path)
    writer = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    try:
        yield
    finally:
        os.close(writer)  # the stuck read sees end of file and its thread ends


@pytest.fixture
def fifo_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The regular-file check lets FIFOs through (as tests/files_hang_child.py does)."""
    checked = confine._check_regular

    def check(info: os.stat_result, shown: str) -> None:
        if not stat.S_ISFIFO(info.st_mode):
            checked(info, shown)

    monkeypatch.setattr(confine, "_check_regular", check)


@pytest.mark.real_clock
@pytest.mark.usefixtures("fifo_passes")
async def test_a_cancel_answers_a_read_stuck_in_the_kernel_at_once(
    places: tuple[Path, Path],
) -> None:
    work, _ = places
    with held_fifo(work / "pipe"), trio.fail_after(20):
        with trio.move_on_after(0.5) as waited:
            await call("read_file", work, path="pipe")
        assert waited.cancelled_caught  # it was stuck, and the cancel reached it
        assert trio.current_time() - waited.deadline < GRACE


#: Seconds a cancel, a close or end of input may take to be answered (the teardown's own
#: bound is 5 s; the rest is a loaded machine's slack).
GRACE = 8.0


def _tool_running(frame: dict[str, Any]) -> bool:
    update = frame.get("params", {}).get("update", {}) if frame.get("method") else {}
    return bool(update.get("sessionUpdate") == "tool_call_update") and (
        update.get("status") == "in_progress"
    )


async def _stuck(peer: AcpProcess, work: Path) -> tuple[str, int]:
    """A new session whose prompt's read_file is stuck in the kernel; its id, the prompt's."""
    session = await peer.new_session(str(work))
    prompt = [{"type": "text", "text": "read the pipe"}]
    request = await peer.request("session/prompt", {"sessionId": session, "prompt": prompt})
    while not any(_tool_running(frame) for frame in peer.frames):
        await peer.call("session/list", {})  # frames are read while it is answered
        await trio.sleep(0.05)
    await trio.sleep(0.2)  # into the blocking read
    return session, request


async def _loads_elsewhere(home: Path, work: Path, session: str, ended: type[object]) -> None:
    async with acp_process(home, "--model", "scripted:0") as other:
        load = {"sessionId": session, "cwd": str(work), "mcpServers": []}
        answer = await other.call("session/load", load)
        assert "result" in answer, answer
        assert await other.close() == 0
    _, events = await JsonlPersistence(home / "sessions").load(session)
    (result,) = [e for e in events if isinstance(e, ToolResult)]
    assert result.is_error
    assert result.content.startswith("aborted")
    (turn_end,) = [e for e in events if isinstance(e, TurnEnd)]
    assert isinstance(turn_end.reason, ended)


@pytest.mark.real_clock
@pytest.mark.parametrize("end", ["cancel", "close", "end of input"])
async def test_a_stuck_read_never_holds_a_session_past_a_cancel_a_close_or_eof(
    end: str, tmp_path: Path
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    hang = (sys.executable, str(HANG_CHILD))
    with held_fifo(work / "pipe"), trio.fail_after(90):
        async with acp_process(home, greenroom=hang, cwd=work) as peer:
            session, prompt = await _stuck(peer, work)
            start = trio.current_time()
            if end == "cancel":
                cancel = {"jsonrpc": "2.0", "method": "session/cancel"}
                await peer.send_raw(
                    json.dumps({**cancel, "params": {"sessionId": session}}).encode() + b"\n"
                )
                answer = await peer.response(prompt)
                assert answer["result"] == {"stopReason": "cancelled"}
                assert trio.current_time() - start < GRACE
                closed = await peer.call("session/close", {"sessionId": session})
                assert "result" in closed, closed
            elif end == "close":
                closed = await peer.call("session/close", {"sessionId": session})
                assert "result" in closed, closed
                assert trio.current_time() - start < GRACE
                answer = await peer.response(prompt)
                assert answer["result"] == {"stopReason": "cancelled"}
            else:
                assert await peer.close() == 0
                assert trio.current_time() - start < GRACE
            # The thread is still stuck in this process (but at end of input); the session
            # is free all the same.
            await _loads_elsewhere(home, work, session, Aborted if end == "cancel" else Disposed)
            if end != "end of input":
                start = trio.current_time()
                assert await peer.close() == 0
                assert trio.current_time() - start < GRACE
