"""The default run over several seeds: `fast train --seed S` for each S, then one table.

    .venv/bin/python benchmarks/default_run_seeds.py --seeds 0-4
    .venv/bin/python benchmarks/default_run_seeds.py --seeds 0-4 --report-only   # the table of runs on disk
    .venv/bin/python -m benchmarks.default_run_seeds [the same flags]   # the same command, from the repository root

Each seed is the whole local stack that `python3 dev.py train` starts, with every default
(`--seed S --name default-seed-S`), one after the other so no run slows another. The table
(mean, sample std and least of the held-out return and of the margin over the initial policy,
and per seed the collision and off-road rates) goes to benchmarks/results/default-run/.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the packages, not this directory's benchmarks/sim_server.py
KEYS = ("return_mean", "collided_rate", "off_road_rate", "length_mean", "route_progress_mean")


def _seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def run_seed(seed: int, runs_dir: Path, prefix: str) -> float:
    started = time.perf_counter()
    command = [sys.executable, "-m", "fast", "train", "--seed", str(seed), "--name", f"{prefix}{seed}"]
    command += ["--runs-dir", str(runs_dir)]
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def collect(seeds: list[int], runs_dir: Path, prefix: str) -> dict:
    out = {}
    for seed in seeds:
        run = runs_dir / f"{prefix}{seed}"
        evaluation = json.loads((run / "eval.json").read_text())
        lines = (run / "metrics.jsonl").read_text().splitlines()
        out[str(seed)] = {
            "trained": {k: evaluation["trained"]["summary"][k] for k in KEYS},
            "initial": {k: evaluation["initial"]["summary"][k] for k in KEYS},
            "random": {k: evaluation["random"]["summary"][k] for k in KEYS},
            "iterations": len(lines),
            "run_s": json.loads(lines[-1])["time"]
            - json.loads(lines[0])["time"]
            + json.loads(lines[0])["iteration_time_s"],
        }
    return out


def by_scenario(seeds: list[int], runs_dir: Path, prefix: str) -> dict:
    """Held-out episodes pooled over the seeds, per takeover scenario and policy: how many, and
    the collision and off-road counts; and how often a clip's episodes all ended alike."""
    from sim_server.takeover.catalog import build_catalog
    from sim_server.takeover.scenarios import SCENARIOS

    catalog = build_catalog()
    out: dict = {}
    alike = total = 0
    for seed in seeds:
        evaluation = json.loads((runs_dir / f"{prefix}{seed}" / "eval.json").read_text())
        for policy in ("initial", "trained"):
            per_clip: dict[int, set] = {}
            for episode in evaluation[policy]["episodes"]:
                clip = int(episode["clip_id"])
                cell = out.setdefault(str(SCENARIOS[catalog.clip_scenario[clip]]), {}).setdefault(
                    policy, {"episodes": 0, "collided": 0, "off_road": 0}
                )
                cell["episodes"] += 1
                cell["collided"] += int(episode["collided"])
                cell["off_road"] += int(episode["off_road"])
                per_clip.setdefault(clip, set()).add((int(episode["collided"]), int(episode["off_road"])))
            alike += sum(len(outcomes) == 1 for outcomes in per_clip.values())
            total += len(per_clip)
    return {"scenarios": out, "clips_ending_alike": alike / max(total, 1)}


def scenario_table(scenarios: dict) -> str:
    rows = [
        "| scenario | episodes | collision rate initial → trained | off-road rate initial → trained |",
        "|---|---:|---:|---:|",
    ]
    for name, cells in scenarios["scenarios"].items():
        i, t = cells["initial"], cells["trained"]
        rows.append(
            f"| {name} | {t['episodes']} | {i['collided'] / i['episodes']:.2f} → {t['collided'] / t['episodes']:.2f} | "
            f"{i['off_road'] / i['episodes']:.2f} → {t['off_road'] / t['episodes']:.2f} |"
        )
    rows.append("")
    rows.append(
        f"All the episodes of a clip ended alike (the same collision and off-road outcome) for "
        f"{scenarios['clips_ending_alike']:.0%} of (seed, policy, clip): the rates rest on about 20 clips a seed, "
        "not 60 independent episodes."
    )
    return "\n".join(rows)


def summary_table(result: dict) -> str:
    """Mean ± sample std over the seeds of each policy's held-out figures (the README's table)."""
    seeds = list(result["seeds"].values())
    names = {
        "return_mean": ("return", 1),
        "collided_rate": ("collision rate", 2),
        "off_road_rate": ("off-road rate", 2),
        "length_mean": ("mean episode length (steps)", 0),
        "route_progress_mean": ("route progress", 2),
    }
    rows = [
        f"| over {len(seeds)} seeds, mean ± std | trained (v350) | initial (v0) | random actions |",
        "|---|---:|---:|---:|",
    ]
    for key, (label, digits) in names.items():
        cells = []
        for policy in ("trained", "initial", "random"):
            xs = [r[policy][key] for r in seeds]
            std = statistics.stdev(xs) if len(xs) > 1 else 0.0
            cells.append(f"{statistics.mean(xs):.{digits}f} ± {std:.{digits}f}")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table(result: dict) -> str:
    seeds = result["seeds"]
    rows = [
        "| seed | trained return | initial return | margin | random return | collision trained / initial "
        "| off-road trained / initial | length trained / initial | run s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seed, r in seeds.items():
        t, i = r["trained"], r["initial"]
        margin = t["return_mean"] - i["return_mean"]
        rows.append(
            f"| {seed} | {t['return_mean']:.1f} | {i['return_mean']:.1f} | {margin:+.1f} | "
            f"{r['random']['return_mean']:.1f} | {t['collided_rate']:.2f} / {i['collided_rate']:.2f} | "
            f"{t['off_road_rate']:.2f} / {i['off_road_rate']:.2f} | "
            f"{t['length_mean']:.0f} / {i['length_mean']:.0f} | {r['run_s']:.0f} |"
        )
    trained = [r["trained"]["return_mean"] for r in seeds.values()]
    initial = [r["initial"]["return_mean"] for r in seeds.values()]
    margin = [a - b for a, b in zip(trained, initial)]

    def mean_of(policy: str, key: str) -> float:
        return statistics.mean(r[policy][key] for r in seeds.values())

    fewer_collisions = sum(r["trained"]["collided_rate"] < r["initial"]["collided_rate"] for r in seeds.values())
    less_off_road = sum(r["trained"]["off_road_rate"] < r["initial"]["off_road_rate"] for r in seeds.values())
    n = len(seeds)

    def spread(xs: list[float]) -> str:
        std = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return f"{statistics.mean(xs):.1f} ± {std:.1f} (least {min(xs):.1f})"

    rows += [
        "",
        f"Over {n} seeds (mean ± sample std, least): trained {spread(trained)}; initial {spread(initial)}; "
        f"margin {spread(margin)}. Fewer collisions than the initial policy in {fewer_collisions} of {n} seeds, "
        f"less off-road in {less_off_road} of {n}; collision rate {mean_of('trained', 'collided_rate'):.2f} "
        f"against {mean_of('initial', 'collided_rate'):.2f}, off-road {mean_of('trained', 'off_road_rate'):.2f} "
        f"against {mean_of('initial', 'off_road_rate'):.2f}.",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0-4")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs")
    parser.add_argument("--prefix", default="default-seed-", help="run names are PREFIX<seed>")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/default-run")
    parser.add_argument("--report-only", action="store_true", help="only tabulate runs already on disk")
    parser.add_argument("--commit", default=None, help="the commit the runs were made with (default: this checkout's)")
    args = parser.parse_args()
    seeds = _seeds(args.seeds)
    if not args.report_only:
        for seed in seeds:
            seconds = run_seed(seed, args.runs_dir, args.prefix)
            print(f"seed {seed}: {seconds:.0f} s", flush=True)
    result = {
        "command": f"python benchmarks/default_run_seeds.py --seeds {args.seeds}  (fast train --seed S, every other "
        "setting the default of `python3 dev.py train`)",
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, {time.strftime('%Y-%m-%d')}",
        "commit": args.commit or _commit(),
        "seeds": collect(seeds, args.runs_dir, args.prefix),
        "by_scenario": by_scenario(seeds, args.runs_dir, args.prefix),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "seeds.json").write_text(json.dumps(result, indent=1))
    text = summary_table(result) + "\n\n" + table(result)
    text += "\n\nBy scenario, the held-out episodes of every seed pooled:\n\n" + scenario_table(result["by_scenario"])
    print(text)
    (args.out / "seeds.md").write_text(
        "# The default run over several seeds\n\n"
        f"    {result['command']}\n\n"
        f"{result['machine']}, commit {result['commit']}. Evaluation as in the README: the 20 held-out clips x 3 "
        "episodes, deterministic actions for both network policies, the same episodes for each policy.\n\n"
        f"{text}\n"
    )


if __name__ == "__main__":
    main()
