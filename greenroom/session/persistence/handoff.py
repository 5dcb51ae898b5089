"""What nodes tell each other (PostgreSQL): let a session go; an answer was kept.

Every node listens (``LISTEN``, psycopg 3: a connection of its own in autocommit,
read by ``notifies()`` in a thread) on a channel of its own, named from its node
name and pid as a lease row names its holder (`channel_of`), and on `RELEASED`.

* An asker sends `Ask` (the session, and its own channel to answer on) to the
  holder's channel, then waits for the lease.
* The holder's runtime answers (`greenroom.actors.factory`): an idle session is
  disposed at once, a busy one after its turn; a holder that keeps its busy
  sessions answers `ReleaseRefused`. A disposed session's lease is freed by its close,
  which says so on `RELEASED` (the session id), waking every asker of it.
* A node that kept an answer to a decision of a session another node holds
  (`put_answer`) sends `Answered` to the holder's channel; the holder reads
  the answer from the store and gives it to the session's agent.

A notification is not a promise: one lost (a listener that reconnects, a node that
dies) costs the asker a retry, never a wrong holder. The lease row and its
advisory lock decide who holds a session; the notices only say when to look again.

`Releases` is one node's end of it (its listening thread, the requests it got, the askers'
watches); `ReleaseWatch` is what an asker of one session hears: a release or a refusal.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeAlias

import msgspec
import psycopg
import trio

logger = logging.getLogger("greenroom.persistence")

#: Where a holder says it let a session go (the payload is `released_key` of its id).
RELEASED: Final = "greenroom_released"
#: The longest payload PostgreSQL's NOTIFY takes is 8000 bytes; an `Ask` past this is not
#: sent (its asker waits for the lease as it is).
MAX_PAYLOAD: Final = 7900
#: Seconds the listening thread waits for a notification before it looks at its stop flag.
POLL: Final = 0.2
#: Release requests a node keeps waiting for its runtime; past it one is dropped (its asker
#: times out, or asks again).
QUEUED: Final = 256


def released_key(session_id: str) -> str:
    """What `RELEASED` says of a session: its id's digest (any id fits a payload)."""
    return hashlib.sha256(session_id.encode()).hexdigest()


def channel_of(node: str, pid: int) -> str:
    """The channel a holder (`node`, `pid`, as its lease row names it) listens on."""
    digest = hashlib.sha256(f"{node}\x00{pid}".encode()).hexdigest()
    return f"greenroom_node_{digest[:24]}"


class Ask(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="ask"):
    """Let `session` go; answer a refusal on `reply_to`."""

    session: str
    reply_to: str


class ReleaseRefused(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="refused"):
    """The holder keeps `session`, for `reason`."""

    session: str
    reason: str


class Answered(msgspec.Struct, frozen=True, gc=False, tag_field="kind", tag="answered"):
    """An answer to decision `decision_id` of `session_id` is kept in the store."""

    session_id: str
    decision_id: str


def answered(session_id: str, decision_id: str) -> str | None:
    """The payload telling a holder an answer is kept; None for ids too long for one
    (the holder then learns it at the session's next start)."""
    payload = _encode(Answered(session_id, decision_id))
    return payload.decode() if len(payload) <= MAX_PAYLOAD else None


Notice: TypeAlias = Ask | ReleaseRefused | Answered
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Notice).decode

Notify: TypeAlias = Callable[[str, str], Awaitable[None]]


class ReleaseRequest:
    """One node asked this one to let `session_id` go; `refuse` tells it no."""

    __slots__ = ("_notify", "_reply_to", "session_id")

    def __init__(self, ask: Ask, notify: Notify) -> None:
        self.session_id = ask.session
        self._reply_to = ask.reply_to
        self._notify = notify

    async def refuse(self, reason: str) -> None:
        """Tell the asker no; its session id came in an `Ask`, so it fits (`reason` is cut
        to make it)."""
        refusal = ReleaseRefused(self.session_id, reason[:200])
        await self._notify(self._reply_to, _encode(refusal).decode())


class ReleaseWatch:
    """What an asker of one session hears: `changed` wakes at a release or a refusal."""

    __slots__ = ("_event", "refused")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.refused: str | None = None

    def _wake(self) -> None:
        self._event.set()
        self._event = trio.Event()

    async def changed(self) -> None:
        await self._event.wait()


class Releases:
    """One node's end of hand-off: its listening thread, the requests it got, the
    askers' watches (see the module docstring).

    `start` returns once the node listens (idempotent); `close` stops the thread
    within `POLL`. Requests and answers go out on `requests`; a notice that does not
    decode is logged and dropped.
    """

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], channel: str) -> None:
        self._connect = connect
        self.channel = channel
        self._thread: threading.Thread | None = None
        self._starting = trio.Lock()
        self._stopped = threading.Event()
        self._send, self.requests = trio.open_memory_channel[Ask | Answered](QUEUED)
        self._watches: dict[str, list[ReleaseWatch]] = {}

    async def start(self) -> None:
        """Listen from now on (again, in a new `trio.run`); raises what connecting raised
        (a `PersistenceError`). Concurrent calls make one listener."""
        async with self._starting:
            if self._thread is not None and self._thread.is_alive():
                return
            db = await trio.to_thread.run_sync(self._listening)
            token = trio.lowlevel.current_trio_token()
            self._thread = threading.Thread(
                target=self._run, args=(db, token), name="greenroom hand-off listener", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(POLL * 5)

    @contextmanager
    def watch(self, session_id: str) -> Iterator[ReleaseWatch]:
        """Hear releases and refusals of `session_id` while in the block."""
        watch = ReleaseWatch()
        self._watches.setdefault(session_id, []).append(watch)
        try:
            yield watch
        finally:
            watches = self._watches[session_id]
            watches.remove(watch)
            if not watches:
                del self._watches[session_id]

    def ask(self, session_id: str) -> str | None:
        """The payload asking a holder to let `session_id` go (answers come here); None
        for an id too long for one."""
        payload = _encode(Ask(session_id, self.channel))
        return payload.decode() if len(payload) <= MAX_PAYLOAD else None

    # -- the thread ------------------------------------------------------------------

    def _listening(self) -> psycopg.Connection[Any]:
        db = self._connect()
        try:
            db.execute(f'LISTEN "{self.channel}"')
            db.execute(f'LISTEN "{RELEASED}"')
        except BaseException:
            db.close()
            raise
        return db

    def _run(self, db: psycopg.Connection[Any], token: trio.lowlevel.TrioToken) -> None:
        try:
            while not self._stopped.is_set():
                try:
                    for notice in db.notifies(timeout=POLL):
                        trio.from_thread.run_sync(
                            self._deliver, notice.channel, notice.payload, trio_token=token
                        )
                except psycopg.OperationalError as exc:  # the server went: listen again
                    logger.warning("hand-off listener lost its connection: %s", exc)
                    db.close()
                    self._stopped.wait(POLL)
                    db = self._listening()
        except trio.RunFinishedError:
            pass
        except Exception:
            logger.exception("the hand-off listener stopped")
        finally:
            db.close()

    # -- on the Trio thread ----------------------------------------------------------

    def _deliver(self, channel: str, payload: str) -> None:
        if channel == RELEASED:
            self._wake_released(payload)
            return
        try:
            notice = _decode(payload)
        except msgspec.DecodeError:
            logger.warning("hand-off: a notice that is not ours on %s: %.200r", channel, payload)
            return
        if isinstance(notice, ReleaseRefused):
            self._wake(notice.session, notice.reason)
            return
        try:
            self._send.send_nowait(notice)
        except trio.WouldBlock:
            session = notice.session if isinstance(notice, Ask) else notice.session_id
            logger.warning("hand-off: %d notices waiting; one of %r dropped", QUEUED, session)

    def _wake(self, session_id: str, refused: str | None) -> None:
        for watch in self._watches.get(session_id, ()):
            if refused is not None:
                watch.refused = refused
            watch._wake()

    def _wake_released(self, key: str) -> None:
        for session_id in [s for s in self._watches if released_key(s) == key]:
            self._wake(session_id, None)


__all__ = [
    "MAX_PAYLOAD",
    "RELEASED",
    "Answered",
    "Ask",
    "ReleaseRequest",
    "Releases",
    "ReleaseWatch",
    "answered",
    "channel_of",
    "released_key",
]
