"""The editor of the tests that drive ``greenroom acp`` with the official ACP SDK's client
side (asyncio, ``acp.spawn_agent_process``, whose schema models parse every frame): it
records every update and grants every permission once; a test reads what it was shown.

Editors that answer otherwise (elicitations, files, chosen permissions) stay in the tests
that need them; the in-process peer of the bridge tests is `tests.acp_peer`. Frames read
raw are checked by `checked_updates` (the SDK's schema; a ``notice`` by `NOTICE_SCHEMA`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import jsonschema
from acp import schema


class Editor:
    def __init__(self) -> None:
        self.updates: list[Any] = []

    def on_connect(self, conn: Any) -> None:
        pass

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    async def request_permission(self, *args: Any, **kwargs: Any) -> Any:
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(outcome="selected", option_id="allow_once")
        )

    def said(self, *, notices: bool = True) -> str:
        """What the agent said; with ``notices=False``, less the notices of its MCP servers
        (a loaded machine may take a server past the session's 2 s: a notice says so)."""
        return "".join(
            u.content.text
            for u in self.updates
            if isinstance(u, schema.AgentMessageChunk)
            and (notices or not u.content.text.startswith("MCP server "))
        )

    async def told(self, words: str) -> None:
        """Until the agent said `words`."""
        while words not in self.said():
            await asyncio.sleep(0.05)

    def tool_calls(self) -> list[Any]:
        """The updates of tool calls: their starts and their progress."""
        return [
            u for u in self.updates if isinstance(u, schema.ToolCallStart | schema.ToolCallProgress)
        ]

    def plans(self) -> list[list[tuple[str, str, str]]]:
        """Each plan shown, as (content, priority, status) per entry."""
        return [
            [(e.content, e.priority, e.status) for e in u.entries]
            for u in self.updates
            if isinstance(u, schema.AgentPlanUpdate)
        ]

    def command_sets(self) -> list[dict[str, str | None]]:
        """Each set of slash commands offered: each command's name, with its input hint."""
        return [
            {c.name: (c.input.root.hint if c.input else None) for c in u.available_commands}
            for u in self.updates
            if isinstance(u, schema.AvailableCommandsUpdate)
        ]

    async def offers(self, name: str) -> None:
        """Until the latest command set has `name` (a server may still be starting: the
        session answers without waiting more than 2 s for it)."""
        for _ in range(400):
            sets = self.command_sets()
            if sets and name in sets[-1]:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{name!r} never offered: {self.command_sets()}")


#: ACP's unstable ``notice`` update (schema/v1/schema.unstable.json of agentclientprotocol/
#: agent-client-protocol: ``NoticeUpdate`` within ``SessionUpdate``), no member it does not name.
NOTICE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sessionUpdate": {"const": "notice"},
        "severity": {"type": "string"},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": ["string", "null"]},
        "_meta": {"type": ["object", "null"]},
    },
    "required": ["sessionUpdate", "severity", "title"],
    "additionalProperties": False,
}


def checked_updates(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ``session/update`` of `frames`, each read by the SDK's schema (a notice by the
    spec's): the updates."""
    updates = []
    for frame in frames:
        if frame.get("method") != "session/update":
            continue
        update = frame["params"]["update"]
        if update["sessionUpdate"] == "notice":
            jsonschema.validate(update, NOTICE_SCHEMA)
        else:
            schema.SessionNotification.model_validate(frame["params"])
        updates.append(update)
    return updates
