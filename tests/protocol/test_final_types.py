"""The log's events, stream chunks, messages and parts are final: the turn driver, the
session and the presenter tell them apart by exact type, so a subclass would fall silently
into every ``else:``."""

from __future__ import annotations

import importlib
import pkgutil
import typing

import msgspec
import pytest

import greenroom
from greenroom.actors.prompt import PromptEvent
from greenroom.protocol.content import ContentBlock, Part
from greenroom.protocol.events import (
    MessageSource,
    SessionEvent,
    ToolResult,
    TurnEndReason,
    TurnTrigger,
)
from greenroom.protocol.model import Message, StreamChunk

UNIONS = {
    "SessionEvent": SessionEvent,
    "PromptEvent": PromptEvent,
    "StreamChunk": StreamChunk,
    "Message": Message,
    "TurnEndReason": TurnEndReason,
    "TurnTrigger": TurnTrigger,
    "MessageSource": MessageSource,
    "Part": Part,
    "ContentBlock": ContentBlock,
}


def _members(union: object) -> list[type]:
    return [member for member in typing.get_args(union) if isinstance(member, type)]


def _every_subclass(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_every_subclass(sub)]
    return found


@pytest.mark.parametrize("name", sorted(UNIONS))
def test_every_member_of_the_dispatched_unions_is_final_and_has_no_subclass(name: str) -> None:
    for module in pkgutil.walk_packages(greenroom.__path__, "greenroom."):
        if not module.name.endswith("__main__"):  # every class greenroom defines exists now
            importlib.import_module(module.name)
    members = _members(UNIONS[name])
    assert members, name
    for member in members:
        assert getattr(member, "__final__", False), f"{name}: {member.__name__} is not @final"
        assert _every_subclass(member) == [], f"{name}: {member.__name__} is subclassed"


def test_subclassing_an_event_is_refused_naming_it() -> None:
    with pytest.raises(TypeError, match="the event ToolResult is final"):

        class Mine(ToolResult, frozen=True, tag="tool/mine"):  # type: ignore[misc]
            pass


def test_a_new_event_on_the_base_is_still_allowed() -> None:
    from greenroom.protocol.events import Event

    class Fresh(Event, frozen=True, tag="fresh/one"):
        value: int = 0

    assert msgspec.json.decode(msgspec.json.encode(Fresh(value=3)), type=Fresh).value == 3
