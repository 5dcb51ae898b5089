"""``python -m bench._acp_null_agent``: the least work an ACP agent's process can do for
``bench.acp``'s prompts, so that what the client itself costs is measured.

No SDK and no event loop: blocking reads of stdin, each line decoded with the
standard library's ``json``, and for everything one read brought, one write of
the answers: ``initialize`` protocol version 1, ``session/new`` a fresh id, and
``session/prompt`` its one ``agent_message_chunk`` (the prompt's text), then
``end_turn``. Its throughput, through the same client as the others, is the most
any agent can reach through that client on this machine: the ceiling of the
throughput ratios of ``bench.acp``.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any


def _answers(line: bytes) -> list[bytes]:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    out: list[str] = []
    result: dict[str, Any] = {}
    if method == "initialize":
        result = {"protocolVersion": 1}
    elif method == "session/new":
        result = {"sessionId": str(uuid.uuid4())}
    elif method == "session/prompt":
        params = message["params"]
        text = "\n".join(b["text"] for b in params["prompt"] if b.get("type") == "text")
        update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
        chunk = {"sessionId": params["sessionId"], "update": update}
        out.append(json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": chunk}))
        result = {"stopReason": "end_turn"}
    if request_id is not None:
        out.append(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}))
    return [frame.encode() + b"\n" for frame in out]


def main() -> None:
    rest = b""
    while data := os.read(0, 65536):
        *lines, rest = (rest + data).split(b"\n")
        out = b"".join(frame for line in lines if line.strip() for frame in _answers(line))
        view = memoryview(out)
        while view:
            view = view[os.write(1, view) :]


if __name__ == "__main__":
    main()
