"""``python -m bench._acp_sdk_agent``: the baseline ACP agent of ``bench.acp``, on the official SDK.

The least an agent can do over ACP with the official Python SDK (asyncio):
``initialize`` answers protocol version 1, ``session/new`` a fresh session id,
and ``session/prompt`` sends exactly one ``agent_message_chunk`` (the prompt's
text) through the client connection, then answers ``end_turn``. No model, no
log, no persistence: the SDK's own per-message cost, nothing else. A prompt
``ask`` first asks the client's permission for a ``bash`` call (the question
greenroom asks, four options), then answers as any other: what asking costs
through the same client, with nothing around it.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

import acp
from acp import schema

#: The prompt that asks permission first.
ASK = "ask"
_OPTIONS = [
    schema.PermissionOption(option_id=kind, name=kind.replace("_", " "), kind=kind)
    for kind in ("allow_once", "allow_always", "reject_once", "reject_always")
]


class EchoAgent:
    """One chunk back per prompt, then ``end_turn``."""

    def __init__(self) -> None:
        self._client: acp.Client | None = None
        self._sessions: set[str] = set()
        self._asked = 0

    def on_connect(self, conn: acp.Client) -> None:
        self._client = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> acp.InitializeResponse:
        return acp.InitializeResponse(protocol_version=1)

    async def new_session(self, cwd: str, **kwargs: Any) -> acp.NewSessionResponse:
        session_id = str(uuid.uuid4())
        self._sessions.add(session_id)
        return acp.NewSessionResponse(session_id=session_id)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> acp.PromptResponse:
        if session_id not in self._sessions:
            raise acp.RequestError.invalid_params({"sessionId": session_id})
        assert self._client is not None
        text = "\n".join(b.text for b in prompt if isinstance(b, schema.TextContentBlock))
        if text == ASK:
            self._asked += 1
            call = schema.ToolCallUpdate(
                tool_call_id=f"call-{self._asked}",
                title="true",
                kind="execute",
                status="pending",
                raw_input={"command": "true"},
            )
            await self._client.request_permission(
                session_id=session_id, tool_call=call, options=_OPTIONS
            )
        await self._client.session_update(
            session_id=session_id, update=acp.update_agent_message_text(text)
        )
        return acp.PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        return None


def main() -> None:
    # EchoAgent implements only what this bench calls of the `acp.Agent` protocol.
    asyncio.run(acp.run_agent(cast(acp.Agent, EchoAgent())))


if __name__ == "__main__":
    main()
