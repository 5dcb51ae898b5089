"""No process outlives its owner: real processes that detach, on the real clock.

Each test's processes are found by a unique name: a detached ``sleep`` whose
argv[0] is the test's marker (``exec -a``), started by a double fork into a
session of its own (init's child, not ours), and another in the command's own
process group. Every path by which an owner ends must leave none: a command's
end, a background task's kill, an agent's dispose, an ACP ``session/close``,
and SIGKILL of ``greenroom acp`` (its keeper ends them; with the keeper
killed too, the next holder of the session does).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import acp
import psycopg
import pytest
import trio
from acp import schema

from greenroom import open_runtime
from greenroom.models.scripted import ScriptedModel
from greenroom.procs import MARK_VAR, owner
from greenroom.protocol.mcp import McpStdioServer
from greenroom.session.persistence import JsonlPersistence, Persistence, SqlitePersistence
from greenroom.session.persistence.lock import SessionLock
from greenroom.session.persistence.postgres import PostgresPersistence
from greenroom.session.store import new_header
from greenroom.tools.bash.local import LocalBashExecutor
from greenroom.tools.bash.seam import BashExecRequest
from greenroom.tools.bash.tools import bash_plugin
from tests.tools.test_mcp import SERVERS, alive

pytestmark = pytest.mark.real_clock

LIMIT = 60.0


def _marker() -> str:
    return f"orphan-{secrets.token_hex(6)}"


def survivors(marker: str) -> list[int]:
    """Live processes (not zombies) whose argv[0] starts with `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv0 = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0", 1)[0]
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv0.startswith(marker.encode()) and state != "Z":
            found.append(int(name))
    return found


def daemonizing(marker: str) -> str:
    """Bash that leaves a detached ``sleep`` and one in its group, and waits until both run."""
    return (
        f"(setsid bash -c 'exec -a {marker} sleep 1000' &); "
        f"(exec -a {marker}-group sleep 1000) & "
        f"until pgrep -f '^{marker} ' >/dev/null && pgrep -f '^{marker}-group ' >/dev/null; "
        "do sleep 0.02; done; echo up"
    )


async def until_running(marker: str, count: int) -> None:
    while len(survivors(marker)) < count:
        await trio.sleep(0.02)


async def test_a_command_leaves_nothing_it_detached(tmp_path: Path) -> None:
    marker = _marker()
    with trio.fail_after(LIMIT):
        async with LocalBashExecutor(str(tmp_path)) as executor:
            spec = executor.resolve(BashExecRequest(command=daemonizing(marker)))
            result = await executor.run(spec)
            assert result.stdout.text == "up\n"
            assert survivors(marker) == []


async def test_a_killed_background_task_leaves_nothing_it_detached(tmp_path: Path) -> None:
    marker = _marker()
    with trio.fail_after(LIMIT):
        async with LocalBashExecutor(str(tmp_path)) as executor:
            command = daemonizing(marker) + "; sleep 1000"
            task = await executor.start(executor.resolve(BashExecRequest(command=command)))
            await until_running(marker, 2)
            assert executor.kill(task.id)
            await executor.wait(task.id)
            assert survivors(marker) == []


async def test_a_long_running_child_outlives_idle_worker_threads(tmp_path: Path) -> None:
    """Trio's idle worker threads exit after 10 s; a child started from one lives on."""
    marker = _marker()
    with trio.fail_after(LIMIT):
        async with LocalBashExecutor(str(tmp_path)) as executor:
            command = f"exec -a {marker} sleep 1000"
            task = await executor.start(executor.resolve(BashExecRequest(command=command)))
            await until_running(marker, 1)
            await trio.sleep(16)
            assert len(survivors(marker)) == 1
            snapshot = executor.get(task.id)
            assert snapshot is not None
            assert snapshot.status == "running"
            executor.kill(task.id)
            await executor.wait(task.id)
    assert survivors(marker) == []


def _daemon_server(marker: str, record: Path) -> McpStdioServer:
    return McpStdioServer(
        name="daemon",
        command=sys.executable,
        args=[str(SERVERS), "daemonize", f"{marker}-mcp"],
        env={"MCP_RECORD": str(record)},
    )


def _bash(command: str, *, background: bool) -> str:
    arguments = {"command": command, "description": "detach", "run_in_background": background}
    return "tool: bash " + json.dumps(arguments)


async def test_dispose_leaves_nothing_a_session_detached(tmp_path: Path) -> None:
    marker = _marker()
    with trio.fail_after(LIMIT):
        async with open_runtime(model=ScriptedModel(delay=0), workdir=str(tmp_path)) as rt:
            await rt.plug("tool-bash", bash_plugin)
            handle = await rt.agents.create(
                agent_id="a",
                session_id="s",
                cwd=str(tmp_path),
                mcp_servers=[_daemon_server(marker, tmp_path / "record")],
            )
            handle.agent.send(_bash(daemonizing(marker) + "; sleep 1000", background=True))
            await handle.agent.when_idle()
            await until_running(marker, 3)  # the task's two and the server's
            await handle.dispose()
            assert survivors(marker) == []


class Client:
    """The editor: allows each command once, records nothing else."""

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        pass

    async def request_permission(
        self, session_id: str, tool_call: Any, options: Any, **kwargs: Any
    ) -> schema.RequestPermissionResponse:
        (once,) = [o for o in options if o.kind == "allow_once"]
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(outcome="selected", option_id=once.option_id)
        )

    def on_connect(self, conn: Any) -> None:
        pass


async def _detaching_session(conn: Any, cwd: Path, marker: str) -> str:
    """A session whose MCP server and background task detached a process each."""
    server = schema.McpServerStdio(
        name="daemon",
        command=sys.executable,
        args=[str(SERVERS), "daemonize", f"{marker}-mcp"],
        env=[],
    )
    session = (await conn.new_session(cwd=str(cwd), mcp_servers=[server])).session_id
    background = _bash(daemonizing(marker) + "; sleep 1000", background=True)
    answer = await conn.prompt(session_id=session, prompt=[acp.text_block(background)])
    assert answer.stop_reason == "end_turn"
    # A foreground command's detached child ends with the command, before the turn does.
    foreground = _bash(daemonizing(f"{marker}-fg"), background=False)
    answer = await conn.prompt(session_id=session, prompt=[acp.text_block(foreground)])
    assert answer.stop_reason == "end_turn"
    assert survivors(f"{marker}-fg") == []
    while len(survivors(marker)) < 3:
        await asyncio.sleep(0.02)
    return str(session)


async def _gone(marker: str) -> None:
    while survivors(marker):
        await asyncio.sleep(0.02)


def _agent(store: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "greenroom", "acp", "--model", "scripted:0", "--store", store)


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GREENROOM_STORE"}
    return env | {"GREENROOM_HOME": str(home)}


def test_close_and_sigkill_leave_nothing_a_session_detached(tmp_path: Path) -> None:
    closed, killed = _marker(), _marker()

    async def scenario() -> None:
        command, *args = _agent(f"jsonl:{tmp_path / 'sessions'}")
        async with acp.spawn_agent_process(
            Client(), command, *args, env=_env(tmp_path), cwd=tmp_path
        ) as (conn, process):
            await conn.initialize(protocol_version=1)
            session = await _detaching_session(conn, tmp_path, closed)
            await conn.close_session(session_id=session)
            assert survivors(closed) == []
            await _detaching_session(conn, tmp_path, killed)
            process.send_signal(signal.SIGKILL)
            # The keeper ends them; the kernel and init take their time on a loaded machine.
            await asyncio.wait_for(_gone(killed), 20)

    asyncio.run(asyncio.wait_for(scenario(), 2 * LIMIT))


def keepers(token: str) -> list[int]:
    """The live keeper processes of the greenroom process whose token is `token`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ours = token.encode() in cmdline and any(a.endswith(b"procs.py") for a in cmdline)
            if ours and alive(int(name)):
                found.append(int(name))
    return found


def launchers_of(parent: int) -> list[int]:
    """The sandbox launchers the process `parent` started (they end their commands' groups
    when it dies)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
                ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == parent and any(a.endswith(b"launcher.py") for a in cmdline):
                found.append(int(name))
    return found


def _keeper_of(home: Path) -> int:
    """The keeper of the process holding the one session under `home` (its lock names it)."""
    (lock,) = [p for p in home.rglob("*.lock") if p.stat().st_size]
    (keeper,) = keepers(json.loads(lock.read_text())["owner"])
    return keeper


def _store(backend: str, home: Path) -> tuple[str, Persistence]:
    if backend == "jsonl":
        return f"jsonl:{home / 'sessions'}", JsonlPersistence(home / "sessions")
    return f"sqlite:{home / 'sessions.db'}", SqlitePersistence(home / "sessions.db")


@pytest.mark.parametrize("backend", ["jsonl", "sqlite"])
def test_the_next_holder_ends_what_a_killed_holder_left(tmp_path: Path, backend: str) -> None:
    marker = _marker()
    url, store = _store(backend, tmp_path)

    async def scenario() -> str:
        command, *args = _agent(url)
        async with acp.spawn_agent_process(
            Client(), command, *args, env=_env(tmp_path), cwd=tmp_path
        ) as (conn, process):
            await conn.initialize(protocol_version=1)
            session = await _detaching_session(conn, tmp_path, marker)
            # Stopped first: greenroom must not see its launcher die (it would end the
            # launcher's commands itself), and the launcher must not see greenroom die.
            process.send_signal(signal.SIGSTOP)
            os.kill(_keeper_of(tmp_path), signal.SIGKILL)
            for launcher in launchers_of(process.pid):
                os.kill(launcher, signal.SIGKILL)
            process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(process.wait(), 10)
            await asyncio.sleep(0.5)
            assert len(survivors(marker)) >= 3  # nothing else is left to end them
            return session

    session = asyncio.run(asyncio.wait_for(scenario(), 2 * LIMIT))

    async def take_over() -> None:
        with trio.fail_after(LIMIT):
            _, _, log = await store.open(session)
            try:
                assert survivors(marker) == []
            finally:
                await log.close()

    trio.run(take_over)


async def test_a_killed_keeper_is_started_again(tmp_path: Path) -> None:
    token = owner().token
    with trio.fail_after(LIMIT):
        async with LocalBashExecutor(str(tmp_path)) as executor:
            spec = executor.resolve(BashExecRequest(command="true"))
            await executor.run(spec)
            (first,) = keepers(token)
            os.kill(first, signal.SIGKILL)
            while alive(first):
                await trio.sleep(0.02)
            await executor.run(spec)
            (second,) = keepers(token)
            assert second != first


def _left(pid: int, host: str, start: int | None, token: str) -> bytes:
    return json.dumps({"pid": pid, "host": host, "start": start, "owner": token}).encode()


async def test_a_lock_file_sweeps_only_for_a_dead_holder_of_this_host(tmp_path: Path) -> None:
    me, host = owner(), socket.gethostname()
    assert me.start is not None
    marker = _marker()
    path = tmp_path / "s.lock"

    async def take(record: bytes) -> None:
        path.write_bytes(record)
        lock = await trio.to_thread.run_sync(SessionLock.acquire, path, "s")
        lock.release()

    with trio.fail_after(LIMIT):
        async with LocalBashExecutor(str(tmp_path)) as executor:
            command = f"exec -a {marker} sleep 1000"
            task = await executor.start(executor.resolve(BashExecRequest(command=command)))
            await until_running(marker, 1)
            await take(_left(me.pid, host, me.start, me.token))  # its holder still runs
            await take(_left(me.pid, "elsewhere", me.start + 1, me.token))  # another machine
            await take(_left(me.pid, host, None, me.token))  # no start time: not checkable
            assert len(survivors(marker)) == 1
            await take(_left(me.pid, host, me.start + 1, me.token))  # its pid is someone else's
            assert survivors(marker) == []
            assert (await executor.wait(task.id)).signal == "SIGKILL"


def marked(token: str) -> list[int]:
    """Live processes (not zombies) carrying a mark of `token` in their environment."""
    prefix = f"{MARK_VAR}=".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        marks = [m for e in environ if e.startswith(prefix) for m in e[len(prefix) :].split(b":")]
        if state != "Z" and any(m.startswith(f"{token}.".encode()) for m in marks):
            found.append(int(name))
    return found


def _holder(dsn: str, session: str) -> tuple[int, str, int, str]:
    """The holder pid, host, start time and token session `session`'s row records."""
    with psycopg.connect(dsn, autocommit=True) as db:
        row = db.execute(
            "SELECT holder_pid, holder_host, holder_start, holder_owner"
            " FROM greenroom_sessions WHERE id = %s",
            (session,),
        ).fetchone()
    assert row is not None
    return row


def test_the_next_postgres_holder_ends_what_a_killed_holder_left(
    tmp_path: Path, postgres_dsn: str
) -> None:
    marker, ttl = _marker(), 2.0

    async def scenario() -> tuple[str, str]:
        command, *args = _agent(postgres_dsn)
        async with acp.spawn_agent_process(
            Client(), command, *args, "--lease-ttl", str(ttl), env=_env(tmp_path), cwd=tmp_path
        ) as (conn, process):
            await conn.initialize(protocol_version=1)
            session = await _detaching_session(conn, tmp_path, marker)
            pid, host, _, token = _holder(postgres_dsn, session)
            assert (pid, host) == (process.pid, socket.gethostname())
            (keeper,) = keepers(token)
            process.send_signal(signal.SIGSTOP)  # as above: nothing may see the others die
            os.kill(keeper, signal.SIGKILL)
            for launcher in launchers_of(process.pid):
                os.kill(launcher, signal.SIGKILL)
            process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(process.wait(), 10)
            await asyncio.sleep(ttl + 0.5)  # its lease has lapsed: taken over either way
            assert len(survivors(marker)) >= 3  # nothing else is left to end them
            assert marked(token)
            return session, token

    session, token = asyncio.run(asyncio.wait_for(scenario(), 2 * LIMIT))

    async def take_over() -> None:
        with trio.fail_after(LIMIT):
            store = PostgresPersistence(postgres_dsn, lease_ttl=ttl)
            try:
                _, _, log = await store.open(session)
                try:
                    assert survivors(marker) == []
                    assert marked(token) == []
                    me = owner()
                    assert _holder(postgres_dsn, session) == (
                        me.pid,
                        socket.gethostname(),
                        me.start,
                        me.token,
                    )
                finally:
                    await log.close()
            finally:
                store.close()

    trio.run(take_over)


async def test_a_postgres_take_over_sweeps_only_for_a_dead_holder_of_this_host(
    tmp_path: Path, postgres_dsn: str
) -> None:
    me, host = owner(), socket.gethostname()
    assert me.start is not None
    marker = _marker()
    store = PostgresPersistence(postgres_dsn)

    async def take(pid: int | None, host: str, start: int | None) -> None:
        """Take session ``s`` over from a given-back lease that names this holder."""
        with psycopg.connect(postgres_dsn, autocommit=True) as db:
            db.execute(
                "UPDATE greenroom_sessions SET holder_pid = %s, holder_host = %s,"
                " holder_start = %s, holder_owner = %s WHERE id = 's'",
                (pid, host, start, me.token),
            )
        _, _, log = await store.open("s")
        await log.close()

    try:
        with trio.fail_after(LIMIT):
            await (await store.create(new_header("s", cwd=str(tmp_path)))).close()
            async with LocalBashExecutor(str(tmp_path)) as executor:
                command = f"exec -a {marker} sleep 1000"
                task = await executor.start(executor.resolve(BashExecRequest(command=command)))
                await until_running(marker, 1)
                await take(me.pid, host, me.start)  # its holder still runs
                await take(me.pid, "elsewhere", me.start + 1)  # another machine
                await take(me.pid, host, None)  # no start time: not checkable
                await take(None, host, me.start + 1)  # given back: no holder
                assert len(survivors(marker)) == 1
                await take(me.pid, host, me.start + 1)  # its pid is someone else's
                assert survivors(marker) == []
                assert (await executor.wait(task.id)).signal == "SIGKILL"
    finally:
        store.close()
