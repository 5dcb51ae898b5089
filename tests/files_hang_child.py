"""``greenroom acp`` whose model reads a FIFO that the type check lets through: a read that hangs.

Usage: ``python files_hang_child.py`` with ``GREENROOM_HOME`` set (sessions in
``$GREENROOM_HOME/sessions``, as ``greenroom acp`` keeps them). The model's first
step calls ``read_file`` on ``pipe`` in the session's cwd; its later steps echo.
The test holds the FIFO open for writing and writes nothing, so the tool's
read blocks in the kernel forever: the stand-in for a hung network file
system. Only the regular-file check is changed; the walk, the open and the
read are greenroom's own.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from greenroom.acp.stdio import run_stdio
from greenroom.models import CallTool, ScriptedModel
from greenroom.session.persistence import JsonlPersistence
from greenroom.tools import confine

checked = confine._check_regular  # the one seam: a FIFO passes as a file


def _fifo_passes(info: os.stat_result, shown: str) -> None:
    if not stat.S_ISFIFO(info.st_mode):
        checked(info, shown)


confine._check_regular = _fifo_passes

if __name__ == "__main__":
    model = ScriptedModel([[CallTool("read_file", {"path": "pipe"})]], delay=0)
    store = JsonlPersistence(Path(os.environ["GREENROOM_HOME"]) / "sessions")
    sys.exit(run_stdio({"scripted": model}, store))
