"""`fast bench train`: held-out return against wall-clock for several sampling modes and seeds.

Each (mode, seed) is one `fast train` run, started as a user starts it (a subprocess), with
the same workload, cost preset, clip count, iterations and PPO settings; runs go seed-major
(every mode once, then the next seed) so that the machine's drift hits the modes alike.

The learner keeps a checkpoint every `checkpoint_every` versions. After each run, before the
next starts, every checkpoint plays the same held-out episodes on simulators of the
benchmark's own (jobs/bench/learning_curve.py), which gives the run's learning curve: held-out
return against the wall-clock and the valid transitions at which that version existed. The
time to target is the first point whose held-out return reaches `target_return`. Then all
checkpoints but the newest are deleted, so a run directory stays a `fast compare` input.

The training-episode return (smoothed over `smooth` iterations) is kept in train.json beside
it, but is not compared across modes: global truncation cuts the long episodes of FAST and SGR.

With `simulators` (servers that run already, jobs/external.py) every run trains on them
(`fast train --simulators`) and the checkpoints are evaluated on them too, between runs; nothing
is started or stopped there, and every call carries the environment's token.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from broker.dealer import HOLDOUT_EVERY
from fast.lifecycle import PARENT_ENV
from fast.rpc import Credentials
from jobs.bench.config import FEATURES, TrainBenchConfig
from jobs.bench.learning_curve import evaluate_checkpoints, time_to_target
from jobs.bench.limits import Costs, costs_from_describe, least_sampling
from jobs.external import check_simulators
from jobs.simulators import Workload, job_simulators
from jobs.train.config import TrainConfig
from learner.checkpoint import prune_checkpoints
from sim_server.cost_model import PRESETS


def _metrics_lines(metrics_path: Path) -> list[dict]:
    return [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]


def training_curve(metrics_path: Path, smooth: int) -> tuple[np.ndarray, np.ndarray]:
    """(wall-clock s since the first iteration began, smoothed mean training return) per iteration."""
    lines = _metrics_lines(metrics_path)
    if not lines:
        return np.zeros(0), np.zeros(0)
    start = lines[0]["time"] - lines[0]["iteration_time_s"]
    t = np.array([m["time"] - start for m in lines])
    r = np.array(
        [m["episode_return_mean"] if isinstance(m.get("episode_return_mean"), (int, float)) else np.nan for m in lines]
    )
    # Forward-fill iterations in which no episode ended, then a trailing moving average.
    for i in range(1, r.size):
        if not math.isfinite(r[i]):
            r[i] = r[i - 1]
    smoothed = np.array([np.nanmean(r[max(0, i - smooth + 1) : i + 1]) for i in range(r.size)])
    return t, smoothed


def sampling_against_limit(metrics_path: Path, costs: Costs, servers: int) -> dict:
    """A run's sampling seconds beside the least its simulators' costs allow (limits.py `least_sampling`)."""
    return least_sampling(_metrics_lines(metrics_path), costs, servers)


def resumable_records(cfg: TrainBenchConfig, out_dir: Path) -> tuple[list[dict], float]:
    """The runs a stopped benchmark in `out_dir` finished, and the wall-clock it had spent.

    Only a benchmark of the same settings goes on: a record made with other modes, iterations or
    presets would be compared with runs it does not match. No train.json: nothing to keep."""
    path = out_dir / "train.json"
    if not path.is_file():
        return [], 0.0
    try:
        stored = json.loads(path.read_text())
        stored_config, records, wall = stored["config"], list(stored["runs"]), float(stored["wall_clock_s"])
        keys = [(r["mode"], r["seed"]) for r in records]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{path} is not the train.json of a `fast bench train` ({type(exc).__name__}); "
            "pass another --out, or leave --resume out to start over there"
        ) from None
    ours = json.loads(json.dumps(cfg.__dict__))
    differ = sorted(k for k in set(ours) | set(stored_config) if ours.get(k) != stored_config.get(k))
    if differ:
        raise ValueError(
            f"--resume: {path} was made with other settings ({', '.join(differ)}); pass the options "
            "the stopped benchmark had, or another --out"
        )
    if len(set(keys)) != len(keys):
        raise ValueError(f"--resume: {path} holds a run twice; pass another --out")
    return records, wall


def run(cfg: TrainBenchConfig, out_dir: Path, log=print, *, resume: bool = False) -> dict:
    """Every (mode, seed) run of `cfg`, then the report. With `resume`, the runs that `out_dir`'s
    train.json holds already (same settings) are kept and only the others run."""
    external = check_simulators(cfg.simulators) if cfg.simulators else None  # before any run starts
    if external is not None:
        log(f"on {external.describe()}")
    records, spent = resumable_records(cfg, out_dir) if resume else ([], 0.0)
    if records:
        log(f"resuming: {len(records)} of {cfg.seeds * len(cfg.modes)} runs kept from {out_dir / 'train.json'}")
    done = {(r["mode"], r["seed"]) for r in records}
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_dir = out_dir / "runs"
    started = time.time() - spent
    slots = math.ceil(cfg.clips / cfg.servers) if external is None else 0
    note = ""
    if external is not None:
        from jobs.train.evaluation import holdout_note

        note = holdout_note(external.num_clips, HOLDOUT_EVERY)
        if note:
            log(f"note: no held-out learning curve: {note}")
    # The held-out evaluations' own simulators: the training workload, no emulated cost (what is
    # measured there is the policy, not the clock). Idle while a training run goes. A token of their
    # own; every `fast train` makes one per run. External simulators evaluate too, between runs.
    workload = Workload("takeover", (), HOLDOUT_EVERY)
    limit_costs = _costs_and_servers(cfg, external)
    with job_simulators(workload, cfg.servers or 0, slots, external=external) as evaluators:
        for seed in range(cfg.seeds):
            for mode in cfg.modes:
                if (mode, seed) in done:
                    continue
                # A run the stopped benchmark left half-done starts over (fast train refuses a used name).
                shutil.rmtree(runs_dir / _run_name(mode, seed), ignore_errors=True)
                records.append(
                    _train_and_evaluate(
                        cfg,
                        mode,
                        seed,
                        runs_dir,
                        slots,
                        evaluators.addresses,
                        evaluators.credentials,
                        log,
                        f"{len(records) + 1}/{cfg.seeds * len(cfg.modes)}",
                        note,
                        limit_costs=limit_costs,
                    )
                )
                # After every run, so that a benchmark stopped hours in keeps what it measured
                # (`--report-only` reports it); `finished` says whether every run is in.
                result = _result(cfg, external, note, started, records, finished=False)
                (out_dir / "train.json").write_text(json.dumps(result, indent=1))
    result = _result(cfg, external, note, started, records, finished=True)
    (out_dir / "train.json").write_text(json.dumps(result, indent=1))
    write_report(result, out_dir)
    return result


def _result(cfg: TrainBenchConfig, external, note: str, started: float, records: list[dict], *, finished: bool) -> dict:
    return {
        "config": cfg.__dict__,
        **({"simulators": external.record(), "evaluation_note": note} if external is not None else {}),
        "finished": finished,
        "wall_clock_s": time.time() - started,
        "summary": summarize(records, cfg),
        "runs": records,
    }


def rewrite_report(out_dir: Path, target_return: float | None = None) -> dict:
    """Recompute the summary of an existing benchmark's train.json and rewrite it, train.md and the PNG.

    With `target_return`, every run's time to target is recomputed from its stored held-out
    curve for that target, and the target is stored with the result; without, the stored one holds.
    """
    path = Path(out_dir) / "train.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist; pass the --out of a finished `fast bench train`")
    try:
        result = json.loads(path.read_text())
        if target_return is not None:
            result["config"]["target_return"] = target_return
        cfg = TrainBenchConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in result["config"].items()})
        for record in result["runs"]:
            reached = time_to_target(record["eval_curve"], cfg.target_return)
            record["time_to_target_s"], record["transitions_to_target"] = reached if reached else (None, None)
        result["summary"] = summarize(result["runs"], cfg)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"{path} is not the train.json of a finished `fast bench train` "
            f"({type(exc).__name__}: {exc}); rerun the benchmark"
        ) from None
    path.write_text(json.dumps(result, indent=1))
    write_report(result, Path(out_dir))
    return result


def _run_name(mode: str, seed: int) -> str:
    return f"{mode.replace('+', '-')}-s{seed}"


def _train_and_evaluate(
    cfg: TrainBenchConfig,
    mode: str,
    seed: int,
    runs_dir: Path,
    slots: int,
    evaluators: list[str],
    credentials: Credentials,
    log,
    progress: str,
    note: str = "",
    *,
    limit_costs: tuple[Costs, int],
) -> dict:
    name = _run_name(mode, seed)
    run_dir = runs_dir / name
    base, *features = mode.split("+")
    # FAST_PARENT_PID: the run stops (gracefully) when this benchmark does, however it ends.
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    simulators = (
        {"simulators": list(cfg.simulators)}
        if cfg.simulators
        else {"servers": cfg.servers, "slots": slots, "cost_preset": cfg.preset}
    )
    run = TrainConfig(
        mode=base,
        seed=seed,
        **simulators,
        iterations=cfg.iterations,
        samples_per_iteration=cfg.samples_per_iteration,
        update_epochs=cfg.update_epochs,
        checkpoint_every=cfg.checkpoint_every,
        keep_checkpoints=cfg.iterations + 2,
        eval_episodes_per_clip=0,
        name=name,
        runs_dir=runs_dir,
        **dict(FEATURES[f] for f in features),
    )
    cmd = [sys.executable, "-m", "fast", "train", *run.to_argv()]
    log(f"fast train {name} ({progress})")
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"fast train {name} exited {done.returncode}: {done.stdout[-2000:]}")
    points = (
        []
        if note  # no held-out clip: no curve
        else asyncio.run(
            evaluate_checkpoints(
                evaluators,
                run_dir,
                holdout_every=HOLDOUT_EVERY,
                episodes_per_clip=cfg.eval_episodes_per_clip,
                seed=cfg.eval_seed,
                credentials=credentials,
            )
        )
    )
    prune_checkpoints(run_dir / "checkpoints", keep=1)
    t, smoothed = training_curve(run_dir / "metrics.jsonl", cfg.smooth)
    limit = sampling_against_limit(run_dir / "metrics.jsonl", *limit_costs)
    reached = time_to_target(points, cfg.target_return)
    record = {
        "mode": mode,
        "seed": seed,
        "run_dir": str(run_dir),
        "wall_clock_s": wall,
        "training_s": float(t[-1]) if t.size else float("nan"),
        "time_to_target_s": reached[0] if reached else None,
        "transitions_to_target": reached[1] if reached else None,
        "initial_return": points[0]["return_mean"] if points else None,
        "final_return": points[-1]["return_mean"] if points else None,
        "eval_curve": points,
        "training_curve": {"t": t.tolist(), "return": smoothed.tolist()},
        "iterations_per_mode": iterations_per_mode(run_dir / "metrics.jsonl"),
        "sampling_limit": limit,
    }
    curve = (
        f"held-out return {record['initial_return']:.1f} -> {record['final_return']:.1f}"
        if points
        else "no held-out curve"
    )
    log(f"  {name}: {wall:.0f} s, {curve}, time to {cfg.target_return:g}: {record['time_to_target_s']}")
    return record


def _costs_and_servers(cfg: TrainBenchConfig, external) -> tuple[Costs, int]:
    """The costs the runs' simulators emulate (their preset's; none known of external ones: the
    step bound alone, from the latency they reported) and how many servers the slots spread over."""
    if external is not None:
        return costs_from_describe(None), len(external.servers)
    return costs_from_describe(PRESETS[cfg.preset]), cfg.servers


def iterations_per_mode(metrics: Path) -> dict[str, int]:
    """How many of the run's iterations sampled in each mode (one for a fixed mode; `auto` probes and switches)."""
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    return dict(Counter(json.loads(line).get("mode", "?") for line in lines if line.strip()))


def _median_is_exact(runs: list[dict]) -> bool:
    """Whether the runs' median time to target is known despite the censored runs (summarize)."""
    if not runs:
        return False
    bounds = [r["time_to_target_s"] if r["time_to_target_s"] is not None else r["training_s"] for r in runs]
    unbounded = [r["time_to_target_s"] if r["time_to_target_s"] is not None else math.inf for r in runs]
    return float(np.median(bounds)) == float(np.median(unbounded))


def summarize(records: list[dict], cfg: TrainBenchConfig) -> list[dict]:
    """Per mode: medians over seeds, and the speedups against SC (ratios of those medians).

    A run that never reached the target is censored at its training time: its time to target
    is longer than that. The median of the times with censored runs at their training time is
    then a lower bound of the mode's median ("> x"). It is exact when the censored runs cannot
    move it: the median is the same with them at their training time and at infinity (3 seeds,
    times 148 s, 191 s and one censored at 279 s: the median is 191 s whatever that run's
    time would have been). The speedup against SC is exact when both medians are, a lower
    bound ("at least") when only SC's is censored, and unknown when the mode's is.
    """

    def median(values):
        values = [v for v in values if v is not None]
        return float(np.median(values)) if values else None

    rows = []
    for mode in cfg.modes:
        runs = [r for r in records if r["mode"] == mode]
        reached = [r for r in runs if r["time_to_target_s"] is not None]
        exact = _median_is_exact(runs)  # a median over only the runs that got there would flatter the mode
        final = [r["eval_curve"][-1] for r in runs if r["eval_curve"]]
        rows.append(
            {
                "mode": mode,
                "runs": len(runs),
                "reached_target": len(reached),
                "time_to_target_median_s": median(
                    [r["time_to_target_s"] if r["time_to_target_s"] is not None else r["training_s"] for r in runs]
                ),
                "time_to_target_exact": exact,
                "transitions_to_target_median": (
                    median([r["transitions_to_target"] for r in runs]) if len(reached) == len(runs) else None
                ),
                "training_s_median": median([r["training_s"] for r in runs]),
                "initial_return_median": median([r["initial_return"] for r in runs]),
                "final_return_median": median([r["final_return"] for r in runs]),
                "final_collided_median": median([p.get("collided_rate") for p in final]),
                "final_off_road_median": median([p.get("off_road_rate") for p in final]),
                "iterations_per_mode": _summed([r.get("iterations_per_mode", {}) for r in runs]),
                **_limit_summary([r.get("sampling_limit") for r in runs]),
            }
        )
    sc = next((row for row in rows if row["mode"] == "sc"), None)
    for row in rows:
        row["speedup_training_vs_sc"] = (
            sc["training_s_median"] / row["training_s_median"]
            if sc and sc["training_s_median"] and row["training_s_median"]
            else None
        )
        known = (
            sc is not None
            and row["time_to_target_exact"]
            and sc["time_to_target_median_s"]
            and row["time_to_target_median_s"]
        )
        row["speedup_to_target_vs_sc"] = (
            sc["time_to_target_median_s"] / row["time_to_target_median_s"] if known else None
        )
        row["speedup_to_target_is_lower_bound"] = bool(known and not sc["time_to_target_exact"])
    return rows


def _limit_summary(limits: list[dict | None]) -> dict:
    """Medians over a mode's runs of their sampling seconds and of the least their simulators allow
    (`sampling_against_limit`), over the runs that have both; the bound that binds in most of them."""
    known = [x for x in limits if x and x["limited_iterations"]]
    if not known:
        return {"sampling_s_median": None, "limit_sampling_s_median": None, "limit_binding": None}
    return {
        "sampling_s_median": float(np.median([x["sampling_s"] for x in known])),
        "limit_sampling_s_median": float(np.median([x["limit_sampling_s"] for x in known])),
        "limit_binding": Counter(x["limit_binding"] for x in known).most_common(1)[0][0],
    }


def _summed(counts: list[dict[str, int]]) -> dict[str, int]:
    return dict(sum((Counter(count) for count in counts), Counter()))


def _limit_cells(row: dict, fmt) -> str:
    """A summary row's sampling seconds, the least its simulators allow (with the bound), and their ratio."""
    sampling, least = row.get("sampling_s_median"), row.get("limit_sampling_s_median")
    if not sampling or not least:
        return "- | - | -"
    return f"{fmt(sampling)} | {fmt(least)} ({row['limit_binding']}) | {fmt(least / sampling, 2)}"


def mean_curve(records: list[dict]) -> dict[str, list[float]]:
    """The seeds' mean curve of one mode at the versions every run evaluated."""
    versions = (
        sorted(set.intersection(*(set(p["version"] for p in r["eval_curve"]) for r in records))) if records else []
    )
    out = {"version": versions, "time_s": [], "transitions": [], "return_mean": []}
    for version in versions:
        points = [next(p for p in r["eval_curve"] if p["version"] == version) for r in records]
        for key in ("time_s", "transitions", "return_mean"):
            out[key].append(float(np.mean([p[key] for p in points])))
    return out


def write_report(result: dict, out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = result["config"]
    external = result.get("simulators")
    if external:
        servers = external.get("servers", [])
        slots = sum(s["num_slots"] for s in servers)
        where = (
            f"external simulators {', '.join(external.get('specs', []))} ({len(servers)} server(s), {slots} slots, "
            "their own costs; not started or stopped by the benchmark)"
        )
        title = f"external simulators, {slots} slots"
    else:
        costs = (
            "no emulated simulator cost: the workload's own compute and the transport (local step sockets by default)"
            if cfg["preset"] == "off"
            else "simulator costs **emulated**, docs/cost_model.md"
        )
        where = f"{cfg['clips']} clips over {cfg['servers']} servers, cost preset `{cfg['preset']}` ({costs})"
        title = f"{cfg['clips']} clips, cost preset {cfg['preset']}"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for i, mode in enumerate(cfg["modes"]):
        records = [r for r in result["runs"] if r["mode"] == mode]
        for ax, x in zip(axes, ("time_s", "transitions")):
            for record in records:
                ax.plot(
                    [p[x] for p in record["eval_curve"]],
                    [p["return_mean"] for p in record["eval_curve"]],
                    color=f"C{i}",
                    alpha=0.3,
                    linewidth=0.8,
                )
            mean = mean_curve(records)
            ax.plot(mean[x], mean["return_mean"], color=f"C{i}", linewidth=2, marker="o", markersize=3, label=mode)
    for ax, label in zip(axes, ("wall-clock since training began (s)", "valid transitions sampled")):
        ax.axhline(
            cfg["target_return"], color="grey", linestyle="--", linewidth=1, label=f"target {cfg['target_return']:g}"
        )
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"held-out return ({cfg['eval_episodes_per_clip']} episodes per held-out clip)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title}, {cfg['seeds']} seeds: thin lines are seeds, thick their mean")
    fig.tight_layout()
    fig.savefig(out_dir / "train_curves.png", dpi=90)
    plt.close(fig)

    def fmt(value, digits=1):
        return (
            "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:,.{digits}f}"
        )

    lines = [
        "# Training benchmark",
        "",
        f"`fast train` per mode and seed: {where}, {cfg['iterations']} iterations of "
        f"{cfg['samples_per_iteration']} valid transitions, {cfg['update_epochs']} PPO epochs, "
        f"seeds 0-{cfg['seeds'] - 1}. "
        f"Every {cfg['checkpoint_every']}th policy version played deterministically on the same held-out episodes "
        f"({cfg['eval_episodes_per_clip']} per held-out clip, evaluation seed {cfg['eval_seed']}), "
        "after the run, off its clock. "
        f"Target: held-out return {cfg['target_return']:g}. Whole benchmark {result['wall_clock_s'] / 60:.1f} min.",
        "",
        *([f"**No held-out learning curve**: {note}.", ""] if (note := result.get("evaluation_note")) else []),
        "| mode | runs | reached target | time to target (median s) | speedup to target vs SC "
        "| transitions to target (median) | training s (median) | training speedup vs SC "
        "| held-out return: initial -> final (median) | final collided | final off-road "
        "| sampling s (median) | sampling s the costs allow, at least (bound) | share of the limit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in result["summary"]:
        time_to_target = ("" if row["time_to_target_exact"] else "> ") + fmt(row["time_to_target_median_s"])
        speedup = ("at least " if row["speedup_to_target_is_lower_bound"] else "") + fmt(
            row["speedup_to_target_vs_sc"], 2
        )
        lines.append(
            f"| {row['mode']} | {row['runs']} | {row['reached_target']} | {time_to_target} | "
            f"{speedup} | {fmt(row['transitions_to_target_median'], 0)} | "
            f"{fmt(row['training_s_median'])} | {fmt(row['speedup_training_vs_sc'], 2)} | "
            f"{fmt(row['initial_return_median'])} -> {fmt(row['final_return_median'])} | "
            f"{fmt(row['final_collided_median'], 2)} | {fmt(row['final_off_road_median'], 2)} | "
            f"{_limit_cells(row, fmt)} |"
        )
    chose = [row for row in result["summary"] if row["mode"].split("+")[0] == "auto"]
    for row in chose:  # what `--mode auto` sampled in, over its seeds
        sampled = sorted(row.get("iterations_per_mode", {}).items(), key=lambda kv: -kv[1])
        counts = ", ".join(f"{m} {n}" for m, n in sampled)
        lines += ["", f"`{row['mode']}` sampled its iterations in: {counts} (over its {row['runs']} runs)."]
    lines += [
        "",
        "Time to target is the wall-clock (since the run's first iteration began, updates included) of the first "
        "evaluated version whose held-out return reaches the target. A run that never reached it counts at its "
        'training time, so a median over such runs is a lower bound ("> x"), and so is a speedup against an SC '
        'whose runs did not all get there ("at least"). Training s is the whole run of the same number of '
        "iterations and valid transitions.",
        "",
        "Sampling s is the run's sampling alone (the learner's updates apart). Beside it, the least sampling "
        "time the simulators' costs allow the pattern each iteration sampled (its eta, resets and Reset calls "
        "per valid transition, map cache hit rate, the step latency the servers reported): the sum over "
        "iterations of valid transitions / that iteration's limit, the bound that binds in most runs in "
        "brackets (step, load, engine, step+engine, slot; jobs/bench/limits.py, docs/metrics.md). A share of "
        "the limit well below 1 is time the framework spends beyond the simulators' own; a mode that pads "
        "or resets more has a lower limit of its own"
        + (
            ". External simulators' costs are not known here: their limit is the step bound alone." if external else "."
        ),
        "",
        "![held-out return against wall-clock and against transitions](train_curves.png)",
        "",
    ]
    (out_dir / "train.md").write_text("\n".join(lines))
