"""Which row `fast advise` recommends: the model's first, unless the validation measured another of
the rows it ran faster by more than `--mode auto`'s margin (broker/advisor/auto_mode.py MARGIN, 10%).

Why the margin: a validation is one short measurement of each row, and one measurement of a mode
moves by about 10% from the next on this machine (docs/advisor.md); a run in `--mode auto` switches
only past that margin for the same reason. Within it the model's pick stands, since it was made on
8 seeds of the whole horizon. Past it the measurement wins: the model's top two are often within a
few percent of each other. Over the ranking grid's runs (all-presets-v8 to v10, 48 configurations,
each repeat's figures in turn standing for the validation) the rule picked the median's best in
35.7 on average, the model alone in 34.

Pure: the rows and the validation are `fast advise`'s JSON entries (jobs/advise/run.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.advisor.auto_mode import MARGIN


@dataclass(frozen=True)
class Choice:
    row: dict  # the ranking row recommended
    by: str  # "model" (its first row) or "validation" (a validated row measured past the margin)
    reason: str  # one line for the report


def choose(rows: list[dict], validation: list[dict], margin: float = MARGIN) -> Choice:
    """The row to recommend of `rows` (the ranking, best predicted first), given `validation` (the
    first len(validation) rows measured, in that order: `label`, `measured_effective_throughput`)."""
    if not rows:
        raise ValueError("no ranking rows to choose from")
    first = rows[0]
    if not validation:
        return Choice(first, "model", "the model's first (not validated: --validate-top 0)")
    measured = {v["label"]: float(v["measured_effective_throughput"]) for v in validation}
    if first["label"] not in measured:
        raise ValueError(f"the validation does not hold the model's first row {first['label']!r}")
    fastest = max(measured, key=measured.__getitem__)  # the first of equals: the model's order
    if fastest == first["label"]:
        n = len(validation)
        return Choice(
            first, "model", f"the model's first, measured the faster of the {n}" if n > 1 else "the model's first"
        )
    place = [row["label"] for row in rows].index(fastest)
    base = measured[first["label"]]
    if base <= 0:
        return Choice(rows[place], "validation", f"{first['label']}, the model's first, measured nothing valid")
    gain = measured[fastest] / base - 1
    if measured[fastest] > base * (1 + margin):  # as AutoMode switches
        return Choice(
            rows[place],
            "validation",
            f"validated {gain:.0%} faster than {first['label']}, the model's first, past the "
            f"{margin:.0%} margin (the model put it {_ordinal(place + 1)})",
        )
    return Choice(
        first, "model", f"the model's first; {fastest} measured {gain:.0%} faster, within the {margin:.0%} margin"
    )


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")
