"""The sampling benchmark's markdown table and PNG charts, from its result rows alone."""

from __future__ import annotations

import math
from pathlib import Path

_CHARTS = (
    ("effective_throughput", "effective throughput (valid steps/s)"),
    ("speedup_vs_sc", "speedup vs SC (effective throughput)"),
    ("time_efficiency", "time efficiency"),
    ("episode_length_mean", "mean episode length (steps)"),
    ("validity", "validity eta"),
    ("global_resets_per_1k_valid", "global resets per 1k valid steps"),
)


def _fmt(value, digits: int) -> str:
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return f"{value:,.{digits}f}"


def _limit(row: dict) -> str:
    limit = row.get("limit")
    if not isinstance(limit, (int, float)) or not math.isfinite(limit):
        return "-"
    return f"{limit:,.0f} ({row.get('limit_binding', '')})"


def write_table(result: dict, path: Path) -> None:
    cfg = result["config"]
    external = result.get("simulators")
    servers = external.get("servers", []) if external else []
    env_id = servers[0]["env_id"] if servers else "?"
    where = (
        f"External simulators {', '.join(external.get('specs', []))} (env `{env_id}`, "
        f"{len(servers)} server(s), {sum(s['num_slots'] for s in servers)} slots), measured under their own costs "
        "(preset `external`: nothing emulated, nothing started or stopped by the benchmark), "
        if external
        else f"Workload `{cfg.get('env', 'takeover')}`, simulator costs emulated by the cost model on top of the "
        f"workload's own (presets: {', '.join(cfg['presets'])}; `off` means only the simulator's real costs; "
        f"docs/cost_model.md), {cfg['servers']} simulator server processes, "
    )
    lines = [
        "# Sampling benchmark",
        "",
        f"{where}{cfg['samples']} valid transitions per "
        f"measured iteration after a warm-up, medians of {cfg['repeats']} interleaved repeats, "
        f"FAST alpha={cfg['alpha']} t_max={cfg['t_max']}. "
        "`sc` steps one slot and is the reference for speedups. `gym-async` is Gymnasium's "
        "AsyncVectorEnv with per-environment autoreset on the same workload, clips, costs and policy. "
        f"Whole run: {result['wall_clock_s'] / 60:.1f} min. Metrics: docs/metrics.md.",
        "",
        "The limit is the throughput the simulators' costs allow the pattern each row measured (its eta, "
        "resets and Reset calls per valid transition, map cache hit rate, the step latency the servers "
        "reported): the lowest of its bounds, named in brackets (step, load, engine, slot; "
        "jobs/bench/limits.py, docs/metrics.md). Share of best limit sets the row against the highest limit "
        "of any mode at the same clips, preset and policy.",
        "",
    ]
    rows = result["rows"]
    for preset in dict.fromkeys(r["preset"] for r in rows):
        for policy in dict.fromkeys(r["policy"] for r in rows if r["preset"] == preset):
            lines += [
                f"## preset `{preset}`, policy `{policy}`",
                "",
                "| mode | clips | sampling s | speedup vs SC | raw steps/s | eta | time efficiency | effective steps/s "
                "| limit steps/s (bound) | share of limit | share of best limit | map cache hits (maps dealt) "
                "| ep. length in window (vs SC) | global resets / 1k valid |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for r in rows:
                if r["preset"] != preset or r["policy"] != policy:
                    continue
                lines.append(
                    f"| {r['mode']} | {r['clips']} | {_fmt(r['sampling_time_s'], 2)} | "
                    f"{_fmt(r['speedup_vs_sc'], 2)}x | "
                    f"{_fmt(r['raw_throughput'], 0)} | {_fmt(r['validity'], 3)} | {_fmt(r['time_efficiency'], 4)} | "
                    f"{_fmt(r['effective_throughput'], 0)} | {_limit(r)} | {_fmt(r.get('limit_share'), 2)} | "
                    f"{_fmt(r.get('best_limit_share'), 2)} | {_fmt(r.get('cache_hit_rate'), 2)} "
                    f"({_fmt(r.get('distinct_maps'), 0)}) | "
                    f"{_fmt(r['episode_length_mean'], 1)} "
                    f"({_fmt(r['episode_length_vs_sc'], 2)}) | {_fmt(r['global_resets_per_1k_valid'], 2)} |"
                )
            lines.append("")
    lines += _length_section(result)
    path.write_text("\n".join(lines))


def _length_section(result: dict) -> list[str]:
    rows = result.get("episode_length") or []
    if not rows:
        return [
            "The timed window's episode lengths above are biased short for multi-slot modes; "
            "this run skipped the steady-state length measurement (length_samples 0).",
            "",
        ]
    cfg = result["config"]
    lines = [
        "## Episode length in steady state",
        "",
        "The timed window above starts right after every slot began its first episode together and is short, so "
        "only short episodes end inside it: its lengths are biased short for every multi-slot mode. Here each "
        f"configuration first runs {cfg['length_warmup_steps']} steps per slot, then counts every episode ending in "
        f"the next {cfg['length_samples']} valid transitions ("
        + ("on the external simulators, " if result.get("simulators") else "no emulated costs: ")
        + "lengths do not depend on costs; "
        "jobs/bench/episode_length.py). Episodes cut by a global truncation (sgr, fast) count with the length "
        "they reached.",
        "",
    ]
    for policy in dict.fromkeys(r["policy"] for r in rows):
        lines += [
            f"### policy `{policy}`",
            "",
            "| mode | clips | episodes | mean length | vs SC | p10 / p50 / p90 | cut by truncation "
            "| slot resets / 1k valid |",
            "|---|---:|---:|---:|---:|---|---:|---:|",
        ]
        for r in rows:
            if r["policy"] != policy:
                continue
            percentiles = " / ".join(_fmt(q, 0) for q in r["p10_p50_p90"]) or "-"
            lines.append(
                f"| {r['mode']} | {r['clips']} | {r['episodes']} | {_fmt(r['mean'], 1)} | "
                f"{_fmt(r['mean_vs_sc'], 2)} | {percentiles} | {_fmt(100 * r['cut_share'], 0)}% | "
                f"{_fmt(r.get('slot_resets_per_1k_valid'), 2)} |"
            )
        lines.append("")
    return lines


def write_charts(rows: list[dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for preset in dict.fromkeys(r["preset"] for r in rows):
        for policy in dict.fromkeys(r["policy"] for r in rows if r["preset"] == preset):
            fig, axes = plt.subplots(2, 3, figsize=(13, 7))
            subset = [r for r in rows if r["preset"] == preset and r["policy"] == policy]
            for ax, (key, label) in zip(axes.flat, _CHARTS):
                for mode in dict.fromkeys(r["mode"] for r in subset):
                    points = sorted((r["clips"], r[key]) for r in subset if r["mode"] == mode)
                    if mode.split("+")[0] == "sc":  # one slot: a horizontal reference line
                        ax.axhline(points[0][1], color="grey", linestyle="--", label="sc (1 clip)")
                        continue
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=mode)
                ax.set_xlabel("clips")
                ax.set_title(label, fontsize=10)
                ax.grid(alpha=0.3)
            axes.flat[0].legend(fontsize=8)
            fig.suptitle(f"sampling modes, preset {preset}, policy {policy} (emulated simulator costs)")
            fig.tight_layout()
            path = out_dir / f"sampling_{preset}_{policy}.png"
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written.append(path)
    return written
