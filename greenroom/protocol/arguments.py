"""A tool call's arguments: the JSON text a model wrote, read one way everywhere.

Blank text is ``{}`` (a model calling a tool without parameters may write
nothing); anything else must be JSON. The registry reads it into the tool's
Struct, the presenter and the Anthropic adapter into a plain value.

`decode_arguments` reads the text with a decoder of the caller's (a tool's Struct), and
`arguments_value` as a plain value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

import msgspec

T = TypeVar("T")

_any: Final = msgspec.json.Decoder()


def decode_arguments(arguments: str, decode: Callable[[str], T]) -> T:
    """`arguments` as `decode` reads them (blank as ``{}``). Raises what `decode` raises for
    the wrong shape (`msgspec.ValidationError`), and `msgspec.DecodeError` for text that is
    not JSON or nests too deep to decode."""
    try:
        return decode(arguments.strip() or "{}")
    except RecursionError:
        raise msgspec.DecodeError("the arguments nest too deep to decode") from None


def arguments_value(arguments: str) -> object:
    """`arguments` as a plain JSON value; `msgspec.DecodeError` if they are not JSON."""
    return decode_arguments(arguments, _any.decode)
