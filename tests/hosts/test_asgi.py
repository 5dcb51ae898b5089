"""An ASGI service embedding agents (`tests/asgi_host.py`: Starlette on uvicorn, a real
asyncio server on loopback) streams a turn to an HTTP client, and cancels the prompt when
that client goes away: the turn ends aborted, the model's stream is closed, the agent goes
on. Real processes and sockets, on the real clock."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx2
import pytest
import trio

from greenroom.protocol.events import Aborted, Completed, TurnEnd
from greenroom.session.persistence import JsonlPersistence
from tests import ROOT
from tests.sse_server import Hold, Served, sse, sse_server
from tests.wire import oai, openai_text

pytestmark = pytest.mark.real_clock


class Uvicorn:
    """A uvicorn process's address, read off its log, and the rest of its log."""

    def __init__(self) -> None:
        self.url = ""
        self.log = b""
        self.up = trio.Event()

    async def read(self, stream: trio.abc.ReceiveStream) -> None:
        async for chunk in stream:
            self.log += chunk
            found = re.search(rb"Uvicorn running on (http://127\.0\.0\.1:\d+)", self.log)
            if found is not None and not self.up.is_set():
                self.url = found.group(1).decode()
                self.up.set()


async def test_a_streaming_endpoint_cancels_the_prompt_when_its_client_goes_away(
    tmp_path: Path,
) -> None:
    replies = [
        Served(pieces=[*sse(oai({"role": "assistant", "content": "Hello"})), Hold()]),
        Served(pieces=openai_text("again")),
    ]
    served = Uvicorn()
    with trio.fail_after(90):
        async with sse_server(replies) as model, trio.open_nursery() as nursery:
            command = [sys.executable, "-m", "uvicorn", "tests.asgi_host:app"]
            process: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    [*command, "--host", "127.0.0.1", "--port", "0"],
                    cwd=ROOT,
                    env={**os.environ, "MODEL_URL": model.url, "STORE": str(tmp_path)},
                    stderr=subprocess.PIPE,
                    check=False,
                )
            )
            assert process.stderr is not None
            nursery.start_soon(served.read, process.stderr)
            await served.up.wait()
            async with httpx2.AsyncClient(timeout=30) as client:
                url = f"{served.url}/chat/s"
                async with client.stream("POST", url, content=b"say hello") as response:
                    assert response.status_code == 200
                    async for text in response.aiter_text():
                        assert text == "Hello"
                        break  # and go away: leaving the block closes the connection
                await model.client_left.wait()  # the turn's model stream was closed
                again = await client.post(url, content=b"once more")
                assert (again.status_code, again.text) == (200, "again")
            process.send_signal(signal.SIGTERM)
            await process.wait()
    # uvicorn shuts down gracefully (the lifespan's runtime closed), then exits by the signal
    assert process.returncode in (0, -signal.SIGTERM), served.log.decode()
    assert b"Application shutdown complete." in served.log
    _, events = await JsonlPersistence(tmp_path).load("s")
    ends = [e.reason for e in events if isinstance(e, TurnEnd)]
    assert ends[-2:] == [Aborted(reason="the client disconnected"), Completed()]
