"""Measurements, their summary rows, and the JSON and table the harness prints."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import msgspec


class Row(msgspec.Struct):
    """One metric of one scenario: ours against its raw baseline, over the repeats."""

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
            met = met and row.ratio_median <= max_ratio
        if min_ratio is not None:
            goals.append(f">= {min_ratio:g}x")
            met = met and row.ratio_median >= min_ratio
    if max_value is not None:
        goals.append(f"<= {max_value:g} {unit}")
        met = met and row.median <= max_value
    if goals:
        row.goal = ", ".join(goals)
        row.met = met
    return row


def table(rows: Sequence[Row]) -> str:
    """A plain-text table of the rows."""
    header = ["scenario", "metric", "median [min-max]", "baseline", "ratio [min-max]", "goal"]
    lines = [header]
    for row in rows:
        value = f"{row.median:.2f} [{row.min:.2f}-{row.max:.2f}] {row.unit}"
        if row.ratio_median is not None:
            assert row.ratio_min is not None
            assert row.ratio_max is not None
            ratio = f"{row.ratio_median:.2f}x [{row.ratio_min:.2f}-{row.ratio_max:.2f}]"
            base = f"{row.baseline} {row.baseline_median:.2f}"
        else:
            ratio = base = "-"
        goal = "-" if row.goal is None else f"{row.goal} {'met' if row.met else 'MISSED'}"
        lines.append([row.scenario, row.metric, value, base, ratio, goal])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )
