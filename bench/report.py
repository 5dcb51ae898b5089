"""Measurements, their summary rows, and the JSON, table, Markdown and plots the harness writes."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec


class Row(msgspec.Struct):
    """One metric of one scenario: ours against its raw baseline, over the repeats.

    A goal is any of ``max_ratio`` (a cost: the ratio must stay at or under it),
    ``min_ratio`` (a rate, or a peer's cost over ours: at or over it) and
    ``max_value`` (the median itself, in ``unit``); ``goal`` spells them out and
    ``met`` says whether the medians meet all of them. A row that could not be
    measured (a peer not installed, a scenario that failed) has NaN values and
    says why in ``note``. ``plot`` and ``n`` place a row on a curve: the plot's
    name and the x value (the number of live agents).
    """

    scenario: str
    metric: str
    unit: str
    median: float
    min: float
    max: float
    baseline: str | None = None
    baseline_median: float | None = None
    ratio_median: float | None = None
    ratio_min: float | None = None
    ratio_max: float | None = None
    goal: str | None = None
    met: bool | None = None
    max_ratio: float | None = None
    min_ratio: float | None = None
    max_value: float | None = None
    note: str | None = None
    plot: str | None = None
    n: int | None = None

    @property
    def measured(self) -> bool:
        return not math.isnan(self.median)


def compare(
    scenario: str,
    metric: str,
    unit: str,
    ours: Sequence[float],
    *,
    baseline: str | None = None,
    raw: Sequence[float] | None = None,
    max_ratio: float | None = None,
    min_ratio: float | None = None,
    max_value: float | None = None,
    note: str | None = None,
    plot: str | None = None,
    n: int | None = None,
) -> Row:
    """Summarise ``ours`` (one value per repeat), with per-repeat ratios to ``raw``.

    ``max_ratio`` is a goal for costs (lower is better), ``min_ratio`` for rates.
    """
    row = Row(
        scenario=scenario,
        metric=metric,
        unit=unit,
        median=statistics.median(ours),
        min=min(ours),
        max=max(ours),
        note=note,
        plot=plot,
        n=n,
    )
    goals: list[str] = []
    met = True
    if raw is not None:
        ratios = [a / b for a, b in zip(ours, raw, strict=True)]
        row.baseline = baseline
        row.baseline_median = statistics.median(raw)
        row.ratio_median = statistics.median(ratios)
        row.ratio_min = min(ratios)
        row.ratio_max = max(ratios)
        if max_ratio is not None:
            goals.append(f"<= {max_ratio:g}x")
            row.max_ratio = max_ratio
            met = met and row.ratio_median <= max_ratio
        if min_ratio is not None:
            goals.append(f">= {min_ratio:g}x")
            row.min_ratio = min_ratio
            met = met and row.ratio_median >= min_ratio
    if max_value is not None:
        goals.append(f"<= {max_value:g} {unit}")
        row.max_value = max_value
        met = met and row.median <= max_value
    if goals:
        row.goal = ", ".join(goals)
        row.met = met
    return row


def skipped(
    scenario: str,
    metric: str,
    unit: str,
    reason: str,
    *,
    baseline: str | None = None,
    max_ratio: float | None = None,
    min_ratio: float | None = None,
    max_value: float | None = None,
) -> Row:
    """A row that was not measured, with its goal (if any) and the reason in ``note``."""
    goals = []
    if max_ratio is not None:
        goals.append(f"<= {max_ratio:g}x")
    if min_ratio is not None:
        goals.append(f">= {min_ratio:g}x")
    if max_value is not None:
        goals.append(f"<= {max_value:g} {unit}")
    nan = math.nan
    return Row(
        scenario=scenario,
        metric=metric,
        unit=unit,
        median=nan,
        min=nan,
        max=nan,
        baseline=baseline,
        goal=", ".join(goals) or None,
        max_ratio=max_ratio,
        min_ratio=min_ratio,
        max_value=max_value,
        note=reason,
    )


# -- formatting -------------------------------------------------------------------------------


def num(value: float) -> str:
    """A value with as many decimals as its size deserves (thousands separated)."""
    if math.isnan(value):
        return "n/a"
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _value(row: Row) -> str:
    if not row.measured:
        return "not measured"
    return f"{num(row.median)} [{num(row.min)}-{num(row.max)}] {row.unit}"


def _baseline(row: Row) -> str:
    if row.baseline is None:
        return "-"
    if row.baseline_median is None:
        return row.baseline
    return f"{row.baseline} {num(row.baseline_median)}"


def _ratio(row: Row) -> str:
    if row.ratio_median is None:
        return "-"
    assert row.ratio_min is not None
    assert row.ratio_max is not None
    return f"{row.ratio_median:.2f}x [{row.ratio_min:.2f}-{row.ratio_max:.2f}]"


def _status(row: Row) -> str:
    if row.goal is None:
        return "-"
    if row.met is None:
        return "NOT MEASURED"
    return "MET" if row.met else "MISSED"


def table(rows: Sequence[Row]) -> str:
    """A plain-text table of the rows."""
    header = ["scenario", "metric", "median [min-max]", "baseline", "ratio [min-max]", "goal"]
    lines = [header]
    for row in rows:
        goal = "-" if row.goal is None else f"{row.goal} {_status(row)}"
        lines.append([row.scenario, row.metric, _value(row), _baseline(row), _ratio(row), goal])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def shortfalls(row: Row) -> list[str]:
    """How each goal of a measured, missed row is missed: what was needed, what was measured."""
    out: list[str] = []
    if row.met is not False:
        return out
    ratio = row.ratio_median
    if row.max_ratio is not None and ratio is not None and ratio > row.max_ratio:
        over = (ratio / row.max_ratio - 1) * 100
        out.append(f"needed <= {row.max_ratio:g}x, measured {ratio:.2f}x ({over:.0f}% over)")
    if row.min_ratio is not None and ratio is not None and ratio < row.min_ratio:
        short = row.min_ratio / ratio if ratio > 0 else math.inf
        out.append(
            f"needed >= {row.min_ratio:g}x, measured {ratio:.2f}x ({short:.2f}x short of the goal)"
        )
    if row.max_value is not None and row.median > row.max_value:
        # A goal of 0 (nothing left over) has no percentage to be over by.
        over = f", {(row.median / row.max_value - 1) * 100:.0f}% over" if row.max_value else ""
        out.append(
            f"needed <= {num(row.max_value)} {row.unit}, measured {num(row.median)} {row.unit}"
            f" ({num(row.median - row.max_value)} {row.unit} over{over})"
        )
    return out


def _measured(row: Row) -> str:
    """The medians a row's goals are checked on: its ratio and/or its value."""
    if not row.measured:
        return "not measured"
    parts = []
    if (row.max_ratio is not None or row.min_ratio is not None) and row.ratio_median is not None:
        parts.append(f"{row.ratio_median:.2f}x")
    if row.max_value is not None:
        parts.append(f"{num(row.median)} {row.unit}")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(
    rows: Sequence[Row], info: Mapping[str, object], plots: Sequence[str] = (), errors: int = 0
) -> str:
    """The Markdown report: run info, goals at a glance, a table per scenario, misses, plots."""
    lines = ["# greenroom bench", ""]
    for key, value in info.items():
        lines.append(f"* {key}: `{value}`")
    lines.append("")
    lines += [
        "Each value is the median over the repeats, with [min-max]. Every ratio is measured in"
        " the same run, repeat by repeat (the variants alternate inside each repeat), and"
        " summarised the same way. A goal is checked on the medians.",
        "",
    ]
    goals = [row for row in rows if row.goal is not None]
    met = sum(row.met is True for row in goals)
    missed = [row for row in goals if row.met is False]
    unmeasured = [row for row in rows if not row.measured]
    lines += [
        "## Summary",
        "",
        f"{len(goals)} goals: {met} met, {len(missed)} missed,"
        f" {sum(row.met is None for row in goals)} not measured."
        + (f" {errors} scenario(s) failed (see below)." if errors else ""),
        "",
    ]
    if goals:
        lines += [
            "| scenario | metric | against | goal | measured | status |",
            "|---|---|---|---|---|---|",
        ]
        for row in goals:
            status = _status(row)
            cells = [
                row.scenario,
                row.metric,
                row.baseline or "-",
                row.goal or "-",
                _measured(row),
                f"**{status}**" if status in ("MISSED", "NOT MEASURED") else status,
            ]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    scenarios = list(dict.fromkeys(row.scenario for row in rows))
    for scenario in scenarios:
        lines += [
            f"## {scenario}",
            "",
            "| metric | median [min-max] | baseline | ratio [min-max] | goal | status |",
            "|---|---|---|---|---|---|",
        ]
        notes: list[str] = []
        for row in rows:
            if row.scenario != scenario:
                continue
            metric = row.metric
            if row.note is not None:
                notes.append(f"{len(notes) + 1}. {row.metric}: {row.note}")
                metric += f" ({len(notes)})"
            cells = [metric, _value(row), _baseline(row), _ratio(row), row.goal or "-"]
            status = _status(row)
            cells.append(f"**{status}**" if status in ("MISSED", "NOT MEASURED") else status)
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
        if notes:
            lines += [*notes, ""]
    lines += ["## Missed goals", ""]
    if missed:
        for row in missed:
            lines.append(
                f"* **{row.scenario}: {row.metric}** (against {row.baseline or 'its goal'}):"
                f" {'; '.join(shortfalls(row))}."
            )
    else:
        lines.append("None: every goal that was measured was met.")
    lines.append("")
    if unmeasured:
        lines += ["## Not measured", ""]
        for row in unmeasured:
            goal = f" (goal {row.goal})" if row.goal else ""
            lines.append(f"* {row.scenario}: {row.metric}{goal}: {row.note}")
        lines.append("")
    if plots:
        lines += ["## Plots", ""]
        for plot in plots:
            lines += [f"![{plot}]({plot})", ""]
    return "\n".join(lines)


# -- plots ------------------------------------------------------------------------------------

_PLOTS = {
    "memory_per_agent": ("Memory per idle agent", "bytes per agent"),
    "turn_overhead": ("One-step turn with N live agents", "microseconds per turn"),
}


def plot(rows: Sequence[Row], out: Path) -> list[str]:
    """Write an SVG per curve found in the rows (matplotlib, Agg); the file names written.

    Returns nothing (and writes nothing) if matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written: list[str] = []
    for name, (title, ylabel) in _PLOTS.items():
        points = sorted(
            (row for row in rows if row.plot == name and row.n is not None and row.measured),
            key=lambda row: row.n or 0,
        )
        if not points:
            continue
        xs = [row.n or 0 for row in points]
        fig, ax = plt.subplots(figsize=(7, 4.2))
        ys = [row.median for row in points]
        err = [
            [row.median - row.min for row in points],
            [row.max - row.median for row in points],
        ]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label="greenroom (median, min-max)")
        base = [row.baseline_median for row in points if row.baseline_median is not None]
        if len(base) == len(points):
            ax.plot(xs, base, marker="s", linestyle="--", label=f"raw Trio: {points[0].baseline}")
        goal = points[-1].max_value
        if goal is not None:
            label = f"goal <= {goal:g} {points[0].unit} (at N={xs[-1]:,})"
            ax.axhline(goal, color="red", linestyle=":", label=label)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("live agents (N)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        filename = f"{name}.svg"
        fig.savefig(out / filename, format="svg")
        plt.close(fig)
        written.append(filename)
    return written
