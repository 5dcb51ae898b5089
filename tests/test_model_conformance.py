"""The adapter conformance suite (`greenroom.models.conformance`) over every adapter greenroom
ships, each bound to a loopback server speaking its wire format (`tests.bindings`).

Real sockets, so the real clock: every scenario bounds itself (`conformance.LIMIT`).
"""

from __future__ import annotations

import pytest

from greenroom.models.conformance import SCENARIOS
from tests.bindings import BINDINGS

pytestmark = pytest.mark.real_clock

#: The adapters that honour `ModelRequest.max_output_tokens` in the compaction issue's work
#: (35), not yet merged: strict, so the mark goes once they do.
NOT_YET = {("chat-completions", "max_output_tokens"), ("deepseek", "max_output_tokens")}
NOT_YET.add(("anthropic", "max_output_tokens"))


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("wire", BINDINGS)
async def test_the_adapter_keeps_the_contract(
    wire: str, scenario: str, request: pytest.FixtureRequest
) -> None:
    if (wire, scenario) in NOT_YET:
        request.applymarker(pytest.mark.xfail(strict=True, reason="issue 35's adapters"))
    await SCENARIOS[scenario](BINDINGS[wire])
