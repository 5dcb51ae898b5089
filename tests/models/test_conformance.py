"""The adapter conformance suite (`greenroom.models.conformance`) over every adapter greenroom
ships, each bound to a loopback server speaking its wire format (`tests.bindings`).

Real sockets, so the real clock: every scenario bounds itself (`conformance.LIMIT`).
"""

from __future__ import annotations

import pytest

from greenroom.models.conformance import SCENARIOS
from tests.bindings import BINDINGS

pytestmark = pytest.mark.real_clock


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("wire", BINDINGS)
async def test_the_adapter_keeps_the_contract(wire: str, scenario: str) -> None:
    await SCENARIOS[scenario](BINDINGS[wire])
