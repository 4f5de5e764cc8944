"""The prefetch-and-locality targets, read off one `fast bench sampling` run's sampling.json.

    .venv/bin/python benchmarks/prefetch_targets.py benchmarks/results/sampling-prefetch/sampling.json
    .venv/bin/python -m benchmarks.prefetch_targets [the same flags]   # the same command, from the repository root

Per preset, policy and clip count: FAST with prefetch and locality against the best other mode of
the same run (every other mode may use prefetch and locality too), its share of its own limit and
of the best limit, its time efficiency and the bound that holds, and its speedup against plain SC
(one slot, no prefetch, no locality). Prints a markdown table; measures nothing itself.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HEADLINE = "fast+prefetch+locality"


def targets(rows: list[dict]) -> list[dict]:
    out = []
    configs = sorted({(r["preset"], r["policy"], r["clips"]) for r in rows if r["mode"] == HEADLINE})
    for preset, policy, clips in configs:
        same = [r for r in rows if (r["preset"], r["policy"], r["clips"]) == (preset, policy, clips)]
        fast = next(r for r in same if r["mode"] == HEADLINE)
        others = [r for r in same if not r["mode"].startswith("fast")]
        best = max(others, key=lambda r: r["effective_throughput"]) if others else None
        plain_fast = next((r for r in same if r["mode"] == "fast"), None)
        out.append(
            {
                "preset": preset,
                "policy": policy,
                "clips": clips,
                "fast_steps_s": fast["effective_throughput"],
                "best_other": best["mode"] if best else "-",
                "best_other_steps_s": best["effective_throughput"] if best else float("nan"),
                "vs_best_other": fast["effective_throughput"] / best["effective_throughput"] if best else float("nan"),
                "vs_sc": fast["speedup_vs_sc"],
                "plain_fast_vs_sc": plain_fast["speedup_vs_sc"] if plain_fast else float("nan"),
                "limit": fast["limit"],
                "binding": fast["limit_binding"],
                "share_of_limit": fast["limit_share"],
                "share_of_best_limit": fast["best_limit_share"],
                "time_efficiency": fast["time_efficiency"],
                "cache_hit_rate": fast["cache_hit_rate"],
            }
        )
    return out


def table(found: list[dict]) -> str:
    lines = [
        f"| preset | policy | clips | {HEADLINE} steps/s | best other mode (steps/s) | vs best other | vs SC "
        "| plain fast vs SC | limit (bound) | share of limit | share of best limit | time efficiency | cache hits |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in found:
        lines.append(
            f"| {t['preset']} | {t['policy']} | {t['clips']} | {t['fast_steps_s']:,.0f} | {t['best_other']} "
            f"({t['best_other_steps_s']:,.0f}) | {t['vs_best_other']:.2f}x | {t['vs_sc']:.2f}x | "
            f"{t['plain_fast_vs_sc']:.2f}x | {t['limit']:,.0f} ({t['binding']}) | {t['share_of_limit']:.2f} | "
            f"{t['share_of_best_limit']:.2f} | {t['time_efficiency']:.3f} | {t['cache_hit_rate']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sampling_json", type=Path)
    args = parser.parse_args()
    print(table(targets(json.loads(args.sampling_json.read_text())["rows"])))


if __name__ == "__main__":
    main()
