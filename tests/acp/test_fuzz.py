"""A property-based fuzz of the ACP reader: no frame, of any shape or size, ends the connection.

Each example feeds a few hostile frames (arbitrary bytes, arbitrary JSON,
nesting up to 100,000 levels, frames over the size limit, valid frames with
mutated params and ids) to a live connection, then asks it for a real prompt.
Every frame with a usable id is answered exactly once; the prompt after them
ends its turn. The suite runs `EXAMPLES` examples, in `SHARDS` tests of an equal share
each (so parallel workers share the fuzz); ``pytest -m slow`` runs `SLOW_EXAMPLES` more.
"""

from __future__ import annotations

import json
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest
import trio
import trio.testing

from greenroom.acp.frames import MAX_FRAME
from greenroom.models import ScriptedModel
from tests.acp_peer import bridge

EXAMPLES = 240
SHARDS = 4
STILL_HERE = [{"type": "text", "text": "still here"}]
SLOW_EXAMPLES = 20_000

METHODS = [
    "initialize",
    "authenticate",
    "logout",
    "session/new",
    "session/load",
    "session/resume",
    "session/list",
    "session/close",
    "session/prompt",
    "session/set_config_option",
    "session/cancel",
    "$/cancel_request",
    "_session/steering",
    "nope/nothing",
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=16,
)


def _valid_params(method: str, session: str) -> dict[str, Any]:
    return {
        "initialize": {"protocolVersion": 1, "clientCapabilities": {}},
        "session/new": {"cwd": "/tmp", "mcpServers": []},
        "session/load": {"sessionId": session, "cwd": "/tmp", "mcpServers": []},
        "session/resume": {"sessionId": session, "cwd": "/tmp", "mcpServers": []},
        "session/prompt": {"sessionId": session, "prompt": [{"type": "text", "text": "hi"}]},
        "_session/steering": {"sessionId": session, "prompt": [{"type": "text", "text": "hi"}]},
        "session/set_config_option": {"sessionId": session, "configId": "mode", "value": "default"},
        "session/cancel": {"sessionId": session},
        "session/close": {"sessionId": "not-this-one"},
        "$/cancel_request": {"requestId": "fz-0"},
    }.get(method, {})


@st.composite
def mutated_frames(draw: st.DrawFn) -> tuple[bytes, str | int | None]:
    """A frame shaped like a real one, with some part replaced; and its id if it is usable."""
    method = draw(st.sampled_from(METHODS) | st.text(max_size=12))
    frame: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    params: Any = _valid_params(method, "SESSION")
    mutation = draw(st.sampled_from(["none", "params", "member", "drop", "id"]))
    if mutation == "params":
        params = draw(json_values)
    elif mutation == "member" and isinstance(params, dict) and params:
        params[draw(st.sampled_from(sorted(params)))] = draw(json_values)
    elif mutation == "drop" and isinstance(params, dict) and params:
        del params[draw(st.sampled_from(sorted(params)))]
    frame["params"] = params
    usable_id: str | int | None = None
    if mutation == "id":
        frame["id"] = draw(json_values)
        if isinstance(frame["id"], str):
            usable_id = frame["id"] = "fz-" + frame["id"]
        elif isinstance(frame["id"], int) and not isinstance(frame["id"], bool):
            usable_id = frame["id"] = 10**12 + abs(frame["id"])  # clear of the peer's own ids
    elif draw(st.booleans()):
        usable_id = frame["id"] = f"fz-{draw(st.integers(0, 10**6))}"
    return json.dumps(frame).encode(), usable_id


def _nested(depth: int, member: str) -> bytes:
    deep = "[" * depth + "]" * depth
    return f'{{"jsonrpc":"2.0","id":"fz-deep","method":"session/new","{member}":{deep}}}'.encode()


hostile = st.one_of(
    st.binary(max_size=300).map(lambda b: (b.replace(b"\n", b" "), None)),
    json_values.map(lambda v: (json.dumps(v).encode(), None)),
    st.tuples(st.integers(1, 100_000), st.sampled_from(["params", "extra"])).map(
        lambda t: (_nested(*t), "fz-deep")
    ),
    st.integers(1, 3).map(lambda k: (b"x" * (MAX_FRAME + k), None)),
    mutated_frames(),
)


async def _survives(frames: list[tuple[bytes, str | int | None]]) -> None:
    async with bridge(None, ScriptedModel(delay=0)) as b:
        session = await b.peer.new_session()
        ids: list[str | int] = []
        for raw, usable_id in frames:
            await b.peer.send_raw(raw.replace(b"SESSION", session.encode()) + b"\n")
            if usable_id is not None:
                ids.append(usable_id)
        prompt = await b.peer.call(
            "session/prompt",
            {"sessionId": session, "prompt": [{"type": "text", "text": "still here"}]},
        )
        assert prompt["result"] == {"stopReason": "end_turn"}, prompt
        await trio.testing.wait_all_tasks_blocked()  # requests that run in tasks have answered
        for usable_id in set(ids):
            answers = [f for f in b.peer.frames if f.get("id") == usable_id and "method" not in f]
            assert len(answers) == ids.count(usable_id), (usable_id, answers)
        for frame in b.peer.frames:
            assert frame["jsonrpc"] == "2.0"
            assert "method" in frame or (("result" in frame) != ("error" in frame))


@pytest.mark.parametrize("shard", range(SHARDS))
@hypothesis.settings(max_examples=EXAMPLES // SHARDS, deadline=None)
@hypothesis.given(frames=st.lists(hostile, min_size=1, max_size=4))
async def test_no_frame_ends_the_connection(
    shard: int, frames: list[tuple[bytes, str | int | None]]
) -> None:
    await _survives(frames)


@pytest.mark.slow
@hypothesis.settings(max_examples=SLOW_EXAMPLES, deadline=None)
@hypothesis.given(frames=st.lists(hostile, min_size=1, max_size=8))
async def test_no_frame_ends_the_connection_long_run(
    frames: list[tuple[bytes, str | int | None]],
) -> None:
    await _survives(frames)
