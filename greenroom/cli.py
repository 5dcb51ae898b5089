"""The ``greenroom`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="greenroom", description="An actor runtime for AI agents on Trio."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run the demo story on embedded defaults")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from greenroom.demo import run_demo

        run_demo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
