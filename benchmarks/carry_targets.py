"""DPSA's truncation targets, read off one `fast bench sampling` run's sampling.json (issue 26).

    .venv/bin/python benchmarks/carry_targets.py benchmarks/results/sampling-carry/sampling.json
    .venv/bin/python -m benchmarks.carry_targets [the same flags]   # the same command, from the repository root

Per preset, policy and clip count: FAST with `carry` against FAST with `reset` and against the
best other mode of the same run (every mode with the same prefetch and locality), carry's mean
episode length against SC's (in the timed window, and in steady state where the run measured it),
its slot resets per 1,000 valid transitions against VER's (in steady state where the run measured
it: the timed window also counts the synchronised resets of a common start), and the limit its
costs put on the pattern it sampled. Prints a markdown table and the targets met or missed; measures nothing itself.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def _base(mode: str) -> str:
    """A row's mode without its prefetch and locality suffixes: fast+carry, fast+reset, ver, sc, ..."""
    parts = mode.split("+")
    return "+".join(p for p in parts if p not in ("prefetch", "locality"))


def targets(result: dict) -> list[dict]:
    rows = result["rows"]
    steady = {(r["policy"], r["mode"], r["clips"]): r for r in result.get("episode_length") or []}
    out = []
    configs = sorted({(r["preset"], r["policy"], r["clips"]) for r in rows if _base(r["mode"]) == "fast+carry"})
    for preset, policy, clips in configs:
        same = {_base(r["mode"]): r for r in rows if (r["preset"], r["policy"], r["clips"]) == (preset, policy, clips)}
        carry, reset, ver = same["fast+carry"], same.get("fast+reset"), same.get("ver")
        others = [r for m, r in same.items() if not m.startswith("fast")]
        best = max(others, key=lambda r: r["effective_throughput"]) if others else None
        length = steady.get((policy, "fast+carry", clips))
        ver_length = steady.get((policy, "ver", clips))
        if length and ver_length and "slot_resets_per_1k_valid" in length:
            resets, ver_resets = length["slot_resets_per_1k_valid"], ver_length["slot_resets_per_1k_valid"]
        else:
            resets = carry["slot_resets_per_1k_valid"]
            ver_resets = ver["slot_resets_per_1k_valid"] if ver else math.nan
        out.append(
            {
                "preset": preset,
                "policy": policy,
                "clips": clips,
                "carry": carry["effective_throughput"],
                "reset": reset["effective_throughput"] if reset else math.nan,
                "best_other": best["mode"] if best else "-",
                "best_other_steps_s": best["effective_throughput"] if best else math.nan,
                "vs_reset": carry["effective_throughput"] / reset["effective_throughput"] if reset else math.nan,
                "vs_best_other": carry["effective_throughput"] / best["effective_throughput"] if best else math.nan,
                "length_vs_sc_window": carry["episode_length_vs_sc"],
                "length_vs_sc_steady": length["mean_vs_sc"] if length else math.nan,
                "resets_vs_ver": resets / ver_resets if ver_resets else math.nan,
                "eta": carry["validity"],
                "limit": carry["limit"],
                "binding": carry["limit_binding"],
                "share_of_limit": carry["limit_share"],
            }
        )
    return out


def _x(value: float) -> str:
    return f"{value:.2f}x" if math.isfinite(value) else "-"


def table(found: list[dict]) -> str:
    lines = [
        "| preset | policy | clips | fast+carry steps/s | fast+reset | carry vs reset | best other mode (steps/s) "
        "| carry vs best other | ep. length vs SC (window / steady) | slot resets vs VER | eta | limit (bound) "
        "| share of limit |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for t in found:
        lines.append(
            f"| {t['preset']} | {t['policy']} | {t['clips']} | {t['carry']:,.0f} | {t['reset']:,.0f} | "
            f"{_x(t['vs_reset'])} | {t['best_other']} ({t['best_other_steps_s']:,.0f}) | {_x(t['vs_best_other'])} | "
            f"{t['length_vs_sc_window']:.2f} / {t['length_vs_sc_steady']:.2f} | {_x(t['resets_vs_ver'])} | "
            f"{t['eta']:.2f} | {t['limit']:,.0f} ({t['binding']}) | {t['share_of_limit']:.2f} |"
        )
    return "\n".join(lines)


def verdicts(found: list[dict]) -> list[str]:
    """The issue's targets, each met or missed, row by row."""

    def rows(check, where=lambda t: True):
        hit = [t for t in found if where(t)]
        missed = [f"{t['preset']}/{t['policy']}/{t['clips']}" for t in hit if not check(t)]
        return f"{len(hit) - len(missed)} of {len(hit)} rows" + (f" (missed: {', '.join(missed)})" if missed else "")

    return [
        "- carry's steady-state mean episode length >= 0.95 of SC's: "
        + rows(lambda t: t["length_vs_sc_steady"] >= 0.95, lambda t: math.isfinite(t["length_vs_sc_steady"])),
        "- carry's slot resets per 1,000 valid within 10% of VER's: "
        + rows(lambda t: abs(t["resets_vs_ver"] - 1) <= 0.10, lambda t: math.isfinite(t["resets_vs_ver"])),
        "- carry >= reset: " + rows(lambda t: t["vs_reset"] >= 1.0, lambda t: math.isfinite(t["vs_reset"])),
        "- vectorized: carry >= 1.3x the best other mode: "
        + rows(lambda t: t["vs_best_other"] >= 1.3, lambda t: t["preset"] == "vectorized"),
        "- calibrated, 30 clips: carry >= 1.0x the best other mode: "
        + rows(lambda t: t["vs_best_other"] >= 1.0, lambda t: t["preset"] == "calibrated" and t["clips"] == 30),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sampling_json", type=Path)
    args = parser.parse_args()
    found = targets(json.loads(args.sampling_json.read_text()))
    print(table(found))
    print()
    print("\n".join(verdicts(found)))


if __name__ == "__main__":
    main()
