"""``python -m bench._acp_memory_agent``: ``greenroom acp --model scripted:0`` with its sessions
in memory only, the like of `bench._acp_sdk_agent`, which keeps nothing.

The same connection, runtime, agents and turns as the command (`run_stdio`), with no store:
no log written, no fsync. What `bench.acp` compares with the SDK agent beside the durable
default, so that what persistence costs and what the rest costs are told apart.
"""

from __future__ import annotations

import os

from greenroom.acp.stdio import run_stdio
from greenroom.models.named import model_named

MODEL = "scripted:0"


def main() -> None:
    raise SystemExit(run_stdio({MODEL: model_named(MODEL, os.environ)}, None))


if __name__ == "__main__":
    main()
