"""Scale: idle agents by the hundred thousand, and a thousand agents taking turns at once.

* the curve: for N live agents, N in 1, 10, ..., 100,000 (quick: 1 and
  1,000), one fresh interpreter per point and variant (``python -m
  bench._scale_child``, see there for exactly what is timed) measures the
  traced bytes per idle agent (`tracemalloc`), the RSS growth per agent, the
  create rate (sequential ``rt.agents.create``), the one-step turn of one
  agent while the N - 1 others sit idle, and the dispose rate (closing the
  runtime, which stops the agents one by one). The raw Trio baseline at each
  point: N tasks started with ``nursery.start``, each parked in its own
  CancelScope, a round trip through an echo task with them alive, and a
  cancel of their nursery. The two variants alternate at each point, inside
  each repeat. Tracing 100,000 agents takes about half a minute, so the point
  of 100,000 is traced in the first repeat only (its other figures, RSS
  included, in every repeat);
* concurrency: A agents each running T one-step turns (``send`` then
  ``when_idle``, ``ScriptedModel(delay=0)``), all A at once in one nursery,
  in turns per second from the first send to the last turn's end (the
  creates are not timed), against A echo tasks each doing T round trips over
  its own two memory channels, all at once. Each in a fresh ``trio.run``;
* nothing grows: traced bytes left per disposed session after S sessions
  were each created, prompted once and disposed with JSONL persistence, and
  per finished background task after B ``bash`` tasks (some writing past the
  in-memory tail, so with spill files) ended and were read by their owner's
  agent through ``bash_output`` (the tools alone, without the plugin's
  completion notices, which are turns of the owner's conversation), with the
  spill files left over counted,
  each after a warm-up round (the sessions' traced as well, past the
  bounded histories they feed), in a fresh ``trio.run``.

The whole scenario runs ``min(repeats, 3)`` repeats: the 100,000-agent point
alone takes about a minute per repeat.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import trio

from bench.report import Row, compare
from greenroom.actors.types import ToolInvocation
from greenroom.models import ScriptedModel
from greenroom.models.scripted import KEPT_REQUESTS
from greenroom.runtime import open_runtime
from greenroom.session.persistence import JsonlPersistence
from greenroom.supervisor.supervisor import EXIT_HISTORY
from greenroom.tools.bash.local import LocalBashExecutor
from greenroom.tools.bash.tools import bash_tools

T = TypeVar("T")

SCENARIO = "scale"
#: Seconds one curve point (one child interpreter) may take before it counts as a hang.
_TIMEOUT = 600.0
#: At and above this N, only the first repeat traces memory.
_TRACE_ONCE = 100_000
#: Bytes per idle agent at the largest N (the goal).
_MEMORY_GOAL = 3500
_ROOT = Path(__file__).resolve().parent.parent

_RAW = "nursery.start task parked in own CancelScope"
#: Sessions that fill every bounded history a session's life adds to.
_HISTORIES = max(EXIT_HISTORY, KEPT_REQUESTS) + 10

# -- the curve ---------------------------------------------------------------------------------


def _point(variant: str, n: int, m: int, traced: bool) -> dict[str, float | None]:
    done = subprocess.run(
        [sys.executable, "-m", "bench._scale_child", variant, str(n), str(m)]
        + ([] if traced else ["--no-trace"]),
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"bench._scale_child {variant} {n} {m} exited {done.returncode}:\n{done.stderr}"
        )
    result: dict[str, float | None] = json.loads(done.stdout)
    return result


# -- concurrency ---------------------------------------------------------------------------------


async def _ours_concurrent(agents: int, turns: int) -> float:
    """Turns per second: `agents` agents each taking `turns` turns, all at once."""
    async with open_runtime(model=ScriptedModel(delay=0)) as rt:
        handles = [
            await rt.agents.create(agent_id=f"a{i}", session_id=f"s{i}") for i in range(agents)
        ]

        async def drive(index: int) -> None:
            agent = handles[index].agent
            for _ in range(turns):
                agent.send("ping")
                await agent.when_idle()

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for index in range(agents):
                nursery.start_soon(drive, index)
        t1 = time.perf_counter()
        short = [h.agent.id for h in handles if h.agent.session.last_turn != turns]
    if short:
        raise RuntimeError(f"{len(short)} agents did not take {turns} turns: {short[:5]}")
    return agents * turns / (t1 - t0)


async def _raw_concurrent(agents: int, turns: int) -> float:
    """Round trips per second: `agents` echo pairs each doing `turns` round trips, all at once."""

    async def echo(
        inbound: trio.MemoryReceiveChannel[str], outbound: trio.MemorySendChannel[str]
    ) -> None:
        async for message in inbound:
            await outbound.send(message)

    async def drive(
        to_echo: trio.MemorySendChannel[str], back: trio.MemoryReceiveChannel[str]
    ) -> None:
        for _ in range(turns):
            await to_echo.send("ping")
            await back.receive()

    async with trio.open_nursery() as echoes:
        pairs = []
        for _ in range(agents):
            to_echo, echo_in = trio.open_memory_channel[str](1)
            echo_out, back = trio.open_memory_channel[str](1)
            echoes.start_soon(echo, echo_in, echo_out)
            pairs.append((to_echo, back))
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for to_echo, back in pairs:
                nursery.start_soon(drive, to_echo, back)
        t1 = time.perf_counter()
        echoes.cancel_scope.cancel()
    return agents * turns / (t1 - t0)


# -- the scenario ---------------------------------------------------------------------------


# -- nothing grows ------------------------------------------------------------------------------


async def _growth_per_session(root: Path, sessions: int) -> float:
    """Traced bytes left per session created, prompted once and disposed (JSONL).

    Tracing starts before a second warm-up round that fills the bounded histories a session
    feeds (the supervisor's exits, the scripted model's requests) with traced entries: each
    entry made before tracing that a measured session replaces would count as growth (40-60
    KB in all, ~120 B per session at the quick size).
    """
    async with open_runtime(model=ScriptedModel(delay=0), persistence=JsonlPersistence(root)) as rt:

        async def life(number: int) -> None:
            handle = await rt.agents.create(agent_id="a", session_id=f"s{number}")
            handle.agent.send("ping")
            await handle.agent.when_idle()
            await handle.dispose()

        for number in range(50):  # warm-up: caches, interned strings, first allocations
            await life(-number - 1)
        gc.collect()
        tracemalloc.start()
        for number in range(_HISTORIES):
            await life(-number - 51)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for number in range(sessions):
            await life(number)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    return (after - before) / sessions


async def _growth_per_task(root: Path, tasks: int) -> tuple[float, int]:
    """Traced bytes left per background task finished and read by its owner; spill files left."""
    async with open_runtime(model=ScriptedModel(delay=0), workdir=str(root)) as rt:
        # The tools without the plugin's completion notices: a notice is a turn of the
        # owner's conversation, which grows by design; the records must not.
        for tool in bash_tools(rt.bash, rt.agents.by_session):
            rt.tools.register(tool)
        owner = (await rt.agents.create(agent_id="a", session_id="owner")).agent

        async def call(name: str, arguments: dict[str, object]) -> str:
            invocation = ToolInvocation("c", name, json.dumps(arguments), owner)
            outcome = await rt.tools.execute(invocation)
            if outcome.is_error:
                raise RuntimeError(outcome.content)
            return outcome.content

        async def task(number: int) -> None:
            big = number % 10 == 0  # past the 64,000-byte tail: a spill file
            command = "head -c 70000 /dev/zero" if big else "echo done"
            started = await call(
                "bash", {"command": command, "description": "d", "run_in_background": True}
            )
            task_id = started.rsplit(" ", 1)[1]
            await rt.bash.wait(task_id)
            await call("bash_output", {"task_id": task_id})

        for number in range(20):
            await task(number)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for number in range(tasks):
            await task(number)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert isinstance(rt.bash, LocalBashExecutor)
        spills = len(rt.bash.spills.files())  # this executor's own, not other processes'
    return (after - before) / tasks, spills


def _in_tempdir(measure: Callable[[Path], T]) -> T:
    with tempfile.TemporaryDirectory(prefix="greenroom-bench-") as tmp:
        return measure(Path(tmp))


def run(repeats: int, quick: bool) -> list[Row]:
    sizes = [1, 1_000] if quick else [1, 10, 100, 1_000, 10_000, 100_000]
    m = 300 if quick else 2_000  # turns timed at each point
    agents, turns = (200, 5) if quick else (1_000, 10)
    repeats = min(repeats, 3)

    points: dict[tuple[str, int], list[dict[str, float | None]]] = {}
    traced: dict[tuple[str, int], list[float]] = {}
    concurrent: dict[str, list[float]] = {"ours": [], "raw": []}
    sessions, tasks = (500, 200) if quick else (5_000, 2_000)
    per_session: list[float] = []
    per_task: list[float] = []
    spills: list[float] = []
    for repeat in range(repeats):
        for n in sizes:
            trace = n < _TRACE_ONCE or repeat == 0
            for variant in ("raw", "ours") if repeat % 2 == 0 else ("ours", "raw"):
                result = _point(variant, n, m, trace)
                points.setdefault((variant, n), []).append(result)
                value = result.get("traced_per_agent")
                if value is not None:
                    traced.setdefault((variant, n), []).append(value)
        for variant, measure in (("raw", _raw_concurrent), ("ours", _ours_concurrent)):
            gc.collect()
            concurrent[variant].append(trio.run(measure, agents, turns))
        gc.collect()
        per_session.append(_in_tempdir(lambda root: trio.run(_growth_per_session, root, sessions)))
        gc.collect()
        grown, left = _in_tempdir(lambda root: trio.run(_growth_per_task, root, tasks))
        per_task.append(grown)
        spills.append(left)

    def series(variant: str, n: int, key: str) -> list[float]:
        values = [p[key] for p in points[(variant, n)]]
        return [v for v in values if v is not None]

    top = sizes[-1]
    rows: list[Row] = []
    for n in sizes:
        once = n >= _TRACE_ONCE and repeats > 1
        rows.append(
            compare(
                SCENARIO,
                f"traced memory per idle agent (N={n})",
                "B",
                traced[("ours", n)],
                baseline=f"{_RAW}",
                raw=traced[("raw", n)],
                max_value=_MEMORY_GOAL if n == top else None,
                note="traced in the first repeat only (tracing this many takes ~30 s)"
                if once
                else None,
                plot="memory_per_agent",
                n=n,
            )
        )
    for n in sizes:
        rows.append(
            compare(
                SCENARIO,
                f"one-step turn with N={n} live agents (M={m})",
                "us",
                series("ours", n, "turn_us"),
                baseline="memory-channel round trip, N parked tasks",
                raw=series("raw", n, "turn_us"),
                plot="turn_overhead",
                n=n,
            )
        )
    rss_ours, rss_raw = series("ours", top, "rss_per_agent"), series("raw", top, "rss_per_agent")
    if rss_ours and len(rss_ours) == len(rss_raw):
        rows.append(
            compare(
                SCENARIO,
                f"RSS growth per idle agent (N={top})",
                "B",
                rss_ours,
                baseline=_RAW,
                raw=rss_raw,
                note="RSS after a gc.collect(), minus RSS before the creates, over N;"
                " it includes the allocator's slack that tracemalloc does not see",
            )
        )
    for n in (s for s in sizes if s >= 1_000):
        rows.append(
            compare(
                SCENARIO,
                f"create rate, one after another (N={n})",
                "agents/s",
                series("ours", n, "create_per_s"),
                baseline="nursery.start+CancelScope",
                raw=series("raw", n, "create_per_s"),
            )
        )
    for n in (s for s in sizes if s >= 1_000):
        rows.append(
            compare(
                SCENARIO,
                f"dispose rate, runtime close (N={n})",
                "agents/s",
                series("ours", n, "dispose_per_s"),
                baseline="nursery cancel",
                raw=series("raw", n, "dispose_per_s"),
            )
        )
    rows.append(
        compare(
            SCENARIO,
            f"concurrent turns, {agents} agents x {turns} turns at once",
            "turns/s",
            concurrent["ours"],
            baseline=f"{agents} echo tasks x {turns} round trips",
            raw=concurrent["raw"],
            min_ratio=0.7,
        )
    )
    rows.append(
        compare(
            SCENARIO,
            f"traced growth per disposed session (JSONL, S={sessions})",
            "B",
            per_session,
            max_value=64,
        )
    )
    rows.append(
        compare(
            SCENARIO,
            f"traced growth per finished and read bash task (B={tasks})",
            "B",
            per_task,
            max_value=256,
        )
    )
    rows.append(
        compare(
            SCENARIO,
            f"spill files left after {tasks} finished and read bash tasks",
            "files",
            spills,
            max_value=0,
        )
    )
    return rows
