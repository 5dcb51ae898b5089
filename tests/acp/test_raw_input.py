"""A tool call's ``rawInput``: the model's JSON text passed into the frame as written."""

from __future__ import annotations

import json

import msgspec
from acp import schema

from greenroom.acp.client import OPTIONS
from greenroom.acp.presenter import shown_call
from greenroom.protocol.acp import PermissionToolCall, RequestPermissionParams


def asked(arguments: str) -> bytes:
    """The ``session/request_permission`` params greenroom sends for a bash call."""
    title, raw_input = shown_call("bash", arguments)
    call = PermissionToolCall("call-1", title, "execute", "pending", raw_input)
    return msgspec.json.encode(RequestPermissionParams("s-1", call, OPTIONS))


def test_json_arguments_reach_the_client_as_the_model_wrote_them() -> None:
    written = '{"command":  "true",\n "timeout": 1e2, "note": "caf\\u00e9"}'
    frame = asked(f"  {written} ")
    assert written.encode() in frame  # not decoded and encoded again: spacing, escapes kept
    checked = schema.RequestPermissionRequest.model_validate_json(frame)
    assert checked.tool_call.raw_input == {"command": "true", "timeout": 100.0, "note": "café"}


def test_blank_arguments_are_an_empty_object() -> None:
    assert json.loads(asked(" \n"))["toolCall"]["rawInput"] == {}


def test_arguments_that_are_not_one_json_value_are_shown_as_text() -> None:
    for text in ['{"a": 1} {"b": 2}', '{"a": ', "not json", '{"a": "\\q"}', "[" * 5000]:
        frame = asked(text)
        schema.RequestPermissionRequest.model_validate_json(frame)
        assert json.loads(frame)["toolCall"]["rawInput"] == text
