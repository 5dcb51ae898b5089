"""What the HTTP model adapters share: a pooled client, server-sent events, retries that wait
and tell, errors without secrets.

The adapters use httpx2, which runs natively under Trio (through anyio's Trio
backend): no asyncio bridge and no thread left reading. It is the project's one
HTTP stack (the MCP client's too). An official vendor SDK would pull in
asyncio-only pieces, so greenroom speaks each wire format itself.

`ConnectionPool` is one pooled httpx2 client per adapter, with its limits and timeouts;
retries run within a wait budget, each a `Retry` chunk the turn logs as ``model/retry``;
`ModelConfigError` is an endpoint that refused the credentials (no retry); `output_limit`
is the smaller of a request's and an adapter's output limit.
"""

from __future__ import annotations

import email.utils
import logging
import math
import os
import random
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing, asynccontextmanager
from typing import Any, Final, TypeVar

import httpx2
import msgspec
import trio

from greenroom import keys
from greenroom.backoff import Backoff
from greenroom.models.base import ContextOverflow, ModelError, context_limit, context_window_of
from greenroom.models.parts import Encoded, WirePart, takes_images, wire_parts
from greenroom.protocol.model import ModelRequest, Retry, StreamChunk, UserTurn

logger = logging.getLogger("greenroom.models")

T = TypeVar("T")

#: The waits between attempts: 1, 2, 4, 8, 16, 20, 20 ... s, each stretched by up to 25 %.
DEFAULT_BACKOFF: Final = Backoff(initial=1.0, maximum=20.0, multiplier=2.0, jitter=0.25)
#: Seconds one model call may spend waiting between its attempts, in all.
DEFAULT_RETRY_BUDGET: Final = 60.0
#: Attempts one model call makes at most, whatever the budget (a server answering 429 with
#: ``Retry-After: 0`` would otherwise be asked again and again without a wait).
MAX_ATTEMPTS: Final = 10
#: Statuses worth another attempt: timeouts, conflicts, rate limits, overload, server faults.
RETRIED_STATUSES: Final = frozenset({408, 409, 429, 500, 501, 502, 503, 504, 529})
#: Error events that may arrive in a 200 stream and are worth another attempt (Anthropic's).
RETRIED_STREAM_ERRORS: Final = frozenset({"overloaded_error", "rate_limit_error"})
#: Seconds to wait for a response to start and between two reads of a stream.
READ_TIMEOUT: Final = 120.0
#: Connect and TLS handshake 30 s, send 30 s, each read 120 s, a free pooled connection 60 s.
TIMEOUT: Final = httpx2.Timeout(connect=30.0, read=READ_TIMEOUT, write=30.0, pool=60.0)
#: At most 64 requests at once per adapter (more wait for a connection, up to the pool timeout);
#: up to 16 idle connections are kept, each for 60 s after its last response.
LIMITS: Final = httpx2.Limits(
    max_connections=64, max_keepalive_connections=16, keepalive_expiry=60.0
)
#: Seconds the body may take to end after the reply's last event (a body still open then
#: is closed with its connection, which is not reused).
DRAIN_TIMEOUT: Final = 1.0
#: Seconds the pool's close may take (TLS close_notify on each idle connection) before it is
#: abandoned.
CLOSE_TIMEOUT: Final = 5.0


class ModelConfigError(ModelError):
    """The endpoint refused the credentials (401/403): fix the configuration; no retry."""


def check_base_url(base_url: str) -> str:
    """`base_url` without a trailing slash; raises `ValueError` unless it is http(s) with a host."""
    url = httpx2.URL(base_url)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(
            f"base URL {base_url!r} must start with http:// or https:// and name a host"
        )
    if url.userinfo:
        # Errors and logs name the endpoint; credentials in it would travel with them.
        raise ValueError("a base URL must not carry credentials (user:password@); use the key")
    return base_url.rstrip("/")


def endpoint(
    base_url: str | None, api_key: str | None, provider: str, default_url: str
) -> tuple[str, str]:
    """The base URL and key an adapter uses: each as given, else ``{PROVIDER}_BASE_URL`` /
    ``{PROVIDER}_API_KEY`` from the environment, else the key stored by ``greenroom acp
    --login`` (`greenroom.keys`) and (the URL only) `default_url`.

    The one rule for code and the ``greenroom`` command alike. Raises `ValueError`
    naming the variable when no key is given, set or stored, `greenroom.keys.KeyFileError`
    (a `ValueError`) for a stored key file that cannot be used, and `ValueError` for a
    base URL `check_base_url` refuses.
    """
    prefix = provider.upper()
    key = keys.api_key(f"{prefix}_API_KEY", api_key)
    if not key:
        raise ValueError(
            f"no API key for {provider}: pass api_key=, set {prefix}_API_KEY or run"
            " `greenroom acp --login`"
        )
    url = base_url or os.environ.get(f"{prefix}_BASE_URL") or default_url
    return check_base_url(url), key


def output_limit(asked: int | None, own: int | None) -> int | None:
    """The most output tokens a call may spend: the smaller of what the request asks
    (`ModelRequest.max_output_tokens`) and the adapter's own maximum, either of which may be
    absent (None: neither, so the model's own limit)."""
    if asked is None:
        return own
    return asked if own is None else min(asked, own)


class SseEvent(msgspec.Struct, frozen=True, gc=False):
    event: str
    data: str


async def sse_events(response: httpx2.Response) -> AsyncGenerator[SseEvent, None]:
    """The server-sent events of `response`, as they arrive (``event:`` + joined ``data:``)."""
    event = "message"
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield SseEvent(event, "\n".join(data))
            event, data = "message", []
        elif line.startswith(":"):
            continue  # a comment, or a keep-alive
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
    if data:
        yield SseEvent(event, "\n".join(data))


class RetryableError(Exception):
    """An attempt failed in a way a later attempt may not (an overload, a rate limit, a
    dropped connection): raised by the request (a status, a transport error before the
    response) and by an adapter's event reader (an ``overloaded_error`` event); the stream
    driver decides whether the budget and what it streamed so far allow another attempt."""

    def __init__(self, message: str, code: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after


class ConnectionPool:
    """One adapter's HTTP client and its pooled connections, shared by whoever holds it.

    While at least one holder is inside `held` (a runtime, for its whole life), every call
    goes through one ``httpx2.AsyncClient``, created on the first call (no connection is
    opened before a request needs it); the last holder's exit closes it and every idle
    connection. A call made while nobody holds the pool gets a client of its own, closed
    when the call ends: nothing outlives it either way. The TLS context (the trust store
    read from disk) is built once, on first use.

    A response left before its end (a cancel, a cut, an error event) closes its connection
    rather than returning it to the pool half-read (httpcore2 keeps a connection only
    when both sides finished the exchange).
    """

    __slots__ = ("_client", "_holders", "_ssl", "_verify")

    def __init__(self, verify: ssl.SSLContext | None) -> None:
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._client: httpx2.AsyncClient | None = None
        self._holders = 0

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Keep the pool open until the block ends (closing it then if this was the last
        holder; the close is shielded, so a cancelled holder still closes its sockets)."""
        self._holders += 1
        try:
            yield
        finally:
            self._holders -= 1
            if not self._holders and self._client is not None:
                client, self._client = self._client, None
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                    await client.aclose()

    @asynccontextmanager
    async def client(self) -> AsyncIterator[httpx2.AsyncClient]:
        """The client for one call: the pooled one while the pool is held, else its own."""
        if self._holders:
            if self._client is None:
                self._client = self._new_client()
            yield self._client
            return
        async with self._new_client() as client:
            yield client

    def _new_client(self) -> httpx2.AsyncClient:
        if self._ssl is None:
            self._ssl = self._verify or httpx2.create_ssl_context()
        return httpx2.AsyncClient(timeout=TIMEOUT, limits=LIMITS, verify=self._ssl)


class HttpModel:
    """What the HTTP adapters share: one endpoint, the headers that carry the key, the pool,
    retries.

    A subclass builds the wire body (`body`) and turns the response's events into chunks
    (`_chunks`). ``context_window`` is the tokens the model holds: as the adapter was told,
    else its family's (`greenroom.models.base.context_window_of`); ``images`` whether the
    model takes images: as told, else its family's (`greenroom.models.parts.takes_images`).
    `connections` is the pool a runtime holds for its life (`greenroom.models.base.open_models`).
    """

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        model: str,
        *,
        backoff: Backoff,
        retry_budget: float,
        context_window: int | None,
        verify: ssl.SSLContext | None,
        images: bool | None,
    ) -> None:
        if not math.isfinite(retry_budget) or retry_budget < 0:
            raise ValueError(f"retry_budget must be seconds >= 0, got {retry_budget!r}")
        self.context_window = context_window or context_window_of(model)
        self.connections = ConnectionPool(verify)
        #: What a trace names (`greenroom.tracing`): the model asked for when a request names none.
        self.model_name = model
        self.images = takes_images(model) if images is None else images
        self._url = url
        self._headers = headers
        self._model = model
        self._backoff = backoff
        self._retry_budget = retry_budget
        self._encoded = Encoded()

    def __repr__(self) -> str:  # never the headers: they carry the key
        return f"{type(self).__name__}({self._url!r}, model={self._model!r})"

    def body(self, request: ModelRequest) -> dict[str, Any]:
        raise NotImplementedError

    def url_of(self, request: ModelRequest) -> str:
        """Where `request` is posted: the adapter's one endpoint, unless its wire format names
        the model in the path (Gemini's)."""
        return self._url

    def _wire_parts(
        self, request: ModelRequest, message: UserTurn, current: bool
    ) -> Iterator[WirePart]:
        """`message`'s parts as texts and images for `request`'s model
        (`greenroom.models.parts.wire_parts`, with this adapter's image cache); `current`:
        it is a message of the prompt being answered."""
        model = request.model or self._model
        return wire_parts(message, request.blobs, self._encoded, self.images, model, current)

    def _chunks(self, events: AsyncIterator[SseEvent]) -> AsyncGenerator[StreamChunk, None]:
        raise NotImplementedError

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamChunk, None]:
        """The reply to `request`, retried until it starts or the wait budget is spent.

        Another attempt follows a transport error before the response began, a status
        in `RETRIED_STATUSES`, or a `RetryableError` from the event reader before any
        chunk of this call was yielded; before it the stream yields a `Retry` (the
        attempt, the wait, what failed) and sleeps: ``Retry-After`` (or
        ``retry-after-ms``) when the server sent one, else the backoff. The waits of
        one call add up to at most the retry budget, and it makes `MAX_ATTEMPTS` at
        most; a wait that would pass the budget, or a failure of the last attempt, ends
        the call with that failure instead. 401/403 raise `ModelConfigError` at
        once. Once a chunk was yielded nothing is retried: a cut or an error event then
        raises `ModelError`, and what was yielded stays with the caller. A cancel
        interrupts a wait at once. The body is encoded once: each attempt sends the
        same bytes.
        """
        url, body = self.url_of(request), msgspec.json.encode(self.body(request))
        attempt, waited = 0, 0.0
        while True:
            attempt += 1
            started = False
            try:
                async with (
                    self.connections.client() as client,
                    self._response(client, url, body) as response,
                    aclosing(sse_events(response)) as events,
                    aclosing(self._chunks(events)) as chunks,
                ):
                    try:
                        async for chunk in chunks:
                            started = True
                            yield chunk
                        # The reply is whole; read the body's end too, or the connection
                        # could not go back to the pool.
                        with trio.move_on_after(DRAIN_TIMEOUT):
                            async for _ in events:
                                pass
                    except httpx2.TransportError as exc:  # mid-body: never retried
                        raise ModelError(
                            f"{self._url}: {type(exc).__name__}: {exc}", "connection"
                        ) from None
                return
            except RetryableError as failure:
                if started:
                    raise ModelError(str(failure), failure.code) from None
                wait = _wait(failure.retry_after, self._backoff, attempt)
                if waited + wait > self._retry_budget:
                    raise ModelError(
                        f"{failure}; gave up after {attempt} attempts ({waited:.1f} s waited, "
                        f"the next wait of {wait:.1f} s would pass the "
                        f"{self._retry_budget:g} s budget)",
                        failure.code,
                    ) from None
                if attempt == MAX_ATTEMPTS:
                    raise ModelError(
                        f"{failure}; gave up after {attempt} attempts ({waited:.1f} s waited)",
                        failure.code,
                    ) from None
                retry = Retry(attempt=attempt, wait=wait, error=str(failure), code=failure.code)
            waited += retry.wait
            logger.warning("%s; retry %d in %.2f s", retry.error, attempt, retry.wait)
            yield retry
            await trio.sleep(retry.wait)

    @asynccontextmanager
    async def _response(
        self, client: httpx2.AsyncClient, url: str, body: bytes
    ) -> AsyncIterator[httpx2.Response]:
        """POST `body` to `url`; yield the streaming response once its status is 2xx.

        Raises `RetryableError` for a transport error before the response began and for a
        status in `RETRIED_STATUSES`, `ModelConfigError` for 401/403, `ModelError` for any
        other status. Errors name the endpoint, never a header: the key cannot leak into a
        log, an error or the session log. Leaving the block (a cancel included) closes the
        response.
        """
        request = client.build_request("POST", url, headers=self._headers, content=body)
        try:
            response = await client.send(request, stream=True)
        except httpx2.TransportError as exc:
            raise RetryableError(f"{url}: {type(exc).__name__}: {exc}", "connection") from None
        try:
            if response.status_code < 300:
                yield response
                return
            status = response.status_code
            detail, kind, error = await _error_detail(response)
        finally:
            await response.aclose()
        if status in (401, 403):
            raise ModelConfigError(
                f"{url} refused the credentials (HTTP {status}): {detail}", "unauthorized"
            )
        if status in RETRIED_STATUSES:
            wait = _retry_after(response.headers)
            raise RetryableError(
                f"{url} answered HTTP {status}: {detail}",
                f"http-{status}",
                self.asked_wait(error) if wait is None else wait,
            )
        if status == 400 and self.overflowed(kind, detail):
            raise ContextOverflow(
                f"{url} answered HTTP 400: {detail}",
                "context-overflow",
                window=context_limit(detail),
            )
        raise ModelError(f"{url} answered HTTP {status}: {detail}", f"http-{status}")

    def overflowed(self, kind: str | None, message: str) -> bool:
        """True if a 400 whose error has `kind` (its ``code``, else its ``type``) and
        `message` says the request is longer than the model's context window."""
        return False

    def asked_wait(self, error: dict[str, Any]) -> float | None:
        """Seconds the `error` object of a retried status's body asks to wait, for a wire
        format that says so in the body rather than in ``Retry-After`` (None: it does not)."""
        return None

    def _object(self, event: SseEvent) -> dict[str, Any]:
        """The event's JSON object; an error naming the event for anything else."""
        try:
            payload = msgspec.json.decode(event.data)
        except (msgspec.DecodeError, RecursionError):
            raise ModelError(
                f"{self._url}: malformed {event.event!r} event, not JSON: {event.data[:120]!r}",
                "malformed",
            ) from None
        if not isinstance(payload, dict):
            raise ModelError(f"{self._url}: {event.event!r} event is not an object", "malformed")
        return payload

    def _decode(self, decoder: msgspec.json.Decoder[T], event: SseEvent) -> T:
        """The event's data as `decoder`'s type; an error naming the event for anything else
        (not JSON, or a field of the wrong type)."""
        try:
            return decoder.decode(event.data)
        except (msgspec.DecodeError, RecursionError) as exc:  # nested past the decoder's depth
            raise ModelError(
                f"{self._url}: malformed {event.event!r} event ({exc}): {event.data[:120]!r}",
                "malformed",
            ) from None

    def _stream_error(self, error: object) -> Exception:
        """What an error event in a 200 stream raises: `RetryableError` for a kind in
        `RETRIED_STREAM_ERRORS`, else `ModelError`."""
        if isinstance(error, dict):
            kind = str(error.get("type") or error.get("code") or "error")
            message = error.get("message", error)
        else:
            kind, message = "error", error
        text = f"{self._url}: error event: {kind}: {message}"
        if kind in RETRIED_STREAM_ERRORS:
            return RetryableError(text, kind)
        return ModelError(text, kind)


async def _error_detail(response: httpx2.Response) -> tuple[str, str | None, dict[str, Any]]:
    """An error body's message, its error's ``code`` (else ``type``) if it has one, and its
    ``error`` object (empty when it has none)."""
    raw = await response.aread()
    try:
        payload = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        text = raw.decode("utf-8", "replace").strip()
        return (f"non-JSON body {text[:200]!r}" if text else "empty body"), None, {}
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            kind = error.get("code") or error.get("type")
            return str(error["message"]), kind if isinstance(kind, str) else None, error
        if isinstance(error, str):
            return error, None, {}
    return msgspec.json.encode(payload).decode()[:200], None, {}


def _retry_after(headers: httpx2.Headers) -> float | None:
    """Seconds the server asked to wait: ``retry-after-ms``, or ``Retry-After`` as seconds or
    an HTTP date; None when absent or unreadable."""
    raw = headers.get("retry-after-ms")
    if raw is not None:
        seconds = _seconds(raw)
        if seconds is not None:
            return seconds / 1000
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _seconds(raw)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _seconds(raw: str) -> float | None:
    try:
        seconds = float(raw)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _wait(retry_after: float | None, backoff: Backoff, attempt: int) -> float:
    if retry_after is not None:
        return retry_after
    return backoff.delay(attempt - 1, random.random())
