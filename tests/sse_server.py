"""The loopback model server (`greenroom.models.loopback`), plain or over TLS with a certificate
from the suite's test CA (`test_ca`; a client trusts it through `client_tls`)."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager

import trustme

from greenroom.models.loopback import (
    CutOff,
    Hold,
    LoopbackServer,
    Pause,
    Piece,
    Responder,
    Seen,
    Served,
    serve,
    sse,
)

#: The suite's name for the server (it serves server-sent events).
SseServer = LoopbackServer

__all__ = [
    "CutOff",
    "Hold",
    "Pause",
    "Piece",
    "Served",
    "Seen",
    "SseServer",
    "client_tls",
    "sse",
    "sse_server",
    "test_ca",
]


@functools.cache
def test_ca() -> trustme.CA:
    """The suite's certificate authority (one per process: making a key takes a while)."""
    return trustme.CA()


@functools.cache
def client_tls() -> ssl.SSLContext:
    """A client context that trusts `test_ca` only."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    test_ca().configure_trust(context)
    return context


@functools.cache
def _server_tls() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    test_ca().issue_cert("127.0.0.1").configure_cert(context)
    return context


def sse_server(
    replies: Sequence[Served] | Responder, *, tls: bool = False
) -> AbstractAsyncContextManager[LoopbackServer]:
    """A server on a free port (answering `replies` in order, or each request by the
    function `replies`); with `tls`, https with a `test_ca` certificate."""
    return serve(replies, _server_tls() if tls else None)
