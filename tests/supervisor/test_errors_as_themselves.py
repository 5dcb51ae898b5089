"""An exception raised in the body of `open_runtime` or `Supervisor` comes out as itself:
Trio's nurseries wrap what crosses them in groups, and a group of one is unwrapped; a group
comes out only where two things failed at once."""

from __future__ import annotations

import pytest
import trio

from greenroom import open_runtime
from greenroom.errors import alone
from greenroom.supervisor import Supervisor


class Mine(Exception):
    pass


async def test_the_bodys_error_comes_out_of_open_runtime_as_itself() -> None:
    with pytest.raises(Mine, match="mine"):
        async with open_runtime():
            raise Mine("mine")


async def test_a_bad_argument_inside_open_runtime_is_its_value_error() -> None:
    with pytest.raises(ValueError, match=r"cwd must be an absolute path, got '\.'"):
        async with open_runtime() as rt:
            await rt.agents.create(agent_id="a", session_id="s", cwd=".")


async def test_a_supervisor_inside_open_runtime_lets_the_error_out_as_itself() -> None:
    with pytest.raises(Mine):
        async with open_runtime(), Supervisor(name="team"):
            raise Mine("from the team's body")


async def test_except_star_still_catches_the_single_error() -> None:
    async def body() -> None:
        async with open_runtime():
            raise Mine("once")

    caught: list[BaseException] = []
    try:
        await body()
    except* Mine as group:
        caught.extend(group.exceptions)
    assert [str(error) for error in caught] == ["once"]


async def test_two_errors_at_once_stay_a_group() -> None:
    async def fail(message: str) -> None:
        raise Mine(message)

    async def body() -> None:
        async with open_runtime(), trio.open_nursery() as nursery:
            nursery.start_soon(fail, "one")
            nursery.start_soon(fail, "two")

    with pytest.raises(ExceptionGroup) as raised:
        await body()
    leaves = []
    stack: list[BaseException] = [raised.value]
    while stack:
        error = stack.pop()
        if isinstance(error, BaseExceptionGroup):
            stack.extend(error.exceptions)
        else:
            leaves.append(str(error))
    assert sorted(leaves) == ["one", "two"]


def test_alone_reaches_through_groups_of_one_and_refuses_two() -> None:
    one = Mine("x")
    assert alone(ExceptionGroup("a", [ExceptionGroup("b", [one])])) is one
    assert alone(ExceptionGroup("a", [Mine("x"), Mine("y")])) is None
    assert alone(ExceptionGroup("a", [ExceptionGroup("b", [Mine("x"), Mine("y")])])) is None
