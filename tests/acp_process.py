"""`greenroom acp` as a real subprocess, driven by raw JSON-RPC lines from Trio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio


class AcpProcess:
    """One ``greenroom acp`` process: frames in on its stdin, frames out from its stdout."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.frames: list[dict[str, Any]] = []
        self._buffer = b""
        self._next_id = 0

    async def send_raw(self, data: bytes) -> None:
        await self.stdin.send_all(data)

    async def request(self, method: str, params: dict[str, Any]) -> int:
        self._next_id += 1
        frame = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        await self.send_raw(json.dumps(frame).encode() + b"\n")
        return self._next_id

    async def response(self, request_id: object) -> dict[str, Any]:
        """The answer to `request_id`, reading frames until it arrives."""
        while True:
            for frame in self.frames:
                if frame.get("id") == request_id and "method" not in frame:
                    return frame
            await self._read()

    async def until(self, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first frame (read so far or from now on) that `check` accepts."""
        while True:
            for frame in self.frames:
                if check(frame):
                    return frame
            await self._read()

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self.response(await self.request(method, params))

    async def new_session(self, cwd: str) -> str:
        answer = await self.call("session/new", {"cwd": cwd, "mcpServers": []})
        return str(answer["result"]["sessionId"])

    async def prompt(self, session: str, text: str) -> dict[str, Any]:
        prompt = [{"type": "text", "text": text}]
        return await self.call("session/prompt", {"sessionId": session, "prompt": prompt})

    async def _read(self) -> None:
        chunk = await self.stdout.receive_some()
        if not chunk:
            raise EOFError("greenroom acp closed its stdout")
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        self.frames.extend(json.loads(line) for line in lines if line.strip())

    async def close(self) -> int:
        """End of input; wait for the process to exit; its exit code."""
        await self.stdin.aclose()
        with trio.fail_after(10):
            async for _ in _drain(self.stdout):
                pass
            return await self.process.wait()


async def _drain(stream: trio.abc.ReceiveStream) -> AsyncIterator[bytes]:
    while chunk := await stream.receive_some():
        yield chunk


@asynccontextmanager
async def acp_process(
    home: Path,
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    greenroom: Sequence[str] = (sys.executable, "-m", "greenroom"),
) -> AsyncIterator[AcpProcess]:
    """Run ``greenroom acp ARGS`` with ``GREENROOM_HOME=home``; killed if still running after.

    ``greenroom`` is the command that runs greenroom (default: this interpreter's).
    """
    command: Sequence[str] = (*greenroom, "acp", *args)
    environ = {**os.environ, "GREENROOM_HOME": str(home), **(env or {})}
    process = await trio.lowlevel.open_process(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
        env=environ,
    )
    peer = AcpProcess(process)
    try:
        await peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        yield peer
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
