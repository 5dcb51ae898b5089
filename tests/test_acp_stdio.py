"""`greenroom.acp.stdio.FramesOut`: the frames' pipe, written at once, all of it, or an error."""

from __future__ import annotations

import os
import threading
import time

import pytest
import trio
import trio.testing

from greenroom.acp.stdio import FramesOut


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
