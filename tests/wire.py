"""Recorded-style model streams: OpenAI chat-completion chunks, Anthropic message events, Responses
events and Gemini chunks, each hand-written after its provider's documentation (named below)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx2

from greenroom.models.http import SseEvent, sse_events
from tests.sse_server import sse


async def events(pieces: Sequence[bytes]) -> AsyncIterator[SseEvent]:
    """The server-sent events of a body made of `pieces`, as an adapter reads them off a
    response (no socket: an adapter's event reader tried alone, in virtual time)."""
    async for event in sse_events(httpx2.Response(200, content=b"".join(pieces))):
        yield event


def oai(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-AbC123",
        "object": "chat.completion.chunk",
        "created": 1733000000,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_0aa8d3e20b",
        "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


def oai_usage(prompt: int, completion: int) -> dict[str, Any]:
    chunk = oai()
    chunk["choices"] = []
    chunk["usage"] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    return chunk


def oai_call(
    index: int, arguments: str, call_id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        fragment.update(id=call_id, type="function")
        fragment["function"]["name"] = name
    return oai({"tool_calls": [fragment]})


def ant_start(input_tokens: int = 25) -> tuple[str, dict[str, Any]]:
    return (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_01XYZ",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1},
            },
        },
    )


def ant_block(index: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return (
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
    )


def ant_delta(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def ant_stop_block(index: int) -> tuple[str, dict[str, Any]]:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


def ant_end(reason: str, output_tokens: int = 15) -> list[tuple[str, dict[str, Any]]]:
    return [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def openai_text(text: str) -> list[bytes]:
    """A whole OpenAI reply of `text`, then stop."""
    return sse(oai({"content": text}), oai(finish="stop"), oai_usage(120, 8), "[DONE]")


def openai_tool(call_id: str, name: str, arguments: str) -> list[bytes]:
    """A whole OpenAI reply that calls tool `name` once."""
    return sse(oai_call(0, arguments, call_id, name), oai(finish="tool_calls"), "[DONE]")


def anthropic_text(text: str) -> list[bytes]:
    """A whole Anthropic reply of `text`, then end_turn."""
    return sse(
        ant_start(),
        ant_block(0, {"type": "text", "text": ""}),
        ant_delta(0, {"type": "text_delta", "text": text}),
        ant_stop_block(0),
        *ant_end("end_turn"),
    )


# -- the Responses API ---------------------------------------------------------------------
#
# Hand-written after the OpenAI API reference's "Streaming events" of the Responses API
# (https://platform.openai.com/docs/api-reference/responses-streaming), its response object's
# ``usage`` and ``incomplete_details``, and the reasoning guide's encrypted reasoning items
# (https://platform.openai.com/docs/guides/reasoning), as documented on 2026-12-04. Every
# event has an ``event:`` line naming its ``type`` and a ``sequence_number`` counted from 0.

RESPONSE = {
    "id": "resp_68af1b2c3d4e5f60",
    "object": "response",
    "created_at": 1764806400,
    "status": "in_progress",
    "model": "gpt-5-2025-08-07",
    "output": [],
    "usage": None,
    "error": None,
    "incomplete_details": None,
}


def rsp(*events: dict[str, Any]) -> list[bytes]:
    """Responses events as SSE pieces, each named by its type and numbered in order."""
    return sse(
        *[(event["type"], {**event, "sequence_number": n}) for n, event in enumerate(events)]
    )


def rsp_created() -> list[dict[str, Any]]:
    return [
        {"type": "response.created", "response": RESPONSE},
        {"type": "response.in_progress", "response": RESPONSE},
    ]


def rsp_message(index: int, deltas: list[str], item_id: str = "msg_68af1b") -> list[dict[str, Any]]:
    """An output message whose text streams as `deltas`."""
    text = "".join(deltas)
    done = {"type": "output_text", "text": text, "annotations": []}
    place = {"item_id": item_id, "output_index": index, "content_index": 0}
    return [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            },
        },
        {
            "type": "response.content_part.added",
            **place,
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
        *[
            {"type": "response.output_text.delta", **place, "delta": delta, "logprobs": []}
            for delta in deltas
        ],
        {"type": "response.output_text.done", **place, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **place, "part": done},
        {
            "type": "response.output_item.done",
            "output_index": index,
            "item": {
                "id": item_id,
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [done],
            },
        },
    ]


def rsp_text_start(index: int, delta: str, item_id: str = "msg_68af1b") -> list[dict[str, Any]]:
    """The start of an output message, up to its first delta."""
    return rsp_message(index, [delta], item_id)[:3]


def rsp_call(
    index: int, call_id: str, name: str, fragments: list[str], item_id: str = "fc_68af1b"
) -> list[dict[str, Any]]:
    """A function call whose arguments stream as `fragments`."""
    arguments = "".join(fragments)
    item = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
    return [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "arguments": "", "status": "in_progress"},
        },
        *[
            {
                "type": "response.function_call_arguments.delta",
                "item_id": item_id,
                "output_index": index,
                "delta": fragment,
            }
            for fragment in fragments
        ],
        {
            "type": "response.function_call_arguments.done",
            "item_id": item_id,
            "output_index": index,
            "arguments": arguments,
        },
        {
            "type": "response.output_item.done",
            "output_index": index,
            "item": {**item, "arguments": arguments, "status": "completed"},
        },
    ]


def rsp_reasoning(
    index: int, summary: list[str], encrypted: str | None, item_id: str = "rs_68af1b"
) -> list[dict[str, Any]]:
    """A reasoning item whose summary parts stream whole, then its encrypted content."""
    events: list[dict[str, Any]] = [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {"id": item_id, "type": "reasoning", "summary": []},
        }
    ]
    for n, text in enumerate(summary):
        place = {"item_id": item_id, "output_index": index, "summary_index": n}
        part = {"type": "summary_text", "text": text}
        events += [
            {
                "type": "response.reasoning_summary_part.added",
                **place,
                "part": {"type": "summary_text", "text": ""},
            },
            {"type": "response.reasoning_summary_text.delta", **place, "delta": text},
            {"type": "response.reasoning_summary_text.done", **place, "text": text},
            {"type": "response.reasoning_summary_part.done", **place, "part": part},
        ]
    item: dict[str, Any] = {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text} for text in summary],
    }
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events


def rsp_usage(
    input_tokens: int, output_tokens: int, cached: int = 0, reasoning: int = 0
) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


def rsp_end(usage: dict[str, Any] | None = None, incomplete: str | None = None) -> dict[str, Any]:
    """The final event: ``response.completed``, or ``response.incomplete`` for `incomplete`."""
    response = {
        **RESPONSE,
        "status": "incomplete" if incomplete else "completed",
        "usage": usage or rsp_usage(25, 9),
    }
    if incomplete:
        response["incomplete_details"] = {"reason": incomplete}
        return {"type": "response.incomplete", "response": response}
    return {"type": "response.completed", "response": response}


def rsp_failed(code: str, message: str) -> dict[str, Any]:
    response = {**RESPONSE, "status": "failed", "error": {"code": code, "message": message}}
    return {"type": "response.failed", "response": response}


def responses_text(text: str) -> list[bytes]:
    """A whole Responses reply of `text`, then completed."""
    return rsp(*rsp_created(), *rsp_message(0, [text]), rsp_end())


# -- the Gemini API ----------------------------------------------------------------------------
#
# Hand-written after the Gemini API reference, "Generating content"
# (https://ai.google.dev/api/generate-content: streamGenerateContent with ``alt=sse``,
# GenerateContentResponse, Candidate, FinishReason, UsageMetadata), the thinking guide
# (https://ai.google.dev/gemini-api/docs/thinking: ``thought`` parts, ``thoughtsTokenCount``)
# and the thought signatures guide (https://ai.google.dev/gemini-api/docs/thought-signatures:
# a call's signature on its ``functionCall`` part, a text reply's on its last part, possibly
# an empty one), as documented on 2026-12-04. Each chunk repeats the usage so far; lines end
# with CRLF, as the service sends them.


def gem_usage(prompt: int, candidates: int, cached: int = 0, thoughts: int = 0) -> dict[str, Any]:
    usage = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    if cached:
        usage["cachedContentTokenCount"] = cached
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return usage


def gem(
    parts: list[dict[str, Any]], finish: str | None = None, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One chunk of a streamed reply: a candidate with `parts`, its finish reason if any."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return {
        "candidates": [candidate],
        "usageMetadata": usage or gem_usage(25, 9),
        "modelVersion": "gemini-2.5-flash",
        "responseId": "mFg7aKqDJq2zz7IP2s3nqQ0",
    }


def gem_sse(*chunks: dict[str, Any]) -> list[bytes]:
    """Gemini chunks as SSE pieces (``data:`` lines only, CRLF line ends)."""
    return [f"data: {json.dumps(chunk)}\r\n\r\n".encode() for chunk in chunks]


def gemini_text(text: str) -> list[bytes]:
    """A whole Gemini reply of `text`, then STOP."""
    return gem_sse(gem([{"text": text}], "STOP"))
