"""Drains measured side by side in rounds, and the table of their ratios.

A benchmark that compares variants (or systems) drains the same work with each, round after
round on fresh databases of one server, and reports medians over rounds and, for each, the
ratio of its rate to a baseline's in the same round: the machine is shared and noisy, so only
runs made together are compared.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Drain:
    """One drain: ``count`` workflows (or jobs) in ``wall`` seconds, ``cpu`` seconds of the
    worker's CPU and ``server_cpu`` of the server's (None: not measured)."""

    name: str
    count: int
    wall: float
    cpu: float
    server_cpu: float | None = None

    @property
    def rate(self) -> float:
        """Workflows (or jobs) a second."""
        return self.count / self.wall


Round = Mapping[str, Drain]


def ratio_table(
    rounds: Sequence[Round],
    unit: str,
    baseline: str | Callable[[str], str],
    *,
    baseline_over: bool = False,
) -> str:
    """A Markdown table: per name, the median rate, CPU per ``unit`` (the worker's, and the
    server's when measured) and its ratio to ``baseline`` in the same round, median (min-max).

    Args:
        rounds: each round's drains by name (every round has every name).
        unit: what is counted (``workflow``, ``job``).
        baseline: the name each is compared with, or a function of the name giving it.
        baseline_over: the ratio is the baseline's rate over the name's (how many times the
            name's rate the baseline makes), not the name's over the baseline's.
    """
    server = any(drain.server_cpu is not None for r in rounds for drain in r.values())
    columns = ["variant", f"{unit}s/s, median", f"worker CPU per {unit} (ms)"]
    if server:
        columns.append(f"server CPU per {unit} (ms)")
    columns.append("baseline / it, same round" if baseline_over else "of the baseline, same round")
    lines = ["| " + " | ".join(columns) + " |", "| --- " * len(columns) + "|"]
    for name in rounds[0]:
        runs = [r[name] for r in rounds]
        base = baseline(name) if callable(baseline) else baseline
        ratios = [
            r[base].rate / r[name].rate if baseline_over else r[name].rate / r[base].rate
            for r in rounds
        ]
        cells = [
            name,
            f"{statistics.median(d.rate for d in runs):,.0f}",
            f"{statistics.median(d.cpu / d.count * 1000 for d in runs):.3f}",
        ]
        if server:
            spent = [d.server_cpu / d.count * 1000 for d in runs if d.server_cpu is not None]
            cells.append(f"{statistics.median(spent):.3f}" if spent else "-")
        cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
