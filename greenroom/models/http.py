"""What the HTTP model adapters share: server-sent events, retries, errors without secrets.

The adapters use httpx2, which runs natively under Trio (through anyio's Trio
backend): no asyncio bridge and no thread left reading. It is the project's one
HTTP stack (the MCP client's too). An official vendor SDK would pull in
asyncio-only pieces, so greenroom speaks the two wire formats itself.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any, Final

import httpx2
import msgspec
import trio

from greenroom.backoff import Backoff
from greenroom.models.base import ModelError
from greenroom.protocol.model import ModelRequest, StreamChunk

logger = logging.getLogger("greenroom.models")

DEFAULT_BACKOFF: Final = Backoff(initial=0.5, maximum=8.0, multiplier=2.0, jitter=0.2)
#: Seconds to wait for a response to start and between two reads of a stream.
READ_TIMEOUT: Final = 120.0


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
    ``{PROVIDER}_API_KEY`` from the environment, else (the URL only) `default_url`.

    The one rule for code and the ``greenroom`` command alike. Raises `ValueError`
    naming the variable when no key is given or set, and for a base URL
    `check_base_url` refuses.
    """
    prefix = provider.upper()
    key = api_key or os.environ.get(f"{prefix}_API_KEY")
    if not key:
        raise ValueError(f"no API key for {provider}: pass api_key= or set {prefix}_API_KEY")
    url = base_url or os.environ.get(f"{prefix}_BASE_URL") or default_url
    return check_base_url(url), key


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


#: Tokens a model is taken to hold when its adapter is not told (for ACP's ``usage_update``).
DEFAULT_CONTEXT_WINDOW: Final = 128_000


class HttpModel:
    """What both adapters share: one endpoint, the headers that carry the key, retries.

    A subclass builds the wire body (`body`) and reads the events (`_stream`).
    ``context_window`` is the tokens the model holds, as the adapter was told.
    """

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        model: str,
        attempts: int,
        backoff: Backoff,
        context_window: int,
    ) -> None:
        self.context_window = context_window
        self._url = url
        self._headers = headers
        self._model = model
        self._attempts = attempts
        self._backoff = backoff

    def __repr__(self) -> str:  # never the headers: they carry the key
        return f"{type(self).__name__}({self._url!r}, model={self._model!r})"

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._stream(request)

    def body(self, request: ModelRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        raise NotImplementedError

    @asynccontextmanager
    async def _events(self, request: ModelRequest) -> AsyncIterator[AsyncGenerator[SseEvent, None]]:
        """POST the request; yield its events, closed with the response however it ends."""
        async with (
            open_stream(
                self._url,
                headers=self._headers,
                body=msgspec.json.encode(self.body(request)),
                attempts=self._attempts,
                backoff=self._backoff,
            ) as response,
            aclosing(sse_events(response)) as events,
        ):
            yield events

    def _object(self, event: SseEvent) -> dict[str, Any]:
        """The event's JSON object; an error naming the event for anything else."""
        try:
            payload = msgspec.json.decode(event.data)
        except msgspec.DecodeError:
            raise ModelError(
                f"{self._url}: malformed {event.event!r} event, not JSON: {event.data[:120]!r}",
                "malformed",
            ) from None
        if not isinstance(payload, dict):
            raise ModelError(f"{self._url}: {event.event!r} event is not an object", "malformed")
        return payload


@asynccontextmanager
async def open_stream(
    url: str,
    *,
    headers: Mapping[str, str],
    body: bytes,
    attempts: int,
    backoff: Backoff,
) -> AsyncIterator[httpx2.Response]:
    """POST `body` and yield the streaming response once the status is 2xx.

    429 and 5xx are retried (at most `attempts` tries in all), waiting what
    ``Retry-After`` asks or the backoff; each retry is logged. 401/403 raise
    `ModelConfigError` at once. Errors name the endpoint, never a header: the
    API key cannot leak into a log, an error or the session log. Leaving the
    context (a cancel included) closes the response and its connection.
    """
    timeout = httpx2.Timeout(READ_TIMEOUT, connect=30.0)
    async with httpx2.AsyncClient(timeout=timeout) as client:
        for attempt in range(1, attempts + 1):
            try:
                async with client.stream("POST", url, headers=headers, content=body) as response:
                    if response.status_code < 300:
                        yield response
                        return
                    detail = await _error_detail(response)
                    status = response.status_code
                    retry_after = response.headers.get("retry-after")
            except httpx2.TransportError as exc:
                raise ModelError(f"{url}: {type(exc).__name__}: {exc}", "connection") from None
            if status in (401, 403):
                raise ModelConfigError(
                    f"{url} refused the credentials (HTTP {status}): {detail}", "unauthorized"
                )
            if status != 429 and status < 500:
                raise ModelError(f"{url} answered HTTP {status}: {detail}", f"http-{status}")
            if attempt == attempts:
                raise ModelError(
                    f"{url} answered HTTP {status} {attempts} times; giving up: {detail}",
                    f"http-{status}",
                )
            delay = _retry_delay(retry_after, backoff, attempt)
            logger.warning(
                "%s answered HTTP %d (%s); retry %d of %d in %.2fs",
                url,
                status,
                detail,
                attempt,
                attempts - 1,
                delay,
            )
            await trio.sleep(delay)


async def _error_detail(response: httpx2.Response) -> str:
    raw = await response.aread()
    try:
        payload = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        text = raw.decode("utf-8", "replace").strip()
        return f"non-JSON body {text[:200]!r}" if text else "empty body"
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return msgspec.json.encode(payload).decode()[:200]


def _retry_delay(retry_after: str | None, backoff: Backoff, attempt: int) -> float:
    if retry_after is not None:
        try:
            seconds = float(retry_after)
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds) and seconds >= 0:
            return min(seconds, backoff.maximum)
    return backoff.delay(attempt - 1, random.random())
