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
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import trio
from hypercorn.config import Config, Sockets
from hypercorn.trio import serve

from greenroom.acp.access import AccessTokens, loopback_host
from greenroom.acp.network import DEFAULT_LIMITS, IDLE, AcpServer, ServeLimits
from greenroom.acp.routes import SessionRoutes, subscribe
from greenroom.acp.shared import Attachments
from greenroom.acp.stdio import plug_tools
from greenroom.actors.types import Titles
from greenroom.models.base import ModelAdapter
from greenroom.models.prices import Prices
from greenroom.runtime import Runtime, open_runtime
from greenroom.session.persistence import Interruption, Persistence
from greenroom.supervisor import Scope, Supervisor

__all__ = ["check_listen", "run_serve", "serve_acp"]

logger = logging.getLogger("greenroom.serve")


def check_listen(listen: str, tokens: AccessTokens | None) -> None:
    """Refuse (`ValueError`, naming why) a ``HOST:PORT`` that is not one, and, without
    tokens, a host that is not loopback: nobody but this machine may reach a server that
    does not know who is asking."""
    host, colon, port = listen.rpartition(":")
    # ASCII digits only: str.isdigit also takes '²', which int() refuses.
    number = port.isascii() and port.isdigit() and len(port) <= 5
    # Only a name or an address: Hypercorn's other binds (unix:PATH, fd://N) are no TCP
    # socket, which the server's options are for.
    bracketed = host.startswith("[") and host.endswith("]")
    if not colon or not host or not number or int(port) > 65535 or (":" in host) > bracketed:
        raise ValueError(f"--listen takes HOST:PORT (IPv6 as [ADDRESS]:PORT), got {listen!r}")
    if tokens is None and not loopback_host(host):
        raise ValueError(
            f"--listen {listen}: without --tokens greenroom serve listens on loopback only"
            " (127.0.0.1, [::1] or localhost); give --tokens FILE to listen beyond it"
        )


async def serve_acp(
    runtime: Runtime,
    listen: str,
    *,
    tokens: AccessTokens | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    interrupted: Interruption = "close",
    titles: Titles = "prompt",
    idle: float = IDLE,
    limits: ServeLimits = DEFAULT_LIMITS,
    task_status: trio.TaskStatus[Sequence[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ACP on `listen` (``HOST:PORT``; port 0 picks one) until cancelled, with TLS
    when `cert` and `key` are given; `task_status` is told the URLs it listens on.
    With `tokens`, every request needs a principal's token and each principal sees its
    own sessions; without, `listen` must be loopback (`check_listen`, `ValueError`) and
    only loopback requests are served (`greenroom.acp.access`).

    A cancel stops listening and tears every connection down (each within the
    connection's teardown grace) before this returns.
    """
    check_listen(listen, tokens)
    config = _Config(stalled=idle)
    config.bind = [listen]
    if cert is not None:
        config.certfile, config.keyfile = str(cert), str(key)
    config.websocket_max_message_size = limits.message
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.include_server_header = False
    # What the runtime tells reaches each connection through the routes, heard from before
    # the first connection to after the last.
    routes = SessionRoutes()
    listening = Scope("acp server")
    subscribe(runtime.hooks, routes, listening)
    try:
        # The sessions are the server's, shared by its connections: they outlive the one
        # that made them while another is attached, and are stopped together at the end.
        async with (
            Supervisor(name="acp-server", stop_together=True) as owner,
            trio.open_nursery() as connections,
        ):
            attachments = Attachments(owner, runtime.bash, connections, routes, limits.sessions)
            app = AcpServer(
                runtime,
                connections,
                interrupted=interrupted,
                titles=titles,
                idle=idle,
                tokens=tokens,
                attachments=attachments,
                limits=limits,
            )
            try:
                await serve(app, config, task_status=task_status)  # type: ignore[arg-type]
            finally:
                app.close()
    finally:
        await listening.close()


class _Config(Config):
    """Hypercorn's config, with each listening socket's ``TCP_USER_TIMEOUT`` (which the
    connections it accepts inherit) set to `stalled` seconds: a peer that takes none of
    what is sent to it for that long (a client that does not read, a host gone without
    a word) has its connection reset by the kernel. Without it, the frame Hypercorn is in
    the middle of sending to such a client holds its task and socket until the peer
    goes: that send is shielded from any cancel of ours. Where the option does not exist
    (not Linux), connections are as Hypercorn makes them."""

    def __init__(self, stalled: float) -> None:
        super().__init__()
        self._stalled = stalled

    def create_sockets(self) -> Sockets:
        sockets = super().create_sockets()
        option = getattr(socket, "TCP_USER_TIMEOUT", None)
        if option is not None:
            for listening in (*sockets.secure_sockets, *sockets.insecure_sockets):
                listening.setsockopt(socket.IPPROTO_TCP, option, round(self._stalled * 1000))
        return sockets


def run_serve(
    models: Mapping[str, ModelAdapter],
    persistence: Persistence,
    listen: str,
    *,
    tokens: AccessTokens | None = None,
    cert: Path | None = None,
    key: Path | None = None,
    interrupted: Interruption = "close",
    titles: Titles = "prompt",
    prices: Prices | None = None,
    limits: ServeLimits = DEFAULT_LIMITS,
) -> int:
    """``greenroom serve``: serve ACP on `listen` with `models` (by id, the first the
    default) until a signal; says where it listens on stderr."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    trio.run(
        _serve, models, persistence, listen, tokens, cert, key, interrupted, titles, prices, limits
    )
    return 0


async def _serve(
    models: Mapping[str, ModelAdapter],
    persistence: Persistence,
    listen: str,
    tokens: AccessTokens | None,
    cert: Path | None,
    key: Path | None,
    interrupted: Interruption,
    titles: Titles,
    prices: Prices | None,
    limits: ServeLimits,
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
                        tokens=tokens,
                        cert=cert,
                        key=key,
                        interrupted=interrupted,
                        titles=titles,
                        limits=limits,
                        task_status=task_status,
                    )
                )
                for url in urls:
                    print(f"greenroom serve: listening on {url}/acp", file=sys.stderr, flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel(reason="signal")
                    break
