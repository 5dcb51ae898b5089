"""A tool call's arguments, read one way (`greenroom.protocol.arguments`)."""

from __future__ import annotations

import msgspec
import pytest

from greenroom.protocol.arguments import arguments_value, decode_arguments


class Args(msgspec.Struct):
    path: str


def test_blank_arguments_are_an_empty_object() -> None:
    assert arguments_value("") == {}
    assert arguments_value("  \n") == {}
    assert arguments_value('{"a": [1, 2]}') == {"a": [1, 2]}


@pytest.mark.parametrize("text", ["{", "not json", '{"a": 1} trailing', "[" * 100_000])
def test_text_that_is_not_json_or_nests_too_deep_is_a_decode_error(text: str) -> None:
    with pytest.raises(msgspec.DecodeError):
        arguments_value(text)


def test_a_typed_read_names_the_field_of_the_wrong_shape() -> None:
    decoder = msgspec.json.Decoder(Args)
    assert decode_arguments('{"path": "a"}', decoder.decode) == Args("a")
    with pytest.raises(msgspec.ValidationError, match=r"\$\.path"):
        decode_arguments('{"path": 1}', decoder.decode)
    with pytest.raises(msgspec.ValidationError, match="missing required field"):
        decode_arguments("", decoder.decode)
