"""Is `--alpha auto` as fast as the best fixed alpha in hindsight? (issue 30: within 5%, against a
grid of at least 5 fixed values measured in the same run, in each preset.)

    .venv/bin/python -m benchmarks.alpha_auto --out benchmarks/results/alpha-auto/NAME
    .venv/bin/python -m benchmarks.alpha_auto --presets off --clips 4 --iterations 1 --repeats 1 --out /tmp/a

Per cost preset and fixed policy (random; trained with --checkpoint), on one pool of sim-server
processes (`fast bench sampling`'s harness, jobs/bench/harness.py), every row is FAST (carry, the
default truncation) on the same clips:

    alpha=A    a fresh sampler at alpha A, a warm-up iteration (steady state, as `fast bench sampling`
               warms up), then `iterations` measured iterations of `samples` valid transitions
    auto       the same, with alpha chosen before each iteration by the broker's own chooser
               (broker/advisor/auto_alpha.py, AutoAlpha): it starts at the prior (0.5) and has seen
               every iteration before the one it chooses for, the warm-up included, as in a run

A row's figure is valid transitions / sampling seconds over its measured iterations. Between them
every row pauses `--gap` seconds, as a run does while the learner updates, and auto's decision runs
in a thread meanwhile, as the broker makes it (docs/advisor.md); a decision longer than the gap
lengthens only auto's pause (each choice records `decision_s` and the `gap_s` it made).
Rows are interleaved repeat by repeat in a shuffled order so the machine's drift hits them alike;
medians over repeats are reported, with the limit the measured costs put on each row's pattern
(jobs/bench/limits.py) beside it. Policies are fixed, so the best alpha does not move during a row:
this measures whether the chooser finds it, not how it follows a learning policy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.options import PRESETS, checkpoint, count, names, seed
from broker.advisor.auto_alpha import AutoAlpha
from jobs.bench.config import SamplingBenchConfig
from jobs.bench.harness import fixed_policies, fresh_sampler, runner_for, simulator_pool, spread_slots, timed_iteration

ALPHAS = (0.1, 0.3, 0.5, 0.7, 0.9, 1.0)  # the fixed grid: 6 values over the chooser's default bounds
AUTO = "auto"
TARGET = 0.95  # auto against the best fixed alpha (issue 30)


def row_label(alpha: float | str) -> str:
    return AUTO if alpha == AUTO else f"alpha={alpha:g}"


async def measure_row(
    cfg: SamplingBenchConfig,
    pool,
    runner,
    alpha: float | str,
    clips: int,
    seed: int,
    iterations: int,
    gap_s: float = 0.0,
) -> dict:
    """One row (module docstring): its measured iterations' figures, and auto's choices."""
    servers = len({int(s) for s in pool.slot_server[spread_slots(pool, clips)]})
    chooser = None
    if alpha == AUTO:
        chooser = AutoAlpha(0.1, 1.0, servers, math.ceil(clips / servers), cfg.t_max, cfg.samples, "carry")
    first = chooser.choose().alpha if chooser else alpha
    warmup = max(cfg.warmup_samples, cfg.warmup_steps * clips)
    sampler, _, slots = fresh_sampler(
        replace(cfg, alpha=first), pool, runner, "fast", clips, seed, samples_per_iteration=warmup
    )
    _, stats = await sampler.sample()
    measured, choices = [], []
    for _ in range(iterations):
        current = alpha
        # Every row pauses `gap_s` between its iterations, as a run does while the learner updates, and
        # auto's decision runs in a thread meanwhile, as the broker runs it (broker/run.py). Without the
        # pause only auto's rows had one (its decision's), and the simulators' first calls after an
        # idle spell are slower: a fixed alpha measured 7,425 valid/s without it, 6,924 with 1 s (`off`).
        started = time.perf_counter()
        pause = asyncio.sleep(gap_s)
        if chooser is None:
            await pause
        else:
            chooser.observe_iteration(stats)
            choice, _ = await asyncio.gather(asyncio.to_thread(chooser.choose), pause)
            current = choice.alpha
            choices.append(
                {
                    "alpha": choice.alpha,
                    "source": choice.source,
                    "predicted": dict(zip(choice.grid, choice.predicted)),
                    "decision_s": choice.decision_s,
                    "gap_s": time.perf_counter() - started,
                }
            )
        sampler.apply_settings(samples_per_iteration=cfg.samples, alpha=current, t_max=cfg.t_max)
        summary, stats = await timed_iteration(sampler, pool, slots)
        measured.append(
            {
                "alpha": current,
                "valid": summary["valid_transitions"],
                "sampling_s": summary["sampling_time_s"],
                "effective_throughput": summary["effective_throughput"],
                "validity": summary["validity"],
                "limit": summary["limit"],
                "episode_length_mean": summary["episode_length_mean"],
            }
        )
    valid = sum(m["valid"] for m in measured)
    seconds = sum(m["sampling_s"] for m in measured)
    return {
        "effective_throughput": valid / seconds,
        "limit": statistics.median(m["limit"] for m in measured),
        "validity": valid / sum(m["valid"] / max(m["validity"], 1e-9) for m in measured),
        "iterations": measured,
        "choices": choices,
    }


def summarise(rows: list[dict]) -> list[dict]:
    """Per (preset, policy, clips): each row's median over repeats, the best fixed alpha in hindsight,
    and auto against it."""
    out = []
    for key in sorted({(r["preset"], r["policy"], r["clips"]) for r in rows}):
        same = [r for r in rows if (r["preset"], r["policy"], r["clips"]) == key]
        figures = {}
        for label in dict.fromkeys(r["row"] for r in same):
            runs = [r for r in same if r["row"] == label]
            figures[label] = {
                "effective_throughput": statistics.median(r["effective_throughput"] for r in runs),
                "spread": [min(r["effective_throughput"] for r in runs), max(r["effective_throughput"] for r in runs)],
                "limit": statistics.median(r["limit"] for r in runs),
                "validity": statistics.median(r["validity"] for r in runs),
            }
        fixed = {k: v for k, v in figures.items() if k != AUTO}
        best = max(fixed, key=lambda k: fixed[k]["effective_throughput"])
        chosen = [c["alpha"] for r in same if r["row"] == AUTO for c in r["choices"]]
        auto = figures.get(AUTO)
        out.append(
            {
                "preset": key[0],
                "policy": key[1],
                "clips": key[2],
                "rows": figures,
                "best_fixed": best,
                "auto_vs_best": auto["effective_throughput"] / fixed[best]["effective_throughput"] if auto else None,
                "auto_alphas": sorted(set(chosen)),
                "auto_alpha_median": statistics.median(chosen) if chosen else None,
            }
        )
    return out


def report(result: dict) -> str:
    cfg = result["config"]
    lines = [
        "# alpha auto against fixed alphas",
        "",
        f"FAST (carry), {cfg['servers']} servers, t_max {cfg['t_max']}, {cfg['iterations']} measured iterations of "
        f"{cfg['samples']} valid transitions a row after a warm-up, a pause of {cfg.get('gap', 0):g} s between "
        f"iterations (auto decides in it), {cfg['repeats']} repeats (median; min-max in "
        f"brackets). Valid transitions per second; limit: what the measured costs allow the row's pattern. "
        f"Whole run {result['wall_clock_s'] / 60:.1f} min.",
        "",
    ]
    labels = [row_label(a) for a in cfg["alphas"]] + [AUTO]
    lines.append("| preset | policy | clips | " + " | ".join(labels) + " | best fixed | auto / best | auto chose |")
    lines.append("|---|---|---:|" + "---:|" * len(labels) + "---|---:|---|")
    for s in result["summary"]:
        cells = []
        for label in labels:
            f = s["rows"].get(label)
            cells.append(
                "-" if f is None else f"{f['effective_throughput']:.0f} [{f['spread'][0]:.0f}-{f['spread'][1]:.0f}]"
            )
        ratio = s["auto_vs_best"]
        verdict = "-" if ratio is None else f"**{ratio:.3f}**" if ratio >= TARGET else f"{ratio:.3f} (below {TARGET})"
        chose = ", ".join(f"{a:g}" for a in s["auto_alphas"]) or "-"
        lines.append(
            f"| {s['preset']} | {s['policy']} | {s['clips']} | "
            + " | ".join(cells)
            + f" | {s['best_fixed']} | {verdict} | {chose} |"
        )
    lines += ["", "Limits (valid transitions / s the measured costs allow, median):", ""]
    lines.append("| preset | policy | clips | " + " | ".join(labels) + " |")
    lines.append("|---|---|---:|" + "---:|" * len(labels))
    for s in result["summary"]:
        cells = ["-" if s["rows"].get(lb) is None else f"{s['rows'][lb]['limit']:.0f}" for lb in labels]
        lines.append(f"| {s['preset']} | {s['policy']} | {s['clips']} | " + " | ".join(cells) + " |")
    met = [s for s in result["summary"] if s["auto_vs_best"] is not None and s["auto_vs_best"] >= TARGET]
    lines += ["", f"Target (auto >= {TARGET} of the best fixed alpha): met in {len(met)} of {len(result['summary'])}."]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> dict:
    cfg = SamplingBenchConfig(
        modes=("fast",),
        clips=(args.clips,),
        presets=tuple(args.presets),
        servers=args.servers,
        repeats=args.repeats,
        samples=args.samples,
        t_max=args.t_max,
        checkpoint_dir=args.checkpoint,
        seed=args.seed,
    )
    started = time.perf_counter()
    rows: list[dict] = []
    plan_alphas: list[float | str] = [*args.alphas, AUTO]
    for preset in cfg.presets:
        async with simulator_pool(cfg, preset) as pool:
            policies = fixed_policies(cfg, pool)
            plan = [(policy, alpha) for policy in policies for alpha in plan_alphas]
            rng = np.random.default_rng(cfg.seed)
            for repeat in range(cfg.repeats):
                for j in rng.permutation(len(plan)):
                    policy, alpha = plan[j]
                    hidden, weights = policies[policy]
                    runner = runner_for(pool, hidden, weights, cfg.seed + repeat)
                    figures = await measure_row(
                        cfg, pool, runner, alpha, args.clips, cfg.seed + repeat, args.iterations, args.gap
                    )
                    row = {"preset": preset, "policy": policy, "clips": args.clips, "row": row_label(alpha)}
                    rows.append({**row, "repeat": repeat, **figures})
                    print(
                        f"{preset} {policy} {row['row']} repeat {repeat}: "
                        f"{figures['effective_throughput']:.0f} valid/s (limit {figures['limit']:.0f})",
                        flush=True,
                    )
    config = {**vars(args), "checkpoint": str(args.checkpoint) if args.checkpoint else None, "out": str(args.out)}
    config["t_max"] = cfg.t_max
    return {"config": config, "wall_clock_s": time.perf_counter() - started, "rows": rows, "summary": summarise(rows)}


def _floats(text: str) -> list[float]:
    values = [float(x) for x in text.split(",")]  # ValueError: argparse names the flag and the value
    if len(values) < 1 or not all(0 < v <= 1 for v in values):
        raise ValueError(text)
    return values


def _seconds(text: str) -> float:
    value = float(text)  # ValueError: argparse names the flag and the value
    if not 0 <= value <= 60:
        raise ValueError(text)
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for alpha.json and alpha.md")
    p.add_argument("--presets", type=names(PRESETS), default=list(PRESETS), help="cost presets, comma-separated")
    p.add_argument("--alphas", type=_floats, default=list(ALPHAS), help="the fixed alphas, in (0, 1]")
    p.add_argument("--clips", type=count, default=10, help="slots driven (the default run's 2 x 5)")
    p.add_argument("--servers", type=count, default=2)
    p.add_argument("--iterations", type=count, default=4, help="measured iterations a row")
    p.add_argument("--samples", type=count, default=2048, help="valid transitions a measured iteration")
    p.add_argument(
        "--gap",
        type=_seconds,
        default=1.5,
        help="seconds every row pauses between iterations, as for a learner update (auto decides meanwhile)",
    )
    p.add_argument("--t-max", type=count, default=200)
    p.add_argument("--repeats", type=count, default=2)
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--checkpoint", type=checkpoint, default=None, help="a fast train run's checkpoints: adds 'trained'")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    result = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "alpha.json").write_text(json.dumps(result, indent=1, default=float))
    text = report(result)
    (args.out / "alpha.md").write_text(text)
    print(text)
    return result


if __name__ == "__main__":
    main()
