"""Scope: LIFO disposers, contained errors, memoised close."""

from __future__ import annotations

import pytest
import trio

from greenroom.supervisor import Scope


async def test_disposers_run_last_added_first_sync_and_async() -> None:
    order: list[str] = []

    async def async_one() -> None:
        await trio.sleep(1)
        order.append("async")

    async with Scope() as scope:
        scope.add(lambda: order.append("first"))
        scope.add(async_one)
        scope.add(lambda: order.append("last"))
    assert order == ["last", "async", "first"]
    assert trio.current_time() == 1


async def test_a_raising_disposer_does_not_skip_later_ones() -> None:
    order: list[str] = []

    def boom(label: str) -> None:
        order.append(label)
        raise ValueError(label)

    scope = Scope("teardown")
    scope.add(lambda: order.append("a"))
    scope.add(lambda: boom("b"))
    scope.add(lambda: order.append("c"))
    scope.add(lambda: boom("d"))
    with pytest.raises(ExceptionGroup) as caught:
        await scope.close()
    assert order == ["d", "c", "b", "a"]
    assert [str(e) for e in caught.value.exceptions] == ["d", "b"]
    assert "closing teardown" in str(caught.value)


async def test_concurrent_close_callers_share_one_teardown() -> None:
    runs: list[float] = []
    gate = trio.Event()

    async def slow() -> None:
        runs.append(trio.current_time())
        await gate.wait()
        raise KeyError("slow failed")

    scope = Scope()
    scope.add(slow)
    finished: list[tuple[float, str]] = []

    async def closer(label: str) -> None:
        with pytest.raises(ExceptionGroup) as caught:
            await scope.close()
        assert [type(e) for e in caught.value.exceptions] == [KeyError]
        finished.append((trio.current_time(), label))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(closer, "one")
        nursery.start_soon(closer, "two")
        await trio.sleep(5)
        assert finished == []  # both are waiting on the same teardown
        gate.set()
    assert runs == [0]
    assert sorted(finished) == [(5, "one"), (5, "two")]
    # A later caller also sees the outcome without running anything again.
    with pytest.raises(ExceptionGroup):
        await scope.close()
    assert runs == [0]


async def test_a_cancelled_caller_cannot_cut_the_chain_short() -> None:
    order: list[str] = []

    async def slow() -> None:
        await trio.sleep(10)
        order.append("slow")

    scope = Scope()
    scope.add(lambda: order.append("first"))
    scope.add(slow)
    with trio.move_on_after(1):
        await scope.close()
    assert order == ["slow", "first"]
    assert trio.current_time() == 10


async def test_add_after_close_is_rejected() -> None:
    scope = Scope("agent scope")
    await scope.close()
    with pytest.raises(RuntimeError, match="agent scope is closed"):
        scope.add(lambda: None)
