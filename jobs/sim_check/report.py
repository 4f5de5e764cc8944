"""How `fast sim-check` shows its results: a rich table of rows, a table of figures, a summary line,
and the same as JSON (`--json PATH`)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jobs.sim_check.checks import FAIL, PASS, SKIP, WARN, Report

_STYLE = {PASS: "green", FAIL: "bold red", WARN: "yellow", SKIP: "dim"}


def summary_line(report: Report) -> str:
    """ "N passed, M failed, K skipped" (and the warnings, when there are any)."""
    line = f"{report.count(PASS)} passed, {report.count(FAIL)} failed, {report.count(SKIP)} skipped"
    warnings = report.count(WARN)
    return line + (f", {warnings} warning{'s' if warnings != 1 else ''}" if warnings else "")


def render(report: Report, console: Console) -> None:
    title = f"fast sim-check {report.address}" + (f" ({report.env_id})" if report.env_id else "")
    table = Table(title=escape(title), show_lines=False, expand=False)
    table.add_column("check", style="bold")
    table.add_column("what")
    table.add_column("result")
    table.add_column("detail / fix")
    previous = ""
    for r in report.results:
        detail = escape(r.detail)
        if r.fix and r.status in (FAIL, WARN):
            detail += f"\n[{_STYLE[r.status]}]fix:[/] {escape(r.fix)}"
        table.add_row(
            r.check if r.check != previous else "",
            escape(r.name),
            f"[{_STYLE[r.status]}]{r.status.upper()}[/]",
            detail,
        )
        previous = r.check
    console.print(table)
    if report.figures:
        figures = Table(title="figures (measured, not pass/fail)")
        for name in ("call", "calls", "median ms", "p95 ms", "calls/s", "slot-steps/s"):
            figures.add_column(name, justify="left" if name == "call" else "right")
        for f in report.figures:
            figures.add_row(
                escape(f.name),
                str(f.calls),
                f"{f.median_ms:.2f}",
                f"{f.p95_ms:.2f}",
                _rate(f.calls_per_s),
                "" if f.slot_steps_per_s is None else _rate(f.slot_steps_per_s),
            )
        console.print(figures)
    style = "bold red" if report.count(FAIL) else "bold green"
    console.print(f"[{style}]{summary_line(report)}[/] in {report.elapsed_s:.1f} s")


def _rate(per_s: float) -> str:
    return f"{per_s:,.1f}" if per_s < 100 else f"{per_s:,.0f}"


def write_json(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
