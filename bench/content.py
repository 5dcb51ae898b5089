"""Images and embedded context: what a prompt's image costs the log and the turn.

* the ``user/message`` line of a prompt with a 1 MiB image (its bytes in a side
  file, the line naming them by SHA-256) against the same line with the image
  inline as base64 (what the log would hold without the side file);
* a turn whose prompt carries a 1 MiB image (hashed, written to the side
  directory, JSONL ``sync="os"``) against the same turn with a text prompt;
* a text turn in a session that holds 20 images from earlier prompts against the
  same turn in a session that holds none: the blobs are held once, a request
  takes them by reference, so the hot path is the text one;
* building one Anthropic request body (and encoding it) whose history holds one
  1 MiB image against the same history without it: each step sends the image
  again, base64, as the API requires.

The model answers at once. Every variant runs in a fresh ``trio.run`` with its
own store; variants alternate inside each repeat.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from base64 import b64encode
from collections.abc import AsyncIterator, Callable, Sequence

import msgspec
import trio

from bench.report import Row, compare
from greenroom.models.anthropic import AnthropicModel
from greenroom.protocol.content import Image, ImageRef, Text, stored
from greenroom.protocol.events import USER, UserMessage
from greenroom.protocol.model import Finish, ModelRequest, StreamChunk, TextDelta, UserTurn
from greenroom.runtime import open_runtime
from greenroom.session.persistence import JsonlPersistence

SCENARIO = "content"
TEXT = "what is in this picture, and what should I change?"
MIB = 1024 * 1024


class _Model:
    """Answers at once."""

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        return self._reply()

    async def _reply(self) -> AsyncIterator[StreamChunk]:
        await trio.lowlevel.checkpoint()
        yield TextDelta("a cat")
        yield Finish("stop")


def _image(size: int, seed: int) -> bytes:
    return seed.to_bytes(4, "big") + os.urandom(size - 4)


def _line_bytes() -> tuple[float, float]:
    """The ``user/message`` line with the image by reference, and inline as base64."""
    data = _image(MIB, 0)
    parts, _ = stored([Text(TEXT), Image(data, "image/png")])
    ref = UserMessage(content=TEXT, source=USER, message_id="m", parts=parts)
    inline = {
        "type": "user/message",
        "content": TEXT,
        "message_id": "m",
        "parts": [{"type": "text", "text": TEXT}, {"type": "image", "data": b64encode(data)}],
    }
    return float(len(msgspec.json.encode(ref))), float(len(msgspec.json.encode(inline)))


async def _turns(m: int, image: bool, held: int) -> float:
    """Median seconds of `m` turns (a 1 MiB image in each prompt when `image`), after
    `held` turns whose prompts each had an image."""
    with tempfile.TemporaryDirectory() as root:
        store = JsonlPersistence(root, sync="os")
        async with open_runtime(model=_Model(), persistence=store) as rt:
            agent = (await rt.agents.create(agent_id="a", session_id="s")).agent
            for seed in range(held):
                await agent.run([Text(TEXT), Image(_image(MIB, seed), "image/png")])
            times: list[float] = []
            for seed in range(m):
                prompt = (
                    [Text(TEXT), Image(_image(MIB, 1_000 + seed), "image/png")] if image else TEXT
                )
                t0 = time.perf_counter()
                await agent.run(prompt)
                times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _build(image: bool, m: int) -> float:
    """Median µs to build and encode one Anthropic body of a 20-message history."""
    data = _image(MIB, 7)
    digest = stored([Image(data, "image/png")])[1]
    first = (
        UserTurn(TEXT, [Text(TEXT), ImageRef("image/png", next(iter(digest)), MIB)])
        if image
        else UserTurn(TEXT)
    )
    messages = [first, *(UserTurn(f"{TEXT} {i}") for i in range(19))]
    request = ModelRequest(messages=messages, system="be brief", blobs=digest if image else {})
    model = AnthropicModel("https://127.0.0.1:1", "sk-bench", "claude-sonnet-4-5")
    times: list[float] = []
    for _ in range(m):
        t0 = time.perf_counter()
        msgspec.json.encode(model.body(request))
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _alternate(variants: Sequence[Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {v.__name__: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:
            gc.collect()
            results[variant.__name__].append(variant())
    return results


def run(repeats: int, quick: bool) -> list[Row]:
    m = 5 if quick else 30
    held = 4 if quick else 20

    def image_turn() -> float:
        return trio.run(_turns, m, True, 0)

    def text_turn() -> float:
        return trio.run(_turns, m, False, 0)

    def text_after_images() -> float:
        return trio.run(_turns, m * 4, False, held)

    def text_alone() -> float:
        return trio.run(_turns, m * 4, False, 0)

    def with_image() -> float:
        return _build(True, m * 4)

    def without_image() -> float:
        return _build(False, m * 4)

    lines = [_line_bytes() for _ in range(repeats)]
    turns = _alternate((image_turn, text_turn), repeats)
    held_turns = _alternate((text_after_images, text_alone), repeats)
    builds = _alternate((with_image, without_image), repeats)
    return [
        compare(
            SCENARIO,
            "user/message line of a prompt with a 1 MiB image",
            "bytes",
            [ref for ref, _ in lines],
            baseline="the same line with the image inline as base64",
            raw=[inline for _, inline in lines],
            max_ratio=0.01,
        ),
        compare(
            SCENARIO,
            "a turn whose prompt has a 1 MiB image (JSONL, sync=os)",
            "us",
            turns["image_turn"],
            baseline="the same turn with a text prompt",
            raw=turns["text_turn"],
            note="SHA-256 of the image and its side file written before the user/message",
        ),
        compare(
            SCENARIO,
            f"a text turn in a session holding {held} images",
            "us",
            held_turns["text_after_images"],
            baseline="the same turn in a session holding none",
            raw=held_turns["text_alone"],
            max_ratio=1.1,
        ),
        compare(
            SCENARIO,
            "Anthropic request body of 20 messages, one with a 1 MiB image",
            "us",
            builds["with_image"],
            baseline="the same body without the image",
            raw=builds["without_image"],
            note="the image goes out base64 on every step, as the API requires",
        ),
    ]
