"""``python -m bench [SCENARIO ...] [--repeats N] [--quick]``: run, print JSON and a table."""

from __future__ import annotations

import argparse
import importlib
import sys

import msgspec

from bench.report import Row, table

SCENARIOS = ("supervisor", "agents", "sessions", "bash", "acp")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "scenarios", nargs="*", default=["all"], help=f"{', '.join(SCENARIOS)} or all"
    )
    parser.add_argument("--repeats", type=int, default=5, help="repeats per scenario (default 5)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    args = parser.parse_args(argv)
    names = list(SCENARIOS) if "all" in args.scenarios else args.scenarios
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)} or all")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    rows: list[Row] = []
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        rows.extend(module.run(args.repeats, args.quick))
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(rows)).decode() + "\n\n")
    sys.stdout.write(table(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
