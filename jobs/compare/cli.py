"""`fast compare RUN_A RUN_B`: the command-line face of jobs/compare/run.py (registered in jobs/cli.py)."""

from __future__ import annotations

import glob
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

_GLOB_CHARS = set("*?[")


def expand_runs(spec: str, argument: str) -> list[Path]:
    """'a,b' or 'runs/fast-*' (or both, comma-separated) -> run directories, in the order given (globs sorted)."""
    paths: list[Path] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if _GLOB_CHARS & set(item):
            matches = sorted(Path(m) for m in glob.glob(item) if Path(m).is_dir())
            if not matches:
                raise ValueError(
                    f"{argument}: {item!r} matches no directory; check the pattern (quote it so the shell "
                    "does not expand it first)"
                )
            paths += matches
        else:
            paths.append(Path(item))
    if not paths:
        raise ValueError(f"{argument}: {spec!r} names no run; pass run directories, comma-separated, or a glob")
    return paths


def compare_command(
    run_a: Annotated[
        str,
        typer.Argument(
            metavar="RUN_A", help="Group A: run directories, comma-separated, or a glob such as 'runs/fast-*'."
        ),
    ],
    run_b: Annotated[str, typer.Argument(metavar="RUN_B", help="Group B, as RUN_A (e.g. 'runs/sc-*').")],
    episodes_per_clip: Annotated[int, typer.Option(min=1, help="Episodes per held-out clip and policy.")] = 3,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the evaluation episodes (the same for every policy).")] = 0,
    servers: Annotated[
        Optional[int], typer.Option(min=1, help="Simulator server processes to start. \\[default: 2]")
    ] = None,
    slots: Annotated[Optional[int], typer.Option(min=1, help="Slots per simulator server. \\[default: 8]")] = None,
    simulators: Annotated[
        Optional[str],
        typer.Option(
            help="Evaluate on simulator servers that run already: HOST:PORT[,HOST:PORT...] or dns:///NAME:PORT "
            "(none started or stopped; the environment's run token; --servers/--slots then do not apply)."
        ),
    ] = None,
    out: Annotated[Optional[Path], typer.Option(help="Output directory. \\[default: runs/compare-<timestamp>]")] = None,
) -> None:
    """Evaluate the final policies of two groups of runs on the same held-out clips; per closed-loop metric,
    A - B with its jackknife 95% CI over clips, and which intervals cover zero (docs/compare.md).

    Writes OUT/compare.json and OUT/compare.md.
    Exits 0 when done, 2 for runs or settings that cannot be compared, 1 when the evaluation failed.
    """
    from jobs.compare.run import CompareError, compare

    out_dir = out if out is not None else Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        groups = {run_a: expand_runs(run_a, "RUN_A"), run_b: expand_runs(run_b, "RUN_B")}
        if run_a == run_b:  # one label per group, even when a group is compared with itself
            groups = {f"A: {run_a}": groups[run_a], f"B: {run_b}": groups[run_b]}
        result = compare(
            groups,
            episodes_per_clip=episodes_per_clip,
            seed=seed,
            servers=servers,
            slots=slots,
            out_dir=out_dir,
            simulators=simulators,
        )
    except (CompareError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    except (RuntimeError, OSError) as exc:
        typer.echo(f"error: evaluation failed: {exc}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo((out_dir / "compare.md").read_text())
    typer.echo(
        f"{result['covering']} of {result['total']} intervals cover zero; wrote {out_dir / 'compare.json'} "
        f"and {out_dir / 'compare.md'}"
    )
