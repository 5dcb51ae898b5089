"""Compaction: a turn deep into a long session, the compaction step, and what stays resident.

* a turn at 10,000 prior turns (1,000 quick) under a window small enough that the
  history is compacted over and over, against a turn at 10 prior turns under the
  same window (none compacted yet); turns that ran a compaction step are left
  out of the first and measured apart, against the same ordinary turn;
* a turn that does not compact (a window it never nears: the estimate runs before
  every model call) against the same turn with a model that has no window (the
  feature off: nothing is estimated), timed, and counted (Python calls per turn,
  `bench.counting`: a step that needs no compaction must add none);
* a compaction's own cost (planning, the transcript, its events, the history
  rebuilt: `Compactor.fit` less the time inside the model's stream) against its
  summarizing call, over a history at the threshold of a 128,000-token window
  (32,000 quick);
* memory: traced bytes of a live session (`Session` seeded from a log) of 100,000
  events (10,000 quick), compacted, against one of 1,000 events, with
  `tracemalloc` (its own ``trio.run``): the log stays resident, so this grows
  with the events (docs/semantics.md, "Compaction").

The model answers at once, a summarizing request with a short summary. Every
variant runs in a fresh ``trio.run``; variants alternate inside each repeat.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Sequence

import msgspec
import trio

from bench.counting import profile
from bench.report import Row, compare
from greenroom.actors.compaction import DEFAULT_POLICY, SUMMARY_SYSTEM, Compactor
from greenroom.models import ScriptedModel
from greenroom.protocol.events import Compacted, SessionEvent
from greenroom.protocol.model import Finish, ModelRequest, StreamChunk, TextDelta, Usage
from greenroom.runtime import open_runtime
from greenroom.session import Session, new_header

SCENARIO = "compaction"
PROMPT = "tell me about item 12345 and what it does next"


class _Model:
    """Answers at once, its usage reported; `window` tokens (0: none, the feature off)."""

    def __init__(self, window: int) -> None:
        if window:
            self.context_window = window

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._reply(request)

    async def _reply(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        await trio.lowlevel.checkpoint()
        if request.system == SUMMARY_SYSTEM:
            yield TextDelta("They asked about items; the agent answered each.")
        else:
            yield TextDelta("item 12345 does this next")
            # About what the prompt and the answer above come to (16 tokens a message):
            # counted in O(1), so the model's cost does not grow with the history.
            yield Usage(input_tokens=16 * len(request.messages), output_tokens=8)
        yield Finish("stop")


async def _turns(prior: int, m: int, window: int) -> tuple[list[float], list[float]]:
    """Seconds of each of `m` turns after `prior` ones: (those that did not compact, those
    that did)."""
    plain: list[float] = []
    compacting: list[float] = []
    async with open_runtime(model=_Model(window)) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        for _ in range(prior):
            agent.send(PROMPT)
            await agent.when_idle()
        events = agent.session.events
        for _ in range(m):
            before = len(events)
            t0 = time.perf_counter()
            agent.send(PROMPT)
            await agent.when_idle()
            spent = time.perf_counter() - t0
            compacted = any(type(e) is Compacted for e in events[before:])
            (compacting if compacted else plain).append(spent)
    return plain, compacting


_WINDOW = 2_000  # tokens: about 60 turns of history


def _deep(prior: int, m: int) -> tuple[float, float]:
    plain, compacting = trio.run(_turns, prior, m, _WINDOW)
    if not compacting:
        raise RuntimeError(f"no turn compacted at {prior} prior turns: the window is too large")
    return statistics.median(plain) * 1e6, statistics.median(compacting) * 1e6


def _shallow(m: int) -> float:
    """Turns 11 to 30 of fresh sessions (none reaches the window), `m` in all."""
    plain: list[float] = []
    for _ in range(max(1, m // 20)):
        some, compacting = trio.run(_turns, 10, 20, _WINDOW)
        if compacting:
            raise RuntimeError("a turn compacted at 10 prior turns: the window is too small")
        plain += some
    return statistics.median(plain) * 1e6


def _unfilled(m: int, window: int) -> float:
    plain, compacting = trio.run(_turns, 0, m, window)
    if compacting:
        raise RuntimeError("a turn compacted under a window it should never near")
    return statistics.median(plain) * 1e6


async def _windowed_turns(m: int) -> float:
    await _turns(0, m, 10_000_000)
    return 0.0


async def _windowless_turns(m: int) -> float:
    await _turns(0, m, 0)
    return 0.0


# -- a compaction's own cost --------------------------------------------------------------------


class _Timed:
    """Answers a summarizing request at once, timing what it spends inside its stream."""

    def __init__(self, window: int) -> None:
        self.context_window = window
        self.spent = 0.0

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._reply()

    async def _reply(self) -> AsyncIterator[StreamChunk]:
        t0 = time.perf_counter()
        try:
            await trio.lowlevel.checkpoint()
            yield TextDelta("They asked about items; the agent answered each.")
            yield Finish("stop")
        finally:
            self.spent += time.perf_counter() - t0


async def _history(window: int) -> list[SessionEvent]:
    """A log with no compaction whose history is just past the threshold of `window` (the
    echo reports no usage: the session counts every byte since the start)."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        while agent.session.added_bytes < 4 * DEFAULT_POLICY.threshold * window:
            agent.send(PROMPT)
            await agent.when_idle()
        return list(agent.session.events)


async def _compactions(
    log: Sequence[SessionEvent], window: int, m: int
) -> tuple[list[float], list[float]]:
    """Microseconds of `m` compactions of `log`, each of a fresh session: their own, and
    their summarizing calls'."""
    model = _Timed(window)
    own: list[float] = []
    call: list[float] = []
    for _ in range(m):
        session = Session(new_header("s"), log)
        compactor = Compactor(session, DEFAULT_POLICY)
        request = ModelRequest(messages=session.messages(), system="Be brief.")
        turn = session.last_turn + 1
        if not compactor.due(request, model, "default"):
            raise RuntimeError("the history is not past the threshold: no compaction is due")
        model.spent = 0.0
        t0 = time.perf_counter()
        await compactor.fit(request, model, "default", turn, 1)
        spent = time.perf_counter() - t0
        if session.compaction is None:
            raise RuntimeError("the compaction logged nothing")
        own.append((spent - model.spent) * 1e6)
        call.append(model.spent * 1e6)
    return own, call


# -- memory -------------------------------------------------------------------------------------


async def _log_of(events: int) -> list[SessionEvent]:
    """A compacted session's log of at least `events` events, made by a live agent."""
    async with open_runtime(model=_Model(_WINDOW)) as rt:
        agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
        while len(agent.session.events) < events:
            agent.send(PROMPT)
            await agent.when_idle()
        return list(agent.session.events)


_DECODER: msgspec.json.Decoder[SessionEvent] = msgspec.json.Decoder(SessionEvent)


def _resident(log: Sequence[SessionEvent]) -> float:
    """Traced bytes of a live session seeded with `log` (the events decoded anew, as a
    resume reads them)."""
    encoded = [msgspec.json.encode(e) for e in log]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        session = Session(new_header("s"), [_DECODER.decode(line) for line in encoded])
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    if session.compaction is None and len(log) > 5_000:
        raise RuntimeError("the long log was never compacted")
    return float(after - before)


def _alternate(variants: Sequence[Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {v.__name__: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:
            gc.collect()
            results[variant.__name__].append(variant())
    return results


def run(repeats: int, quick: bool) -> list[Row]:
    window = 32_000 if quick else 128_000
    history = trio.run(_history, window)
    own, call = trio.run(_compactions, history, window, 3 * repeats)
    counted = 100 if quick else 300
    windowed_calls = profile(_windowed_turns, counted).calls
    windowless_calls = profile(_windowless_turns, counted).calls
    prior = 1_000 if quick else 10_000
    m = 100 if quick else 400
    big = 10_000 if quick else 100_000
    deep_plain: list[float] = []
    deep_compacting: list[float] = []
    shallow: list[float] = []

    def deep() -> float:
        plain, compacting = _deep(prior, m)
        deep_plain.append(plain)
        deep_compacting.append(compacting)
        return plain

    def at_10() -> float:
        value = _shallow(m)
        shallow.append(value)
        return value

    def windowed() -> float:
        return _unfilled(m * 5, 10_000_000)

    def windowless() -> float:
        return _unfilled(m * 5, 0)

    _alternate((deep, at_10), repeats)
    off = _alternate((windowed, windowless), max(repeats, 3))
    small_log = trio.run(_log_of, 1_000)
    large_log = trio.run(_log_of, big)
    small_bytes: list[float] = []
    large_bytes: list[float] = []
    for _ in range(min(repeats, 3)):
        small_bytes.append(_resident(small_log))
        large_bytes.append(_resident(large_log))
    return [
        compare(
            SCENARIO,
            f"one-step turn at {prior:,} prior turns, compacted (window {_WINDOW:,} tokens)",
            "us",
            deep_plain,
            baseline="the same turn at 10 prior turns",
            raw=shallow,
            max_ratio=1.1,
            note="median of the turns that ran no compaction step",
        ),
        compare(
            SCENARIO,
            f"a turn that ran a compaction step, at {prior:,} prior turns",
            "us",
            deep_compacting,
            baseline="the same turn at 10 prior turns",
            raw=shallow,
            note="the compaction step's own cost: a summarizing model call (answering at once)"
            " and the history rebuilt",
        ),
        compare(
            SCENARIO,
            f"one-step turn that does not compact (M={m * 5})",
            "us",
            off["windowed"],
            baseline="the same turn, model without a window (nothing estimated)",
            raw=off["windowless"],
            max_ratio=1.02,
        ),
        compare(
            SCENARIO,
            f"Python calls per one-step turn that does not compact, counted (M={counted})",
            "calls",
            [windowed_calls],
            baseline="the same turn, model without a window",
            raw=[windowless_calls],
            max_ratio=1.0,
            note="the window's estimate is read in the one call that says whether a compaction"
            " is due: no call more",
        ),
        compare(
            SCENARIO,
            f"a compaction's own cost, over {len(history):,} events at the threshold of a"
            f" {window:,}-token window",
            "us",
            own,
            baseline="its summarizing call (a model answering at once)",
            raw=call,
            note="Compactor.fit less the time inside the model's stream: planning, the"
            " transcript, its two events, the history rebuilt; a real summarizing call takes"
            " seconds",
        ),
        compare(
            SCENARIO,
            f"resident bytes of a compacted session of {len(large_log):,} events",
            "B",
            large_bytes,
            baseline=f"a session of {len(small_log):,} events",
            raw=small_bytes,
            max_ratio=2.0,
            note="the log stays resident (Session.events is the whole log: replay, forks and"
            " prompt.events() read it by seq); only the model history is bounded",
        ),
    ]
