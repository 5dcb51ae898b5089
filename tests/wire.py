"""Recorded-style model streams: OpenAI chat-completion chunks and Anthropic message events."""

from __future__ import annotations

from typing import Any

from tests.sse_server import sse


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
