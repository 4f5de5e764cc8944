"""`fast bench train`: return against wall-clock for several sampling modes and seeds.

Each (mode, seed) is one `fast train` run, started as a user starts it (a subprocess), with
the same workload, cost preset, clip count, iterations and PPO settings; runs go seed-major
(every mode once, then the next seed) so that the machine's drift hits the modes alike. The
return curve of a run is the mean return of its training episodes per iteration against the
wall-clock since its first iteration began, smoothed over `smooth` iterations; the time to
target is the first wall-clock at which that smoothed curve reaches `target_return`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fast.bench.sampling import MODES


@dataclass(frozen=True)
class TrainBenchConfig:
    modes: tuple[str, ...] = ("sc", "sgr", "ver", "fast")
    clips: int = 10
    seeds: int = 3
    servers: int = 2
    preset: str = "calibrated"
    iterations: int = 100
    samples_per_iteration: int = 1024
    update_epochs: int = 10
    target_return: float = 20.0
    smooth: int = 5
    eval_episodes_per_clip: int = 1

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown:
            raise ValueError(f"modes {unknown} are unknown; use some of {', '.join(MODES)}")
        if self.clips < 1 or self.seeds < 1 or self.servers < 1 or self.iterations < 1:
            raise ValueError(f"clips={self.clips}, seeds={self.seeds}, servers={self.servers}, "
                             f"iterations={self.iterations}: each must be >= 1")


def curve(metrics_path: Path, smooth: int) -> tuple[np.ndarray, np.ndarray]:
    """(wall-clock s since the first iteration began, smoothed mean training return) per iteration."""
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not lines:
        return np.zeros(0), np.zeros(0)
    start = lines[0]["time"] - lines[0]["iteration_time_s"]
    t = np.array([m["time"] - start for m in lines])
    r = np.array([m["episode_return_mean"] if isinstance(m.get("episode_return_mean"), (int, float)) else np.nan for m in lines])
    # Forward-fill iterations in which no episode ended, then a trailing moving average.
    for i in range(1, r.size):
        if not math.isfinite(r[i]):
            r[i] = r[i - 1]
    smoothed = np.array([np.nanmean(r[max(0, i - smooth + 1): i + 1]) for i in range(r.size)])
    return t, smoothed


def time_to_target(t: np.ndarray, smoothed: np.ndarray, target: float) -> float | None:
    reached = np.flatnonzero(smoothed >= target)
    return float(t[reached[0]]) if reached.size else None


def run(cfg: TrainBenchConfig, out_dir: Path, log=print) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_dir = out_dir / "runs"
    started = time.time()
    records = []
    slots = math.ceil(cfg.clips / cfg.servers)
    for seed in range(cfg.seeds):
        for mode in cfg.modes:
            name = f"{mode}-s{seed}"
            cmd = [sys.executable, "-m", "fast", "train", "--mode", mode, "--seed", str(seed), "--servers", str(cfg.servers),
                   "--slots", str(slots), "--cost-preset", cfg.preset, "--iterations", str(cfg.iterations),
                   "--samples-per-iteration", str(cfg.samples_per_iteration), "--update-epochs", str(cfg.update_epochs),
                   "--eval-episodes-per-clip", str(cfg.eval_episodes_per_clip), "--name", name, "--runs-dir", str(runs_dir)]
            log(f"fast train {name} ({len(records) + 1}/{cfg.seeds * len(cfg.modes)})")
            t0 = time.perf_counter()
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            wall = time.perf_counter() - t0
            if done.returncode != 0:
                raise RuntimeError(f"fast train {name} exited {done.returncode}: {done.stdout[-2000:]}")
            t, smoothed = curve(runs_dir / name / "metrics.jsonl", cfg.smooth)
            evaluation = json.loads((runs_dir / name / "eval.json").read_text()) if (runs_dir / name / "eval.json").exists() else {}
            records.append({
                "mode": mode, "seed": seed, "run_dir": str(runs_dir / name), "wall_clock_s": wall,
                "training_s": float(t[-1]) if t.size else float("nan"),
                "time_to_target_s": time_to_target(t, smoothed, cfg.target_return),
                "final_smoothed_return": float(smoothed[-1]) if smoothed.size else float("nan"),
                "eval_return": evaluation.get("trained", {}).get("summary", {}).get("return_mean"),
                "curve": {"t": t.tolist(), "return": smoothed.tolist()},
            })
            log(f"  {name}: {wall:.0f} s, final return {records[-1]['final_smoothed_return']:.1f}, "
                f"time to {cfg.target_return:g}: {records[-1]['time_to_target_s']}")
    summary = summarize(records, cfg)
    result = {"config": cfg.__dict__, "wall_clock_s": time.time() - started, "summary": summary, "runs": records}
    (out_dir / "train.json").write_text(json.dumps(result, indent=1))
    write_report(result, out_dir)
    return result


def summarize(records: list[dict], cfg: TrainBenchConfig) -> list[dict]:
    rows = []
    for mode in cfg.modes:
        runs = [r for r in records if r["mode"] == mode]
        reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
        rows.append({
            "mode": mode,
            "runs": len(runs),
            "reached_target": len(reached),
            "time_to_target_median_s": float(np.median(reached)) if len(reached) == len(runs) and reached else None,
            "training_s_median": float(np.median([r["training_s"] for r in runs])),
            "final_return_median": float(np.median([r["final_smoothed_return"] for r in runs])),
        })
    sc = next((r for r in rows if r["mode"] == "sc" and r["time_to_target_median_s"]), None)
    for row in rows:
        row["speedup_to_target_vs_sc"] = (sc["time_to_target_median_s"] / row["time_to_target_median_s"]
                                          if sc and row["time_to_target_median_s"] else None)
    return rows


def write_report(result: dict, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = result["config"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = {}
    for record in result["runs"]:
        color = colors.setdefault(record["mode"], f"C{len(colors)}")
        ax.plot(record["curve"]["t"], record["curve"]["return"], color=color, alpha=0.8,
                label=record["mode"] if record["seed"] == 0 else None)
    ax.axhline(cfg["target_return"], color="grey", linestyle="--", label=f"target {cfg['target_return']:g}")
    ax.set_xlabel("wall-clock (s)")
    ax.set_ylabel(f"training return (mean of {cfg['smooth']} iterations)")
    ax.set_title(f"{cfg['clips']} clips, preset {cfg['preset']} (emulated costs), {cfg['seeds']} seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "train_curves.png", dpi=90)
    plt.close(fig)

    def fmt(value, digits=1):
        return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:,.{digits}f}"

    lines = [
        "# Training benchmark",
        "",
        f"`fast train` per mode and seed: {cfg['clips']} clips over {cfg['servers']} servers, cost preset "
        f"`{cfg['preset']}` (emulated simulator costs), {cfg['iterations']} iterations of {cfg['samples_per_iteration']} "
        f"valid transitions, {cfg['update_epochs']} PPO epochs; target: smoothed training return {cfg['target_return']:g}. "
        f"Whole benchmark {result['wall_clock_s'] / 60:.1f} min.",
        "",
        "| mode | runs | reached target | time to target (median s) | speedup to target vs SC | training s (median) | final return (median) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["summary"]:
        lines.append(f"| {row['mode']} | {row['runs']} | {row['reached_target']} | {fmt(row['time_to_target_median_s'])} | "
                     f"{fmt(row['speedup_to_target_vs_sc'], 2)} | {fmt(row['training_s_median'])} | "
                     f"{fmt(row['final_return_median'], 2)} |")
    lines += ["", "![return against wall-clock](train_curves.png)", ""]
    (out_dir / "train.md").write_text("\n".join(lines))
