"""Commands in a sandbox the kernel enforces: the attacks of issue 43, on this machine's kernel.

Real processes, real Landlock, seccomp and cgroups: each attack is a command
greenroom runs, and each test checks what the kernel let it do (nothing
outside its sandbox) and that greenroom and the session stay up. As root (this
machine's user, CI's), and as ``nobody`` (``tests/sandbox_child.py``, a child
that drops to uid 65534). A test that needs a kernel feature says so when the
kernel lacks it (`needs`); the fallbacks are tested on their own (no Landlock:
a probe that finds none; no cgroup: ``nobody`` without a delegated one).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import trio

from greenroom import open_runtime
from greenroom.acp.presenter import Presenter
from greenroom.actors.types import PermissionRequest
from greenroom.models.scripted import CallTool, Say, ScriptedModel
from greenroom.procs import cgroup_places, owner, populated
from greenroom.protocol.events import (
    PermissionDecision,
    Protections,
    SandboxProtections,
    ToolResult,
)
from greenroom.protocol.mcp import McpStdioServer, check_servers
from greenroom.sandbox import Access, Sandbox, Sandboxes, SandboxSettings, describe, launcher
from greenroom.sandbox.cgroups import Places
from greenroom.session.persistence import JsonlPersistence
from greenroom.session.transcript import transcript
from greenroom.tools.bash.local import LocalBashExecutor
from greenroom.tools.bash.seam import BashExecRequest, BashRunResult
from greenroom.tools.bash.tools import bash_plugin
from greenroom.tools.mcp import MCP_STATUS, McpStatus
from tests import TESTS
from tests.tools.test_mcp import served
from tests.tools.test_orphans import launchers_of

pytestmark = pytest.mark.real_clock

LIMIT = 30.0
PROTECTIONS = Sandboxes().protections  # what this kernel gives this process


def needs(*features: str) -> None:
    """Skip, saying so, when this kernel lacks a feature the test exercises (never here)."""
    missing = [f for f in features if not getattr(PROTECTIONS, f)]
    if missing:
        pytest.skip(f"this kernel lacks {', '.join(missing)}: its fallback is tested instead")


@asynccontextmanager
async def executor(tmp_path: Path, **settings: int | None) -> AsyncIterator[LocalBashExecutor]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    async with (
        Sandboxes(SandboxSettings(**settings)) as sandboxes,
        LocalBashExecutor(str(work), sandboxes=sandboxes) as ex,
    ):
        yield ex


async def run(
    ex: LocalBashExecutor,
    command: str,
    access: Access,
    *,
    session: str = "s",
    timeout_ms: int | None = None,
) -> BashRunResult:
    sandbox = Sandbox(access, session, (ex.default_workdir,))
    request = BashExecRequest(command=command, sandbox=sandbox, timeout_ms=timeout_ms)
    return await ex.run(ex.resolve(request))


def snapshot(place: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under `place`: its mode and its bytes."""
    return {
        str(p.relative_to(place)): (p.lstat().st_mode, p.read_bytes() if p.is_file() else b"")
        for p in sorted(place.rglob("*"))
    }


def running(marker: str) -> list[int]:
    """Live processes (not zombies) with `marker` among their arguments."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                args = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
                state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker.encode() in args and state != "Z":
                found.append(int(name))
    return found


def daemonizing(ready: Path) -> str:
    """A command that leaves a daemon no mark finds (a session of its own, an empty
    environment, not dumpable), whose arguments name `ready`, which it creates."""
    script = (
        "import ctypes, sys, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0);"
        " open(sys.argv[1], 'w').close(); time.sleep(1000)"
    )
    return (
        f"setsid -f env -i {sys.executable} -c {script!r} {ready}; "
        f"until [ -e {ready} ]; do sleep 0.01; done"
    )


# -- writes ----------------------------------------------------------------------------------

#: Each fails as a whole if any step of it fails.
WRITES = {
    "plain": "echo x > {outside}/new",
    "symlink": "ln -s {outside} link && echo x > link/new",
    "hard link": "ln {outside}/victim hard && echo x >> hard",
    "/proc/self/root": "echo x > /proc/self/root{outside}/new",
    "rename in": "mv {outside}/victim ./moved",
    "truncate": "truncate -s 0 {outside}/victim",
    "a file through a symlink": "ln -s {outside}/victim l && echo x >> l",
    "bind mount": "mount --bind . {outside} && echo x > {outside}/new",
    "a namespace's mount": "unshare -rm sh -c 'mount --bind . {outside} && echo x > {outside}/new'",
    "mknod": "mknod {outside}/null c 1 3",
}


@pytest.mark.parametrize("attack", WRITES)
async def test_a_workspace_command_writes_nothing_outside_its_roots(
    attack: str, tmp_path: Path
) -> None:
    needs("filesystem")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("kept")
    before = snapshot(outside)
    with trio.fail_after(LIMIT):
        async with executor(tmp_path) as ex:
            result = await run(ex, WRITES[attack].format(outside=outside), "workspace-write")
            assert result.exit_code != 0, result
            assert snapshot(outside) == before
            # The same command may write in its roots: the refusal is its sandbox's.
            inside = await run(ex, "echo x > new && mkdir d && mv new d/", "workspace-write")
            assert inside.exit_code == 0, inside
            assert (tmp_path / "work" / "d" / "new").read_text() == "x\n"


async def test_a_root_command_loses_what_reaches_under_its_sandbox(tmp_path: Path) -> None:
    """A device node made in its roots would be a way around them (a disk, memory): a
    confined root command has no ``CAP_MKNOD``, nor the others that act on the kernel."""
    needs("filesystem")
    if os.geteuid() != 0:
        pytest.skip("capabilities are root's to lose")
    with trio.fail_after(LIMIT):
        async with executor(tmp_path) as ex:
            result = await run(
                ex, "grep -E 'CapBnd|NoNewPrivs' /proc/self/status", "workspace-write"
            )
            fields = dict(line.split(":\t") for line in result.stdout.text.splitlines())
            bounding = int(fields["CapBnd"], 16)
            assert [c for c in launcher.DROPPED_CAPABILITIES if bounding >> c & 1] == []
            assert fields["NoNewPrivs"] == "1"
            for command in ("mknod null c 1 3", "unshare -m true"):
                refused = await run(ex, command, "workspace-write")
                assert refused.exit_code != 0, (command, refused)
            assert not (tmp_path / "work" / "null").exists()
            unconfined = await run(ex, "grep CapBnd /proc/self/status", "full-access")
            assert int(unconfined.stdout.text.split()[1], 16) >> 21 & 1  # CAP_SYS_ADMIN


async def test_read_only_changes_nothing_but_its_own_temporary_directory(tmp_path: Path) -> None:
    needs("filesystem", "read_only")
    with trio.fail_after(LIMIT):
        async with executor(tmp_path) as ex:
            work = tmp_path / "work"
            (work / "f").write_text("kept")
            (work / "f").chmod(0o644)
            before = snapshot(work)
            for command in (
                "echo x > f",
                "echo x > g",
                "rm f",
                "chmod 600 f",
                "touch -m -d 2000-01-01 f",
                "chown nobody f",
                'python3 -c \'import os; os.setxattr("f", "user.x", b"1")\'',
            ):
                result = await run(ex, command, "read-only")
                assert result.exit_code != 0, (command, result)
            assert snapshot(work) == before
            mine = await run(
                ex, 'echo x > "$TMPDIR/t" && cat "$TMPDIR/t" && echo "$TMPDIR"', "read-only"
            )
            assert mine.exit_code == 0, mine
            tmpdir = mine.stdout.text.split()[1]
            assert stat.S_IMODE(os.stat(tmpdir).st_mode) == 0o700
            theirs = await run(ex, 'echo "$TMPDIR"; cat ' + tmpdir + "/t", "read-only", session="t")
            assert theirs.stdout.text.split()[0] != tmpdir  # each session has its own
            await ex.end_session("s")
            assert not os.path.exists(tmpdir)  # and it goes with the session


async def test_read_only_opens_no_socket(tmp_path: Path) -> None:
    needs("filesystem", "read_only")
    tcp = socket.create_server(("127.0.0.1", 0))
    tcp.setblocking(False)
    path = tmp_path / "work" / "unix.sock"
    path.parent.mkdir()
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(path))
    unix.listen()
    unix.setblocking(False)
    port = tcp.getsockname()[1]
    attempts = (
        f"exec 3<>/dev/tcp/127.0.0.1/{port}",
        "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)'",
        f"python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{path}\")'",
    )
    try:
        with trio.fail_after(LIMIT):
            async with executor(tmp_path) as ex:
                for command in attempts:
                    result = await run(ex, command, "read-only")
                    assert result.exit_code != 0
                    assert "Permission denied" in result.stderr.text, result
                for listener in (tcp, unix):
                    with pytest.raises(BlockingIOError):
                        listener.accept()
                # Workspace write has the network: the refusals above were read only's.
                for command in attempts[0], attempts[2]:
                    assert (await run(ex, command, "workspace-write")).exit_code == 0
                for listener in (tcp, unix):
                    listener.accept()[0].close()
    finally:
        tcp.close()
        unix.close()


# -- signals and escapes ---------------------------------------------------------------------


async def test_a_command_cannot_signal_greenroom_its_keeper_the_launcher_or_another_command(
    tmp_path: Path,
) -> None:
    needs("signals")
    with trio.fail_after(LIMIT):
        async with executor(tmp_path) as ex:
            other_spec = ex.resolve(
                BashExecRequest(
                    command="echo $$; sleep 100",
                    sandbox=Sandbox("workspace-write", "other", (ex.default_workdir,)),
                )
            )
            other = await ex.start(other_spec)
            while not (text := ex.read_output(other.id).delta):
                await trio.sleep(0.01)
            (launcher_pid,) = launchers_of(os.getpid())
            keeper = _keeper()
            targets = [os.getpid(), keeper, launcher_pid, int(text)]
            command = "; ".join(f"kill -9 {pid}; kill -STOP {pid}" for pid in targets)
            result = await run(ex, command, "workspace-write")
            assert result.stderr.text.count("Operation not permitted") == 2 * len(targets)
            for pid in targets:
                os.kill(pid, 0)  # all still there
                assert _state(pid) != "T"
            assert ex.get(other.id).status == "running"  # type: ignore[union-attr]
            assert (await run(ex, "echo still", "workspace-write")).stdout.text == "still\n"
            ex.kill(other.id)


def _keeper() -> int:
    token = owner().token.encode()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                args = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if token in args and any(a.endswith(b"procs.py") for a in args):
                return int(name)
    raise AssertionError("no keeper runs")


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def test_a_daemon_that_left_every_mark_dies_with_its_command(tmp_path: Path) -> None:
    needs("cgroup")
    marker = f"daemon-{secrets.token_hex(6)}"
    ready = tmp_path / "work" / marker
    with trio.fail_after(LIMIT):
        async with executor(tmp_path) as ex:
            result = await run(ex, daemonizing(ready), "workspace-write")
            assert result.exit_code == 0, result
            assert running(str(ready)) == []
            # In the background, killed: the same.
            ready.unlink()
            spec = ex.resolve(
                BashExecRequest(
                    command=daemonizing(ready) + "; sleep 100",
                    sandbox=Sandbox("workspace-write", "s", (ex.default_workdir,)),
                )
            )
            task = await ex.start(spec)
            while not ready.exists():
                await trio.sleep(0.01)
            (daemon,) = running(str(ready))
            environ = Path(f"/proc/{daemon}/environ").read_bytes()
            assert b"GREENROOM_OWNER" not in environ  # no mark: only its cgroup finds it
            ex.kill(task.id)
            await ex.wait(task.id)
            assert running(str(ready)) == []


async def test_a_fork_bomb_stops_at_the_sessions_pids_limit_and_dies_with_it(
    tmp_path: Path,
) -> None:
    needs("cgroup", "pids")
    with trio.fail_after(LIMIT):
        async with executor(tmp_path, pids=48) as ex:
            assert ex.sandboxes.protections.pids == 48
            bomb = await run(ex, "b() { b | b & }; b; sleep 1", "workspace-write", timeout_ms=2000)
            assert "Resource temporarily unavailable" in bomb.stderr.text, bomb
            assert _session_cgroups() != []
            after = await run(ex, "echo alive", "workspace-write", session="t")
            assert after.stdout.text == "alive\n"
            await ex.end_session("s")
            await ex.end_session("t")
        assert _session_cgroups() == []  # nothing was left in them


def _session_cgroups() -> list[str]:
    """The session cgroups this process has in the v1 pids hierarchy (`cgroups.Places`)."""
    place = Places.probe().limits.get("pids")
    if place is None or not os.path.isdir(place):
        return []
    return [d for _path, dirs, _files in os.walk(place) for d in dirs if d.startswith("s")]


async def test_filling_memory_is_killed_at_the_sessions_memory_limit(tmp_path: Path) -> None:
    needs("cgroup", "memory")
    with trio.fail_after(LIMIT):
        async with executor(tmp_path, memory=64 * 1024**2) as ex:
            hog = f"{sys.executable} -c 'b = bytearray(512 << 20); print(len(b))'"
            result = await run(ex, f"exec {hog}", "workspace-write")
            assert result.signal == "SIGKILL", result
            assert result.stdout.text == ""
            assert (await run(ex, "echo alive", "workspace-write")).stdout.text == "alive\n"


# -- the modes and the gate ------------------------------------------------------------------


class Asked:
    """A permissions policy that answers from a list and keeps what it was asked."""

    def __init__(self, *answers: PermissionDecision) -> None:
        self.answers = list(answers)
        self.asked: list[PermissionRequest] = []

    async def decide(self, request: PermissionRequest) -> PermissionDecision:
        await trio.lowlevel.checkpoint()
        self.asked.append(request)
        return self.answers.pop(0)


def bash(command: str, **more: object) -> CallTool:
    return CallTool("bash", {"command": command, "description": "test", **more})


async def results_of(
    tmp_path: Path, mode: str, calls: list[CallTool], policy: Asked
) -> list[ToolResult]:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    model = ScriptedModel([[call] for call in calls] + [[Say("done")]])
    async with open_runtime(model=model, permissions=policy, workdir=str(work)) as rt:
        await rt.plug("tool-bash", bash_plugin)
        handle = await rt.agents.create(agent_id="a", session_id="s", cwd=str(work))
        handle.agent.configure("mode", mode)
        handle.agent.send("go")
        await handle.agent.when_idle()
        return [e for e in handle.agent.session.events if isinstance(e, ToolResult)]


async def test_read_only_and_accept_edits_run_commands_in_their_sandbox_without_asking(
    tmp_path: Path,
) -> None:
    needs("filesystem", "read_only")
    outside = tmp_path / "outside"
    write = bash(f"echo x > in && echo x > {outside}")
    with trio.fail_after(LIMIT):
        policy = Asked()
        (read_only,) = await results_of(tmp_path, "read-only", [write], policy)
        (accepting,) = await results_of(tmp_path, "accept-edits", [write], policy)
    assert policy.asked == []
    assert "read only" in read_only.content
    assert "the sandbox refused" in read_only.content
    assert (tmp_path / "work" / "in").exists()  # accept edits wrote in its root...
    assert not outside.exists()  # ... and nowhere else
    assert "the sandbox refused what was denied above" in accepting.content


async def test_ask_and_full_access_ask_and_full_access_runs_unsandboxed(tmp_path: Path) -> None:
    needs("filesystem")
    outside = tmp_path / "outside"
    write = bash(f"echo x > {outside}")
    with trio.fail_after(LIMIT):
        asked = Asked("allow_once")
        (default,) = await results_of(tmp_path, "default", [write], asked)
        assert not outside.exists()
        assert "Permission denied" in default.content
        full = Asked("allow_once")
        await results_of(tmp_path, "full-access", [write], full)
        assert outside.read_text() == "x\n"
    assert [r.tool for r in asked.asked + full.asked] == ["bash", "bash"]


async def test_an_unsandboxed_call_is_asked_every_time_and_refused_in_read_only(
    tmp_path: Path,
) -> None:
    needs("filesystem")
    outside = tmp_path / "outside"
    escape = bash(f"echo x > {outside}", unsandboxed=True)
    with trio.fail_after(LIMIT):
        # "Always allow bash" does not cover a call that leaves the sandbox.
        policy = Asked("allow_always", "allow_always", "allow_once")
        first, _, escaped = await results_of(
            tmp_path, "default", [bash("true"), bash("true"), escape], policy
        )
        assert [r.once for r in policy.asked] == [False, True]
        assert "(unsandboxed)" in policy.asked[1].title
        assert outside.read_text() == "x\n"
        refused = Asked()
        (result,) = await results_of(tmp_path, "read-only", [escape], refused)
    assert refused.asked == []
    assert result.error is not None
    assert result.error.code == "read-only"
    assert not first.is_error
    assert not escaped.is_error


async def test_a_background_task_keeps_the_sandbox_it_started_with(tmp_path: Path) -> None:
    needs("filesystem")
    work = tmp_path / "work"
    work.mkdir()
    go = work / "go"
    waits = f"until [ -e {go} ]; do sleep 0.01; done; echo x > late"
    model = ScriptedModel([[bash(waits, run_in_background=True)], [Say("started")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model, workdir=str(work)) as rt:
            await rt.plug("tool-bash", bash_plugin)
            handle = await rt.agents.create(agent_id="a", session_id="s", cwd=str(work))
            handle.agent.configure("mode", "read-only")
            handle.agent.send("go")
            await handle.agent.when_idle()
            handle.agent.configure("mode", "full-access")
            go.touch()
            (task,) = rt.bash.list()
            done = await rt.bash.wait(task.id)
    assert done.exit_code != 0  # it started read only, and stayed so
    assert not (work / "late").exists()


# -- told, not assumed -----------------------------------------------------------------------


async def test_the_session_the_editor_and_the_model_are_told_what_holds(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    model = ScriptedModel([[bash("true")], [bash("true")], [Say("done")]])
    with trio.fail_after(LIMIT):
        async with open_runtime(model=model, workdir=str(work)) as rt:
            await rt.plug("tool-bash", bash_plugin)
            handle = await rt.agents.create(agent_id="a", session_id="s", cwd=str(work))
            handle.agent.send("go")
            await handle.agent.when_idle()
            session = handle.agent.session
            protections = rt.bash.sandboxes.protections
            schemas = {s.name: s for s in rt.tools.schemas()}
    told = [e for e in session.events if isinstance(e, SandboxProtections)]
    assert [e.protections for e in told] == [protections]  # once in the life
    lines = [line for line in transcript(session.header, session.events) if "sandbox:" in line]
    assert lines == ["  sandbox: " + describe(protections)]
    shown = Presenter(["m"], {}, protections).modes(session).available_modes
    modes = {m.id: m.description for m in shown}
    assert set(modes) == {"default", "accept-edits", "read-only", "full-access"}
    assert "Landlock" in modes["read-only"]
    assert "unsandboxed" in modes["full-access"]
    assert "sandbox the kernel enforces" in schemas["bash"].description


async def test_without_landlock_the_modes_keep_their_promise_and_it_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The fallback of a kernel without Landlock, nor a cgroup of ours: read only refuses
    commands (nothing confines them), the others ask and run them unconfined."""
    monkeypatch.setattr(launcher, "landlock_abi", lambda: 0)
    monkeypatch.setattr(Places, "probe", classmethod(lambda cls: cls(None, {})))
    outside = tmp_path / "outside"
    write = bash(f"echo x > {outside}")
    with trio.fail_after(LIMIT), caplog.at_level(logging.WARNING, "greenroom.sandbox"):
        refused = Asked()
        (result,) = await results_of(tmp_path, "read-only", [write], refused)
        assert result.error is not None
        assert result.error.code == "read-only"
        asked = Asked("allow_once")
        (accepted,) = await results_of(tmp_path, "accept-edits", [write], asked)
    assert not accepted.is_error
    assert outside.read_text() == "x\n"
    assert [r.tool for r in asked.asked] == ["bash"]
    assert "offers no sandbox" in caplog.text
    none = Sandboxes().protections
    assert none == Protections()
    shown = Presenter(["m"], {}, none).modes(session_of_default_mode()).available_modes
    modes = {m.id: m.description for m in shown}
    assert "commands refused" in modes["read-only"]
    assert "commands run unsandboxed" in modes["default"]


def session_of_default_mode() -> Any:
    return SimpleNamespace(config={})


# -- MCP servers -----------------------------------------------------------------------------


async def test_an_mcp_server_runs_in_its_sessions_sandbox_unless_its_spec_says(
    tmp_path: Path,
) -> None:
    needs("filesystem", "read_only")
    work = tmp_path / "work"
    work.mkdir()
    confined = msgspec.structs.replace(served("r", "hostile", record=work / "r"), sandbox=None)
    chosen = msgspec.structs.replace(
        served("w", "hostile", record=work / "w"), sandbox="workspace-write"
    )
    with trio.fail_after(LIMIT):
        async with open_runtime(persistence=JsonlPersistence(tmp_path / "sessions")) as rt:
            statuses: list[McpStatus] = []
            rt.hooks.on(MCP_STATUS, lambda _agent, status: statuses.append(status))
            handle = await rt.agents.create(agent_id="a", session_id="s", cwd=str(work))
            handle.agent.configure("mode", "read-only")
            await handle.agent.when_idle()
            await handle.dispose()
            # Its servers start with the session read only: the confined one cannot write
            # its record (and fails to start), the one its spec gives workspace write can.
            handle = await rt.agents.resume(
                agent_id="a", session_id="s", mcp_servers=[confined, chosen]
            )
            assert next(s for s in statuses if s.server == "r").state == "failed"
            assert ("w", "ready") in [(s.server, s.state) for s in statuses]
            assert not (work / "r").exists()
            assert (work / "w").exists()
            await handle.dispose()


def test_an_mcp_servers_sandbox_is_checked() -> None:
    server = McpStdioServer(name="a", command="x", sandbox="everything")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"mcpServers\[0\].sandbox: 'everything'"):
        check_servers([server])


# -- the launcher ----------------------------------------------------------------------------


async def test_a_killed_launcher_is_started_again(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with executor(tmp_path) as ex:
            assert (await run(ex, "echo one", "workspace-write")).stdout.text == "one\n"
            (first,) = launchers_of(os.getpid())
            os.kill(first, signal.SIGKILL)
            while first in launchers_of(os.getpid()):
                await trio.sleep(0.01)
            assert (await run(ex, "echo two", "workspace-write")).stdout.text == "two\n"
            assert launchers_of(os.getpid()) != [first]


# -- as nobody -------------------------------------------------------------------------------

CHILD = TESTS / "sandbox_child.py"
NOBODY = 65534


def _others_reach(path: Path) -> bool:
    """Whether a user of no group of the owner's (`nobody`) may reach `path`."""
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in path.resolve().parents)


def _python_for_nobody() -> str | None:
    """An interpreter `nobody` may run, of this one's version (this one may be in a home
    only root reaches)."""
    for candidate in (
        sys.executable,
        f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
    ):
        real = Path(candidate).resolve()
        if real.exists() and _others_reach(real) and real.stat().st_mode & stat.S_IXOTH:
            return candidate
    return None


@pytest.fixture
def nobodys() -> Iterator[Path]:
    """A directory of nobody's (pytest's own are root's alone)."""
    home = Path(tempfile.mkdtemp(prefix="greenroom-nobody-"))
    os.chown(home, NOBODY, NOBODY)
    try:
        yield home
    finally:
        shutil.rmtree(home)


def _as_nobody(home: Path, delegated: bool) -> tuple[dict[str, object], Path, str]:
    python = _python_for_nobody()
    if python is None:
        pytest.skip("no interpreter here that nobody may run")
    work = home / "work"
    work.mkdir()
    outside = home / "outside"
    outside.write_text("kept")
    for path in (work, outside):
        os.chown(path, NOBODY, NOBODY)
    marker = str(work / f"daemon-{secrets.token_hex(6)}")
    args = [python, str(CHILD), str(work), str(outside), marker]
    cgroup = None
    if delegated:
        cgroup = Path(cgroup_places()[""]) / f"greenroom-test-{secrets.token_hex(6)}"
        cgroup.mkdir()
        for name in ("", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control"):
            os.chown(cgroup / name, NOBODY, NOBODY)
        args.append(str(cgroup))
    site = [p for p in sys.path if p.endswith("site-packages")]
    for needed in (CHILD, *(Path(p) / "trio" for p in site if (Path(p) / "trio").exists())):
        assert _others_reach(needed), (
            f"nobody cannot reach {needed}: a directory above it lets in its owner alone"
            " (a checkout under a 0700 directory): clone greenroom where others may read"
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CHILD.parent.parent), *site])}
    try:
        done = subprocess.run(
            args, cwd=work, env=env, capture_output=True, text=True, timeout=LIMIT, check=False
        )
    finally:
        if cgroup is not None:
            # The child's keeper and launcher end once it has; then its tree is empty.
            deadline = time.monotonic() + LIMIT
            while populated(str(cgroup)) and time.monotonic() < deadline:
                time.sleep(0.01)
            for directory in sorted(cgroup.rglob("*"), reverse=True):
                if directory.is_dir():
                    directory.rmdir()
            cgroup.rmdir()
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), outside, marker


def test_as_nobody_in_a_delegated_cgroup_nothing_escapes(nobodys: Path) -> None:
    needs("filesystem", "signals", "cgroup")
    results, outside, marker = _as_nobody(nobodys, delegated=True)
    assert results["uid"] == NOBODY
    assert results["protections"].get("cgroup") is True  # type: ignore[attr-defined]
    code, error = results["write"]  # type: ignore[misc]
    assert code != 0
    assert "Permission denied" in error
    assert outside.read_text() == "kept"
    _code, error = results["kill"]  # type: ignore[misc]
    assert error.count("Operation not permitted") == 2  # itself, its keeper: still up
    assert results["daemon"][0] == 0  # type: ignore[index]
    assert results["daemon_alive"] is False
    assert running(marker) == []


def test_as_nobody_without_a_cgroup_the_fallback_is_said_and_the_daemon_escapes(
    nobodys: Path,
) -> None:
    """Where no cgroup can be had, marks are all there is, and this daemon leaves them:
    the protections say so (``cgroup`` false), and it outlives its command."""
    needs("filesystem", "signals")
    results, outside, marker = _as_nobody(nobodys, delegated=False)
    try:
        assert results["protections"].get("cgroup", False) is False  # type: ignore[attr-defined]
        assert outside.read_text() == "kept"
        _code, error = results["kill"]  # type: ignore[misc]
        assert error.count("Operation not permitted") == 2
        assert results["daemon_alive"] is True
    finally:
        for pid in running(marker):
            os.kill(pid, signal.SIGKILL)
