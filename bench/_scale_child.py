"""``python -m bench._scale_child {ours|raw} N M [--no-trace]``: one point of the scale curve.

Run in a fresh interpreter by `bench.scale`, so that its RSS is its own. It
prints one JSON object with:

* ``create_per_s``: N agents created one after another (``rt.agents.create``)
  per second; raw: N ``nursery.start`` of a task parked in its own CancelScope;
* ``rss_per_agent``: the growth of RSS (``/proc/self/statm``, after a
  ``gc.collect()``) over those N creates, divided by N (None off Linux);
* ``turn_us``: microseconds per one-step text turn (``send`` then
  ``when_idle``, ``ScriptedModel(delay=0)``) of one of the N agents, M turns,
  while the other N - 1 sit idle; raw: a round trip through an echo task over
  two memory channels, with the N parked tasks alive;
* ``dispose_per_s``: N agents disposed per second by closing the runtime (the
  agents' supervisor stops them one by one, last created first); raw: the N
  tasks cancelled through their nursery's scope, until the nursery has exited;
* ``traced_per_agent``: in a second pass, with `tracemalloc` tracing, the
  traced bytes that N more creates leave alive (after a ``gc.collect()``), per
  agent. The cyclic GC is off while those N are created (they are not timed;
  it only makes tracing 100,000 agents affordable) and a full collection runs
  before the memory is read; tracing stops before the runtime closes. With
  ``--no-trace`` this pass is skipped and ``traced_per_agent`` is None.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import tracemalloc

import trio

from greenroom.models import ScriptedModel
from greenroom.runtime import open_runtime

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as file:
            return int(file.read().split()[1]) * _PAGE
    except OSError:
        return None


def _settled_rss() -> int | None:
    gc.collect()
    return _rss()


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


# -- raw ----------------------------------------------------------------------------------------


async def _parked(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.CancelScope():
        task_status.started()
        # Dropped so that the frame does not keep trio's temporary start nursery alive.
        del task_status
        await trio.sleep_forever()


async def _echo(
    inbound: trio.MemoryReceiveChannel[str], outbound: trio.MemorySendChannel[str]
) -> None:
    async for message in inbound:
        await outbound.send(message)


async def _raw_timed(n: int, m: int) -> dict[str, float | None]:
    to_echo, echo_in = trio.open_memory_channel[str](1)
    echo_out, from_echo = trio.open_memory_channel[str](1)
    async with trio.open_nursery() as outer:
        outer.start_soon(_echo, echo_in, echo_out)
        async with trio.open_nursery() as nursery:
            before = _settled_rss()
            t0 = time.perf_counter()
            for _ in range(n):
                await nursery.start(_parked)
            t1 = time.perf_counter()
            after = _settled_rss()
            for _ in range(min(m, 20)):  # warm-up
                await to_echo.send("ping")
                await from_echo.receive()
            t2 = time.perf_counter()
            for _ in range(m):
                await to_echo.send("ping")
                await from_echo.receive()
            t3 = time.perf_counter()
            nursery.cancel_scope.cancel()
        t4 = time.perf_counter()
        outer.cancel_scope.cancel()
    return _timed(n, m, t1 - t0, before, after, t3 - t2, t4 - t3)


async def _raw_traced(n: int) -> float:
    async with trio.open_nursery() as nursery:
        before = _traced()
        gc.disable()
        try:
            for _ in range(n):
                await nursery.start(_parked)
        finally:
            gc.enable()
        after = _traced()
        tracemalloc.stop()
        nursery.cancel_scope.cancel()
    return (after - before) / n


# -- ours ---------------------------------------------------------------------------------------


async def _ours_timed(n: int, m: int) -> dict[str, float | None]:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        before = _settled_rss()
        t0 = time.perf_counter()
        for i in range(n):
            await rt.agents.create(agent_id=f"a{i}", session_id=f"s{i}")
        t1 = time.perf_counter()
        after = _settled_rss()
        agent = rt.agents.get("a0")
        assert agent is not None
        warmup = min(m, 20)
        for _ in range(warmup):
            agent.send("ping")
            await agent.when_idle()
        t2 = time.perf_counter()
        for _ in range(m):
            agent.send("ping")
            await agent.when_idle()
        t3 = time.perf_counter()
        turns = agent.session.last_turn
        live = len(rt.agents.list())
    t4 = time.perf_counter()
    if turns != m + warmup or live != n:
        raise RuntimeError(f"expected {m + warmup} turns and {n} live agents: {turns}, {live}")
    return _timed(n, m, t1 - t0, before, after, t3 - t2, t4 - t3)


async def _ours_traced(n: int) -> float:
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        before = _traced()
        gc.disable()
        try:
            for i in range(n):
                await rt.agents.create(agent_id=f"a{i}", session_id=f"s{i}")
        finally:
            gc.enable()
        after = _traced()
        tracemalloc.stop()
    return (after - before) / n


def _timed(
    n: int,
    m: int,
    create: float,
    before: int | None,
    after: int | None,
    turns: float,
    dispose: float,
) -> dict[str, float | None]:
    return {
        "create_per_s": n / create,
        "rss_per_agent": None if before is None or after is None else (after - before) / n,
        "turn_us": turns / m * 1e6,
        "dispose_per_s": n / dispose,
    }


def main(argv: list[str]) -> int:
    trace = "--no-trace" not in argv
    args = [a for a in argv if a != "--no-trace"]
    if len(args) != 3 or args[0] not in ("ours", "raw") or int(args[1]) < 1 or int(args[2]) < 1:
        sys.stderr.write(__doc__ or "")
        return 2
    variant, n, m = args[0], int(args[1]), int(args[2])
    timed, traced = (_ours_timed, _ours_traced) if variant == "ours" else (_raw_timed, _raw_traced)
    result = trio.run(timed, n, m)
    result["traced_per_agent"] = None
    if trace:
        gc.collect()
        tracemalloc.start()
        result["traced_per_agent"] = trio.run(traced, n)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
