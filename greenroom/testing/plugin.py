"""greenroom's pytest plugin: a runtime in virtual time, per test.

Opt-in, never loaded by itself: ``pytest_plugins = ["greenroom.testing.plugin"]`` in the
top ``conftest.py``. It needs pytest-trio (``pip install 'greenroom[testing]'``). Its
fixtures, each a test's own:

* ``greenroom_model``: the runtime's model, a `TestModel()`; override the fixture (in a
  conftest or a module) to give another;
* ``greenroom_store``: a `JsonlPersistence` in the test's ``tmp_path``;
* ``greenroom_requests``: every `ModelRequest` the runtime's agents build, in order (as the
  ``agent/request`` waterfall passes it on to the model);
* ``greenroom_runtime``: an open runtime of them (its ``workdir`` the test's ``tmp_path``),
  closed after the test: every agent disposed.

An async test that asks for any ``greenroom_`` fixture runs under Trio in virtual time
(`greenroom.testing.clock.virtual_run`: the autojump clock, held still while threads work;
past an hour of virtual time the test fails as a deadlock), unless it asks for a clock
fixture of its own.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from greenroom.actors.events import AGENT_REQUEST
from greenroom.actors.types import Agent
from greenroom.models.base import ModelAdapter
from greenroom.protocol.model import ModelRequest
from greenroom.runtime import Runtime, open_runtime
from greenroom.session.persistence import JsonlPersistence
from greenroom.testing.clock import virtual_run
from greenroom.testing.models import TestModel


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        function = getattr(item, "obj", None)
        if any(name.startswith("greenroom_") for name in names) and (
            inspect.iscoroutinefunction(function)
        ):
            item.add_marker(pytest.mark.trio(run=virtual_run), append=False)


@pytest.fixture
def greenroom_model() -> ModelAdapter:
    """The runtime's model: a `TestModel()` (override this fixture to give another)."""
    return TestModel()


@pytest.fixture
def greenroom_store(tmp_path: Path) -> JsonlPersistence:
    """Where the runtime stores its sessions: JSONL files in the test's ``tmp_path``."""
    return JsonlPersistence(tmp_path / "sessions")


@pytest.fixture
def greenroom_requests() -> list[ModelRequest]:
    """Every model request the runtime's agents build, in order."""
    return []


@pytest.fixture
async def greenroom_runtime(
    greenroom_model: ModelAdapter,
    greenroom_store: JsonlPersistence,
    greenroom_requests: list[ModelRequest],
    tmp_path: Path,
) -> AsyncIterator[Runtime]:
    """An open runtime of `greenroom_model` and `greenroom_store`, in virtual time."""
    async with open_runtime(
        model=greenroom_model, persistence=greenroom_store, workdir=str(tmp_path)
    ) as runtime:
        runtime.hooks.intercept(AGENT_REQUEST, _recorder(greenroom_requests))
        yield runtime


def _recorder(
    requests: list[ModelRequest],
) -> Callable[[ModelRequest, Agent, int, int], Coroutine[Any, Any, ModelRequest]]:
    async def record(request: ModelRequest, agent: Agent, turn: int, step: int) -> ModelRequest:
        requests.append(request)
        return request

    return record
