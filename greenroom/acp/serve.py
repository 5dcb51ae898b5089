"""``greenroom serve``: ACP over WebSocket and HTTP at ``/acp`` (`network.AcpServer`).

The HTTP server is Hypercorn's Trio worker (``hypercorn.trio.serve``): HTTP/1.1
by h11, HTTP/2 by h2, WebSocket by wsproto and TLS by Trio's own
`trio.SSLStream`, all in this process's Trio run, so the connections' agents
live in the same run as the runtime (docs/architecture.md says why this one).
SIGTERM, SIGHUP and SIGINT stop it: listening ends and every connection takes
the teardown of ``greenroom acp`` (prompts answered ``cancelled``, agents
disposed with their final ``turn/end`` on disk); then the process exits 0.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from greenroom.acp.network import IDLE, MAX_MESSAGE, AcpServer
from greenroom.acp.stdio import plug_tools
from greenroom.models.base import ModelAdapter
from greenroom.models.prices import Prices
from greenroom.runtime import Runtime, open_runtime
from greenroom.session.persistence import Interruption, Persistence

__all__ = ["run_serve", "serve_acp"]

logger = logging.getLogger("greenroom.serve")


async def serve_acp(
    runtime: Runtime,
    listen: str,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    interrupted: Interruption = "close",
    idle: float = IDLE,
    task_status: trio.TaskStatus[Sequence[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ACP on `listen` (``HOST:PORT``; port 0 picks one) until cancelled, with TLS
    when `cert` and `key` are given; `task_status` is told the URLs it listens on.

    A cancel stops listening and tears every connection down (each within the
    connection's teardown grace) before this returns.
    """
    config = Config()
    config.bind = [listen]
    if cert is not None:
        config.certfile, config.keyfile = str(cert), str(key)
    config.websocket_max_message_size = MAX_MESSAGE
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.include_server_header = False
    async with trio.open_nursery() as connections:
        app = AcpServer(runtime, connections, interrupted=interrupted, idle=idle)
        try:
            await serve(app, config, task_status=task_status)  # type: ignore[arg-type]
        finally:
            app.close()


def run_serve(
    models: Mapping[str, ModelAdapter],
    persistence: Persistence,
    listen: str,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    interrupted: Interruption = "close",
    prices: Prices | None = None,
) -> int:
    """``greenroom serve``: serve ACP on `listen` with `models` (by id, the first the
    default) until a signal; says where it listens on stderr."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    trio.run(_serve, models, persistence, listen, cert, key, interrupted, prices)
    return 0


async def _serve(
    models: Mapping[str, ModelAdapter],
    persistence: Persistence,
    listen: str,
    cert: Path | None,
    key: Path | None,
    interrupted: Interruption,
    prices: Prices | None,
) -> None:
    async with open_runtime(
        models=models, persistence=persistence, name="serve", prices=prices
    ) as runtime:
        await plug_tools(runtime)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                urls = await nursery.start(
                    lambda task_status: serve_acp(
                        runtime,
                        listen,
                        cert=cert,
                        key=key,
                        interrupted=interrupted,
                        task_status=task_status,
                    )
                )
                for url in urls:
                    print(f"greenroom serve: listening on {url}/acp", file=sys.stderr, flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel(reason="signal")
                    break
