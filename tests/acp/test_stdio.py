"""`greenroom.acp.stdio`'s pipes: `FramesOut` writes at once, all of it, or fails; `FramesIn`
reads at once, waits only on an empty pipe, and yields once a read whatever comes."""

from __future__ import annotations

import os
import threading
import time

import pytest
import trio
import trio.testing

from greenroom.acp.stdio import FramesIn, FramesOut


def _drain(fd: int, into: bytearray, pause: float) -> None:
    """Read `fd` to its end, slowly (so a writer finds the pipe full)."""
    while chunk := os.read(fd, 4096):
        into += chunk
        time.sleep(pause)


async def test_a_frame_with_room_is_written_before_the_writer_yields() -> None:
    read_end, write_end = os.pipe()
    out = FramesOut(write_end)
    try:
        with trio.testing.assert_no_checkpoints():
            await out.send_all(b'{"jsonrpc":"2.0","id":1,"result":{}}\n')
        assert os.read(read_end, 100) == b'{"jsonrpc":"2.0","id":1,"result":{}}\n'
    finally:
        await out.aclose()
        os.close(read_end)


@pytest.mark.real_clock
async def test_a_frame_larger_than_the_pipe_is_written_whole_while_it_drains() -> None:
    read_end, write_end = os.pipe()
    frame = bytes(range(256)) * 4096 + b"\n"  # 1 MiB: sixteen times a pipe's 64 KiB
    got = bytearray()
    drain = threading.Thread(target=_drain, args=(read_end, got, 0.0005))
    drain.start()
    out = FramesOut(write_end)
    try:
        with trio.fail_after(60):
            await out.send_all(frame)
            await out.send_all(b"next\n")
    finally:
        await out.aclose()
        drain.join(60)
        os.close(read_end)
    assert bytes(got) == frame + b"next\n"


async def test_a_pipe_whose_reader_is_gone_is_broken() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    out = FramesOut(write_end)
    try:
        with pytest.raises(trio.BrokenResourceError):
            await out.send_all(b"lost\n")
    finally:
        await out.aclose()


async def test_a_closed_pipe_is_closed() -> None:
    read_end, write_end = os.pipe()
    out = FramesOut(write_end)
    await out.aclose()
    await out.aclose()  # idempotent
    try:
        with pytest.raises(trio.ClosedResourceError):
            await out.send_all(b"late\n")
    finally:
        os.close(read_end)


async def test_input_waiting_is_read_with_a_yield_that_no_cancel_takes_it_from() -> None:
    read_end, write_end = os.pipe()
    frames_in = FramesIn(read_end)
    runs = 0

    async def other() -> None:
        nonlocal runs
        while True:
            runs += 1
            await trio.lowlevel.checkpoint()

    try:
        os.write(write_end, b"x" * 1000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            for _ in range(1000):  # input there at every read, as in a flood
                assert await frames_in.receive_some(1) == b"x"
            nursery.cancel_scope.cancel()
        assert runs > 100  # each read yielded: a flood cannot starve the agents
        os.write(write_end, b"two\n")
        with trio.CancelScope() as scope:
            scope.cancel()
            assert await frames_in.receive_some() == b"two\n"  # read, so returned
        assert not scope.cancelled_caught
        with trio.CancelScope() as scope:
            scope.cancel()
            await frames_in.receive_some()  # nothing waiting: the wait takes the cancel
        assert scope.cancelled_caught
    finally:
        await frames_in.aclose()
        os.close(write_end)


async def test_a_read_of_an_empty_pipe_waits_for_input_then_its_end() -> None:
    read_end, write_end = os.pipe()
    frames_in = FramesIn(read_end)
    got: list[bytes] = []

    async def read_all() -> None:
        while data := await frames_in.receive_some():
            got.append(data)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await trio.sleep(1)
            os.write(write_end, b"late\n")
            await trio.sleep(1)
            assert got == [b"late\n"]
            os.close(write_end)
    finally:
        await frames_in.aclose()
    assert got == [b"late\n"]


async def test_closed_input_is_closed() -> None:
    read_end, write_end = os.pipe()
    frames_in = FramesIn(read_end)
    await frames_in.aclose()
    try:
        with pytest.raises(trio.ClosedResourceError):
            await frames_in.receive_some()
    finally:
        os.close(write_end)
