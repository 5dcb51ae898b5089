"""``python -m bench [SCENARIO ...] [--repeats N] [--quick] [--out DIR]``: run, print, write.

Every run prints the rows as JSON and as a table, and writes (to ``--out``,
default ``bench/results``): ``latest.json`` (the machine, the run and every
row), ``report.md`` (a table per scenario, the missed goals and by how much)
and, when the scale scenario ran and matplotlib is installed, the SVG plots
``memory_per_agent.svg`` and ``turn_overhead.svg``. A scenario that fails is
reported (a row saying why, and exit status 1) and the others still run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import msgspec

from bench.report import Row, markdown, plot, skipped, table

SCENARIOS = (
    "supervisor",
    "agents",
    "sessions",
    "bash",
    "acp",
    "mcp",
    "peers",
    "scale",
    "caps",
    "tracing",
    "files",
    "compaction",
    "models",
    "content",
    "hosts",
    "serve",
)
_DEFAULT_OUT = Path(__file__).resolve().parent / "results"
_VERSIONS = (
    "greenroom",
    "trio",
    "msgspec",
    "agent-client-protocol",
    "pydantic-ai-slim",
    "pydantic-ai",
    "openai-agents",
    "matplotlib",
)


def _versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in _VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _machine() -> dict[str, object]:
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "scenarios", nargs="*", default=["all"], help=f"{', '.join(SCENARIOS)} or all"
    )
    parser.add_argument("--repeats", type=int, default=5, help="repeats per scenario (default 5)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument(
        "--out", type=Path, default=_DEFAULT_OUT, help="where to write (default bench/results)"
    )
    args = parser.parse_args(argv)
    names = list(SCENARIOS) if "all" in args.scenarios else list(dict.fromkeys(args.scenarios))
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)} or all")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")

    started = datetime.datetime.now(datetime.UTC)
    t0 = time.perf_counter()
    rows: list[Row] = []
    seconds: dict[str, float] = {}
    failed: list[str] = []
    for name in names:
        sys.stderr.write(f"bench: {name} ...\n")
        s0 = time.perf_counter()
        try:
            module = importlib.import_module(f"bench.{name}")
            rows.extend(module.run(args.repeats, args.quick))
        except Exception as exc:
            traceback.print_exc()
            failed.append(name)
            reason = f"the scenario failed: {type(exc).__name__}: {exc}".splitlines()[0]
            rows.append(skipped(name, "(scenario failed)", "-", reason))
        seconds[name] = round(time.perf_counter() - s0, 1)
        sys.stderr.write(f"bench: {name} took {seconds[name]:.1f} s\n")
    wall = time.perf_counter() - t0

    sys.stdout.write(msgspec.json.format(msgspec.json.encode(rows)).decode() + "\n\n")
    sys.stdout.write(table(rows) + "\n")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])
    run_info: dict[str, object] = {
        "command": command.strip(),
        "scenarios": names,
        "repeats": args.repeats,
        "quick": args.quick,
        "started": started.isoformat(timespec="seconds"),
        "wall_seconds": round(wall, 1),
        "scenario_seconds": seconds,
        "failed": failed,
    }
    machine = _machine()
    versions = _versions()
    document = {"machine": machine, "run": run_info, "versions": versions, "rows": rows}
    (out / "latest.json").write_bytes(msgspec.json.format(msgspec.json.encode(document)) + b"\n")
    plots = plot(rows, out)
    info: dict[str, object] = {
        "command": run_info["command"],
        "started (UTC)": run_info["started"],
        "wall time": f"{wall:.1f} s ("
        + ", ".join(f"{k} {v:g} s" for k, v in seconds.items())
        + ")",
        "python": f"{machine['implementation']} {machine['python']}",
        "platform": machine["platform"],
        "CPUs": machine["cpu_count"],
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
    }
    (out / "report.md").write_text(markdown(rows, info, plots, errors=len(failed)))
    written = ["latest.json", "report.md", *plots]
    sys.stderr.write(f"bench: {wall:.1f} s; wrote {', '.join(str(out / w) for w in written)}\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
