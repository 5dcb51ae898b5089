"""Supervisor: start order, strategies, restart types, intensity, backoff, shutdown."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from greenroom.supervisor import (
    Backoff,
    ChildSpec,
    ExitRecord,
    Supervisor,
    SupervisorEscalation,
    cleanup_scope,
    supervisor_child,
)


class Probe:
    """What the children did, with the virtual time of each event."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str]] = []

    def note(self, event: str, name: str) -> None:
        self.events.append((trio.current_time(), event, name))

    def names(self, event: str) -> list[str]:
        return [name for _, kind, name in self.events if kind == event]

    def times(self, event: str, name: str) -> list[float]:
        return [t for t, kind, who in self.events if kind == event and who == name]


def worker(
    probe: Probe,
    name: str,
    *,
    crash_after: float | None = None,
    return_after: float | None = None,
    cleanup: float = 0.0,
    restart: Any = "permanent",
    shutdown: Any = 5.0,
) -> ChildSpec:
    """A child that notes its start and stop, and may crash or return on its own."""

    async def start(*, task_status: trio.TaskStatus[str]) -> None:
        probe.note("start", name)
        task_status.started(name)
        try:
            if crash_after is not None:
                await trio.sleep(crash_after)
                probe.note("crash", name)
                raise RuntimeError(f"{name} crashed")
            if return_after is not None:
                await trio.sleep(return_after)
                probe.note("return", name)
                return
            await trio.sleep_forever()
        except trio.Cancelled:
            probe.note("stop", name)
            if cleanup:
                with cleanup_scope():
                    await trio.sleep(cleanup)
                    probe.note("cleaned", name)
            raise

    return ChildSpec(name, start, restart=restart, shutdown=shutdown)


def collect(sup: Supervisor) -> list[ExitRecord]:
    records: list[ExitRecord] = []
    sup.add_exit_listener(records.append)
    return records


async def test_static_children_start_in_order_and_stop_in_reverse() -> None:
    probe = Probe()
    async with Supervisor([worker(probe, n) for n in "abc"]) as sup:
        assert probe.names("start") == ["a", "b", "c"]
        assert [(c.name, c.state) for c in sup.tree().children] == [
            ("a", "running"),
            ("b", "running"),
            ("c", "running"),
        ]
        records = collect(sup)
    assert probe.names("stop") == ["c", "b", "a"]
    assert [(r.child, r.outcome) for r in records] == [
        ("c", "shutdown"),
        ("b", "shutdown"),
        ("a", "shutdown"),
    ]


async def test_child_is_up_only_after_started() -> None:
    ready = trio.Event()

    async def slow(*, task_status: trio.TaskStatus[str]) -> None:
        await trio.sleep(3)
        ready.set()
        task_status.started("slow")
        await trio.sleep_forever()

    async with Supervisor([ChildSpec("slow", slow)]) as sup:
        assert ready.is_set()
        assert trio.current_time() == 3
        assert await sup.start_child(ChildSpec("later", slow)) == "slow"


@pytest.mark.parametrize(
    ("strategy", "stopped", "restarted"),
    [
        ("one_for_one", [], ["b"]),
        ("one_for_all", ["c", "a"], ["a", "b", "c"]),
        ("rest_for_one", ["c"], ["b", "c"]),
    ],
)
async def test_strategy_with_three_children(
    strategy: Any, stopped: list[str], restarted: list[str]
) -> None:
    probe = Probe()
    children = [worker(probe, "a"), worker(probe, "b", crash_after=1), worker(probe, "c")]
    async with Supervisor(children, strategy=strategy) as sup:
        records = collect(sup)
        await trio.sleep(1.5)  # b crashed at t=1, then every 1 s (it crashes on each start)
        assert probe.names("crash")[:1] == ["b"]
        first_restart = [e for e in probe.events if e[0] == 1.0]
        # At t=1: b crashes, the strategy stops the siblings last-started-first,
        # then starts the group again in start order.
        assert [(kind, name) for _, kind, name in first_restart] == (
            [("crash", "b")] + [("stop", n) for n in stopped] + [("start", n) for n in restarted]
        )
        assert [(r.child, r.outcome) for r in records] == [("b", "error")] + [
            (n, "cancelled") for n in stopped
        ]
        restarts = {c.name: c.restarts for c in sup.tree().children}
        assert restarts == {n: (1 if n in restarted else 0) for n in "abc"}
        assert [c.name for c in sup.tree().children] == ["a", "b", "c"]


async def test_permanent_child_is_restarted_after_a_normal_exit() -> None:
    probe = Probe()
    async with Supervisor([worker(probe, "p", return_after=1)], intensity=10) as sup:
        await trio.sleep(2.5)
        assert probe.times("start", "p") == [0, 1, 2]
        assert sup.tree().children[0].restarts == 2


async def test_transient_child_is_restarted_after_an_error_only() -> None:
    probe = Probe()
    children = [
        worker(probe, "fails", crash_after=1, restart="transient"),
        worker(probe, "ends", return_after=1, restart="transient"),
    ]
    async with Supervisor(children, intensity=10) as sup:
        await trio.sleep(1.5)
        assert probe.times("start", "fails") == [0, 1]
        assert probe.times("start", "ends") == [0]
        states = {c.name: c.state for c in sup.tree().children}
        assert states == {"fails": "running", "ends": "terminated"}


async def test_temporary_child_is_never_restarted_and_is_forgotten() -> None:
    probe = Probe()
    children = [worker(probe, "keep"), worker(probe, "once", crash_after=1, restart="temporary")]
    async with Supervisor(children, strategy="one_for_all") as sup:
        records = collect(sup)
        await trio.sleep(5)
        assert probe.times("start", "once") == [0]
        assert probe.times("start", "keep") == [0]  # a temporary exit triggers no strategy
        assert [c.name for c in sup.tree().children] == ["keep"]
        assert [(r.child, r.outcome) for r in records] == [("once", "error")]


async def test_temporary_sibling_stopped_by_the_strategy_is_not_restarted() -> None:
    probe = Probe()
    children = [worker(probe, "crasher", crash_after=1), worker(probe, "temp", restart="temporary")]
    async with Supervisor(children, strategy="one_for_all", intensity=1) as sup:
        await trio.sleep(1.5)
        assert probe.times("start", "temp") == [0]
        assert [c.name for c in sup.tree().children] == ["crasher"]


async def test_intensity_escalates_at_the_exact_count_and_time() -> None:
    probe = Probe()
    children = [worker(probe, "first"), worker(probe, "flaky", crash_after=1)]
    sup = Supervisor(children, name="root", intensity=3, period=5)
    with pytest.raises(SupervisorEscalation) as caught:
        async with sup:
            await trio.sleep_forever()
    # Restarts at t=1, 2, 3 are allowed; the crash at t=4 is the fourth in 5 s.
    assert trio.current_time() == 4
    assert probe.times("crash", "flaky") == [1, 2, 3, 4]
    assert probe.times("start", "flaky") == [0, 1, 2, 3]
    assert caught.value.supervisor == "root"
    assert [(r.child, r.outcome, r.time) for r in caught.value.exits] == [
        ("flaky", "error", t) for t in (1.0, 2.0, 3.0, 4.0)
    ]
    assert caught.value.exits[-1].exception == "RuntimeError: flaky crashed"
    # Every child was stopped (reverse start order) before the escalation left.
    assert probe.names("stop") == ["first"]
    assert sup.exits[-1].child == "first"
    assert sup.exits[-1].outcome == "shutdown"


async def test_restarts_outside_the_period_do_not_count() -> None:
    probe = Probe()
    async with Supervisor([worker(probe, "slow", crash_after=6)], intensity=1, period=5):
        await trio.sleep(29)
    assert probe.times("crash", "slow") == [6, 12, 18, 24]


async def test_intensity_zero_escalates_on_the_first_restart() -> None:
    probe = Probe()
    with pytest.raises(SupervisorEscalation):
        async with Supervisor([worker(probe, "x", crash_after=2)], intensity=0):
            await trio.sleep_forever()
    assert trio.current_time() == 2


async def test_backoff_delays_grow_and_cap() -> None:
    probe = Probe()
    backoff = Backoff(initial=1, multiplier=2, maximum=5, jitter=0)
    async with Supervisor(
        [worker(probe, "x", crash_after=0)], intensity=10, period=100, backoff=backoff
    ):
        await trio.sleep(25)
    # Crash at once on each start; delays 1, 2, 4, 5, 5 ...
    assert probe.times("start", "x")[:6] == [0, 1, 3, 7, 12, 17]


async def test_backoff_jitter_stays_within_its_band() -> None:
    probe = Probe()
    backoff = Backoff(initial=2, multiplier=1, maximum=2, jitter=0.5)
    async with Supervisor(
        [worker(probe, "x", crash_after=0)],
        intensity=100,
        period=1000,
        backoff=backoff,
        rng=random.Random(7),
    ):
        await trio.sleep(60)
    starts = probe.times("start", "x")
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) > 10
    assert all(2 <= gap <= 3 for gap in gaps)
    assert len(set(gaps)) > 1  # jitter actually varies the delay


async def test_shutdown_gives_each_child_its_grace_then_cuts_it_off() -> None:
    probe = Probe()
    children = [
        worker(probe, "a"),
        worker(probe, "b", cleanup=10, shutdown=1),
        worker(probe, "c", cleanup=0.5, shutdown=2),
    ]
    async with Supervisor(children) as sup:
        records = collect(sup)
    # c finishes its cleanup within its grace; b overruns and is cut off after
    # 1 s; only then is a stopped: the supervisor moved on either way.
    assert [(t, kind, name) for t, kind, name in probe.events if kind != "start"] == [
        (0, "stop", "c"),
        (0.5, "cleaned", "c"),
        (0.5, "stop", "b"),
        (1.5, "stop", "a"),
    ]
    assert [(r.child, r.outcome, r.time) for r in records] == [
        ("c", "shutdown", 0.5),
        ("b", "killed", 1.5),
        ("a", "shutdown", 1.5),
    ]


async def test_brutal_shutdown_cuts_cleanup_at_once_and_infinity_waits() -> None:
    probe = Probe()
    children = [
        worker(probe, "patient", cleanup=100, shutdown="infinity"),
        worker(probe, "brutal", cleanup=100, shutdown="brutal"),
    ]
    async with Supervisor(children) as sup:
        records = collect(sup)
    assert [(r.child, r.outcome, r.time) for r in records] == [
        ("brutal", "killed", 0),
        ("patient", "shutdown", 100),
    ]
    assert probe.names("cleaned") == ["patient"]


async def test_a_bare_shield_overrun_is_recorded_killed_and_awaited() -> None:
    probe = Probe()

    async def stubborn(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(10)
                probe.note("finally-done", "stubborn")

    children = [worker(probe, "first"), ChildSpec("stubborn", stubborn, shutdown=1)]
    async with Supervisor(children) as sup:
        records = collect(sup)
    # The supervisor moved on to "first" after 1 s; the nursery still waited.
    assert probe.times("stop", "first") == [1]
    assert probe.times("finally-done", "stubborn") == [10]
    assert trio.current_time() == 10
    assert [(r.child, r.outcome) for r in records] == [
        ("first", "shutdown"),
        ("stubborn", "killed"),
    ]


async def test_outer_cancel_still_stops_children_in_reverse_order() -> None:
    probe = Probe()
    with trio.move_on_after(3):
        async with Supervisor([worker(probe, n, cleanup=1) for n in "abc"]):
            await trio.sleep_forever()
    assert [(t, name) for t, kind, name in probe.events if kind == "stop"] == [
        (3, "c"),
        (4, "b"),
        (5, "a"),
    ]


async def test_cancel_reason_names_the_supervisor() -> None:
    reasons: list[str | None] = []

    async def child(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        except trio.Cancelled as cancel:
            reasons.append(cancel.reason)
            raise

    async with Supervisor([ChildSpec("c", child)], name="root"):
        pass
    assert reasons == ["supervisor 'root': shutdown"]


async def test_nested_escalation_is_one_failure_of_the_parent_child() -> None:
    probe = Probe()
    nested = supervisor_child(
        "inner", [worker(probe, "leaf", crash_after=1)], intensity=1, period=10
    )
    async with Supervisor([worker(probe, "sibling"), nested], name="root") as root:
        records = collect(root)
        await trio.sleep(2.5)
        inner_records = [r for r in records if r.child == "inner"]
        assert len(inner_records) == 1
        assert inner_records[0].outcome == "error"
        assert inner_records[0].time == 2
        assert "SupervisorEscalation" in (inner_records[0].exception or "")
        assert "'inner' exceeded 1 restarts" in (inner_records[0].exception or "")
        node = root.tree().children[1]
        assert (node.name, node.state, node.restarts) == ("inner", "running", 1)
        assert node.supervisor is not None
        assert node.supervisor.children[0].name == "leaf"
    assert probe.times("start", "sibling") == [0]


async def test_nested_escalations_reach_the_parent_intensity() -> None:
    probe = Probe()
    nested = supervisor_child("inner", [worker(probe, "leaf", crash_after=1)], intensity=0)
    with pytest.raises(SupervisorEscalation) as caught:
        async with Supervisor([nested], name="root", intensity=1, period=10):
            await trio.sleep_forever()
    assert caught.value.supervisor == "root"
    assert [r.child for r in caught.value.exits] == ["inner", "inner"]
    assert trio.current_time() == 2


async def test_tree_renders_nested_supervisors() -> None:
    probe = Probe()
    nested = supervisor_child("workers", [worker(probe, "w1"), worker(probe, "w2")])
    async with Supervisor([worker(probe, "db"), nested], name="root") as root:
        text = root.tree().render()
    assert text.splitlines() == [
        "root [one_for_one, 3 restarts in 5s, up]",
        "├── db  running  permanent  restarts=0",
        "└── workers  running  permanent  restarts=0  workers [one_for_one, 3 restarts in 5s, up]",
        "    ├── w1  running  permanent  restarts=0",
        "    └── w2  running  permanent  restarts=0",
    ]


async def test_stop_child_and_restart_child() -> None:
    probe = Probe()
    async with Supervisor([worker(probe, "a"), worker(probe, "b")]) as sup:
        await sup.stop_child("a")
        assert [(c.name, c.state) for c in sup.tree().children] == [
            ("a", "terminated"),
            ("b", "running"),
        ]
        assert await sup.restart_child("a") == "a"
        assert await sup.restart_child("b") == "b"
        assert probe.names("start") == ["a", "b", "a", "b"]
        assert {c.name: c.restarts for c in sup.tree().children} == {"a": 1, "b": 1}
        with pytest.raises(KeyError, match="no child 'zzz'"):
            await sup.stop_child("zzz")
    assert probe.names("stop") == ["a", "b", "b", "a"]


async def test_dynamic_children_stop_in_reverse_start_order() -> None:
    probe = Probe()
    async with Supervisor([worker(probe, "static")]) as sup:
        for n in ("d1", "d2"):
            await sup.start_child(worker(probe, n, restart="temporary"))
    assert probe.names("stop") == ["d2", "d1", "static"]


async def test_a_raising_exit_listener_is_contained() -> None:
    probe = Probe()
    seen: list[str] = []

    def bad(record: ExitRecord) -> None:
        raise ValueError("listener broke")

    async with Supervisor([worker(probe, "x", crash_after=1)]) as sup:
        sup.add_exit_listener(bad)
        remove = sup.add_exit_listener(lambda r: seen.append(r.child))
        await trio.sleep(1.5)
        remove()
        await trio.sleep(1)
    assert seen == ["x"]
    assert probe.times("start", "x") == [0, 1, 2]


# -- bad input -------------------------------------------------------------


def noop_start() -> Callable[..., Any]:
    async def start(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await trio.sleep_forever()

    return start


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"restart": "sometimes"}, "child 'w': unknown restart type 'sometimes'"),
        ({"shutdown": -1}, "child 'w': shutdown must be a grace >= 0 seconds"),
        ({"shutdown": "soon"}, "child 'w': shutdown must be a grace"),
        ({"shutdown": float("nan")}, "child 'w': shutdown must be a grace"),
    ],
)
def test_bad_child_specs_name_the_child_and_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ChildSpec("w", noop_start(), **kwargs)


def test_bad_supervisor_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown strategy 'all_for_none'"):
        Supervisor(strategy="all_for_none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="duplicate child name 'w'"):
        Supervisor([ChildSpec("w", noop_start()), ChildSpec("w", noop_start())])
    with pytest.raises(ValueError, match="intensity must be an int >= 0"):
        Supervisor(intensity=-1)
    with pytest.raises(ValueError, match="period must be seconds > 0"):
        Supervisor(period=0)
    with pytest.raises(ValueError, match=r"Backoff\.multiplier must be >= 1"):
        Backoff(multiplier=0.5)


async def test_start_child_with_a_duplicate_name_is_rejected() -> None:
    async with Supervisor([ChildSpec("w", noop_start())]) as sup:
        with pytest.raises(ValueError, match="duplicate child name 'w'"):
            await sup.start_child(ChildSpec("w", noop_start()))
        assert len(sup.tree().children) == 1


async def test_start_child_on_a_closed_supervisor_is_rejected() -> None:
    async with Supervisor(name="root") as sup:
        pass
    with pytest.raises(RuntimeError, match="supervisor 'root' is closed; cannot act on child 'w'"):
        await sup.start_child(ChildSpec("w", noop_start()))


async def test_a_start_that_never_calls_started_fails_and_leaves_nothing() -> None:
    probe = Probe()

    async def lazy(*, task_status: trio.TaskStatus[None]) -> None:
        return

    children = [worker(probe, "a"), worker(probe, "b"), ChildSpec("lazy", lazy)]
    with pytest.raises(RuntimeError, match="child 'lazy' returned without calling"):
        async with Supervisor(children):
            pytest.fail("the body must not run")
    assert probe.names("stop") == ["b", "a"]


async def test_a_start_that_raises_names_the_child_and_keeps_nothing() -> None:
    async def broken(*, task_status: trio.TaskStatus[None]) -> None:
        raise OSError("no socket")

    async with Supervisor(name="root") as sup:
        with pytest.raises(RuntimeError, match="child 'broken' failed to start") as caught:
            await sup.start_child(ChildSpec("broken", broken))
        assert isinstance(caught.value.__cause__, OSError)
        assert sup.tree().children == []


async def test_a_child_whose_cleanup_raises_in_a_group_is_an_error_not_a_crash() -> None:
    async def child(*, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        async with trio.open_nursery() as nursery:
            try:
                nursery.start_soon(trio.sleep_forever)
                await trio.sleep_forever()
            finally:
                raise OSError("could not remove the temp dir")

    started = trio.current_time()
    async with Supervisor([ChildSpec("messy", child, shutdown=10)]) as sup:
        pass
    assert trio.current_time() - started < 1  # no grace waited out
    assert sup.exits[-1].outcome == "error"
    assert "could not remove the temp dir" in (sup.exits[-1].exception or "")


# -- children that stop when asked (ChildSpec.stop) ---------------------------------


class Asked:
    """A child that ends on its own once asked: it returns ``linger`` seconds after its
    ``stop()``, unless ``deaf`` (then it never hears the ask). Notes what reached it."""

    def __init__(self, probe: Probe, name: str, *, linger: float = 1.0, deaf: bool = False):
        self.probe, self.name, self.linger, self.deaf = probe, name, linger, deaf
        self.asked = trio.Event()
        self.cancelled_by: list[str | None] = []

    def stop(self) -> None:
        self.probe.note("asked", self.name)
        if not self.deaf:
            self.asked.set()

    async def __call__(self, *, task_status: trio.TaskStatus[str]) -> None:
        self.probe.note("start", self.name)
        task_status.started(self.name)
        try:
            await self.asked.wait()
            await trio.sleep(self.linger)
            self.probe.note("returned", self.name)
        except trio.Cancelled as cancelled:
            self.cancelled_by.append(cancelled.reason)
            self.probe.note("cancelled", self.name)
            raise

    def spec(self, shutdown: float = 5.0) -> ChildSpec:
        return ChildSpec(self.name, self, restart="temporary", shutdown=shutdown, stop=self.stop)


async def test_an_asked_child_is_asked_in_the_shutdown_order_never_cancelled() -> None:
    probe = Probe()
    first, third = Asked(probe, "first"), Asked(probe, "third")
    async with Supervisor([first.spec(), worker(probe, "second", cleanup=1), third.spec()]) as sup:
        records = collect(sup)
    # Last started first, each waited for before the next is stopped, asked or not.
    assert [(t, kind, name) for t, kind, name in probe.events if kind != "start"] == [
        (0, "asked", "third"),
        (1, "returned", "third"),
        (1, "stop", "second"),
        (2, "cleaned", "second"),
        (2, "asked", "first"),
        (3, "returned", "first"),
    ]
    assert first.cancelled_by == third.cancelled_by == []
    assert [(r.child, r.outcome) for r in records] == [
        ("third", "shutdown"),
        ("second", "shutdown"),
        ("first", "shutdown"),
    ]


async def test_an_outer_cancel_does_not_reach_an_asked_child() -> None:
    probe = Probe()
    children = [Asked(probe, name) for name in "abc"]
    with trio.move_on_after(3):
        async with Supervisor([child.spec() for child in children]):
            await trio.sleep_forever()
    assert [(t, name) for t, kind, name in probe.events if kind == "asked"] == [
        (3, "c"),
        (4, "b"),
        (5, "a"),
    ]
    assert probe.names("returned") == ["c", "b", "a"]
    assert all(child.cancelled_by == [] for child in children)


async def test_a_deaf_asked_child_is_killed_after_its_grace_then_cut_at_the_very_end() -> None:
    probe = Probe()
    deaf, heard = Asked(probe, "deaf", deaf=True), Asked(probe, "heard")
    async with Supervisor([heard.spec(), deaf.spec(shutdown=2)], name="root") as sup:
        records = collect(sup)
    # Its grace over, the supervisor moved on; after the last child, it was cancelled.
    assert probe.times("asked", "heard") == [2]
    assert probe.times("cancelled", "deaf") == [3]
    assert deaf.cancelled_by == ["supervisor 'root': shutdown"]
    assert [(r.child, r.outcome, r.time) for r in records] == [
        ("heard", "shutdown", 3),
        ("deaf", "killed", 3),
    ]
    assert trio.current_time() == 3


async def test_stop_child_asks_and_a_raising_stop_is_contained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    probe = Probe()
    polite = Asked(probe, "polite")

    def broken_stop() -> None:
        raise RuntimeError("no stop here")

    async with Supervisor(name="root") as sup:
        records = collect(sup)
        await sup.start_child(polite.spec())
        await sup.start_child(ChildSpec("rude", noop_start(), shutdown=1, stop=broken_stop))
        await sup.stop_child("polite")
        assert probe.times("returned", "polite") == [1]
        assert [c.name for c in sup.tree().children] == ["rude"]
        await sup.stop_child("rude")
        assert trio.current_time() == 2  # its grace, then the supervisor moved on
    assert "stop of child 'rude' raised" in caplog.text
    assert [(r.child, r.outcome) for r in records] == [("polite", "shutdown"), ("rude", "killed")]


async def test_a_cancelled_start_of_an_asked_child_leaves_nothing() -> None:
    gate = trio.Event()

    async def slow(*, task_status: trio.TaskStatus[None]) -> None:
        await gate.wait()
        task_status.started()
        await trio.sleep_forever()

    async with Supervisor(name="root") as sup:
        # The first asked child starts their shared nursery: a cancelled starter of it
        # (a hang if that start were not shielded) sees its cancel and leaves nothing.
        with trio.CancelScope() as cancelled:
            cancelled.cancel()
            await sup.start_child(Asked(Probe(), "early").spec())
        assert cancelled.cancelled_caught
        assert sup.tree().children == []
        with trio.move_on_after(1) as waited:
            await sup.start_child(ChildSpec("slow", slow, stop=gate.set))
        assert waited.cancelled_caught
        assert sup.tree().children == []

        # Its starter cancelled just before it calls started(): Trio leaves it where it
        # is, and it ends at its next checkpoint, leaving no child and no exit behind.
        async def racing(*, task_status: trio.TaskStatus[None]) -> None:
            starter.cancel()
            task_status.started()
            await trio.sleep_forever()

        with trio.CancelScope() as starter:
            await sup.start_child(ChildSpec("racing", racing, stop=gate.set))
        assert starter.cancelled_caught
        assert sup.tree().children == []
        assert list(sup.exits) == []


async def test_a_start_of_an_asked_child_cut_by_the_shutdown_fails_and_leaves_nothing() -> None:
    gate = trio.Event()
    failure: list[BaseException] = []

    async def never_up(*, task_status: trio.TaskStatus[None]) -> None:
        await gate.wait()

    async def start(sup: Supervisor) -> None:
        try:
            await sup.start_child(ChildSpec("never-up", never_up, stop=gate.set))
        except RuntimeError as exc:
            failure.append(exc)

    async with trio.open_nursery() as nursery, Supervisor(name="root") as sup:
        nursery.start_soon(start, sup)
        await trio.testing.wait_all_tasks_blocked()
    assert [str(exc) for exc in failure] == [
        "supervisor 'root': start of child 'never-up' was cancelled"
    ]
    assert sup.tree().children == []


def test_an_asked_child_stop_must_be_callable() -> None:
    with pytest.raises(TypeError, match="child 'w': stop must be a callable or None"):
        ChildSpec("w", noop_start(), stop="now")  # type: ignore[arg-type]
