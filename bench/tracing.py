"""Tracing: what `greenroom.tracing` costs a one-step turn (``send`` + ``when_idle``, the
scripted model at zero latency), against the same turn in a runtime that never heard of it.

* idle: ``greenroom.tracing`` imported and the plugin made, but not plugged (the
  state of every runtime that does not ask for traces, with or without
  ``opentelemetry-api`` installed: nothing of it is on the turn path); goal
  1.05x;
* traced: the plugin plugged, its spans going to an SDK ``TracerProvider`` with
  no exporter (the cost of making the spans; measured only when
  ``opentelemetry-sdk`` is installed), no goal.

Each variant runs in a fresh ``trio.run`` per repeat, the variants alternating.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Awaitable, Callable, Sequence

import trio

from bench.report import Row, compare, skipped
from greenroom import open_runtime
from greenroom.models.scripted import ScriptedModel
from greenroom.runtime import Runtime

SCENARIO = "tracing"


async def _turns(m: int, setup: Callable[[Runtime], Awaitable[None]] | None) -> float:
    """Microseconds per one-step text turn of one agent, after `setup` of its runtime."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        if setup is not None:
            await setup(rt)
        handle = await rt.agents.create(agent_id="a", session_id="s")
        agent = handle.agent
        t0 = time.perf_counter()
        for _ in range(m):
            agent.send("ping")
            await agent.when_idle()
        t1 = time.perf_counter()
    if agent.session.last_turn != m:
        raise RuntimeError(f"expected {m} turns, found {agent.session.last_turn}")
    return (t1 - t0) / m * 1e6


async def _plain(m: int) -> float:
    return await _turns(m, None)


async def _idle(m: int) -> float:
    from greenroom.tracing import tracing

    async def make(rt: Runtime) -> None:
        tracing(rt.models)  # made, never plugged
        await trio.lowlevel.checkpoint()

    return await _turns(m, make)


async def _traced(m: int) -> float:
    from opentelemetry.sdk.trace import TracerProvider

    from greenroom.tracing import tracing

    async def plug(rt: Runtime) -> None:
        await rt.plug("tracing", tracing(rt.models, tracer_provider=TracerProvider()))

    return await _turns(m, plug)


def _sdk() -> bool:
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def _alternate(
    variants: Sequence[Callable[[int], Awaitable[float]]], size: int, repeats: int
) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {v.__name__: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:
            gc.collect()
            results[variant.__name__].append(trio.run(variant, size))
    return results


def run(repeats: int, quick: bool) -> list[Row]:
    m = 300 if quick else 2_000  # turns
    sdk = _sdk()
    turns = _alternate((_plain, _idle, _traced) if sdk else (_plain, _idle), m, repeats)
    rows = [
        compare(
            SCENARIO,
            f"one-step turn, tracing made but not plugged (M={m})",
            "us",
            turns["_idle"],
            baseline="the same turn, no tracing",
            raw=turns["_plain"],
            max_ratio=1.05,
        )
    ]
    if sdk:
        rows.append(
            compare(
                SCENARIO,
                f"one-step turn, traced (SDK provider, no exporter) (M={m})",
                "us",
                turns["_traced"],
                baseline="the same turn, no tracing",
                raw=turns["_plain"],
            )
        )
    else:
        metric = f"one-step turn, traced (SDK provider, no exporter) (M={m})"
        rows.append(skipped(SCENARIO, metric, "us", "opentelemetry-sdk is not installed"))
    return rows
