"""report.md and its plots, from the files of a run directory alone (so `fast report` can redo it).

Inputs: metrics.jsonl (one line per iteration, broker/run.py), and when present eval.json
(jobs/train/evaluation.py), outcome.json (jobs/train/orchestrate.py) and config.yaml.
Outputs: report.md, return.png, throughput.png, episode_lengths.png.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from jobs.bench.limits import costs_from_describe, least_sampling
from sim_server.cost_model import PRESETS

PLOTS = ("return.png", "throughput.png", "episode_lengths.png")
SMOOTHING = 5  # iterations: a single iteration's return is noisy (few episodes end in it)


class ReportError(ValueError):
    """The run directory lacks what a report needs; the message names the file."""


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ReportError(
            f"{path} does not exist; give the directory of a run (runs/<name>) that did at least one iteration"
        )
    raw = path.read_text().splitlines()
    lines = []
    for number, line in enumerate(raw, start=1):
        if not line.strip():
            continue
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError as exc:
            # The last line can be cut short by a killed broker; earlier ones cannot.
            if number == len(raw):
                break
            raise ReportError(f"{path}:{number} is not JSON ({exc.msg})") from None
    if not lines:
        raise ReportError(f"{path} holds no iteration yet")
    return lines


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def wall_clock(metrics: list[dict]) -> list[float]:
    """Seconds since the first iteration started, at the end of each iteration."""
    start = metrics[0]["time"] - metrics[0].get("iteration_time_s", 0.0)
    return [m["time"] - start for m in metrics]


def rolling_mean(values: list[float], window: int) -> list[float]:
    """Mean of the finite values among the last `window` (an iteration without ended episodes has NaN)."""
    out = []
    for i in range(len(values)):
        recent = [v for v in values[max(0, i + 1 - window) : i + 1] if math.isfinite(v)]
        out.append(sum(recent) / len(recent) if recent else float("nan"))
    return out


def write_plots(run_dir: Path, metrics: list[dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on a server
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    t = wall_clock(metrics)
    mode = metrics[0].get("mode", "")
    paths = []

    fig, ax = plt.subplots(figsize=(6, 3.5))
    returns = [_num(m.get("episode_return_mean")) for m in metrics]
    ax.plot(t, returns, marker=".", alpha=0.5, label=f"{mode}: mean return of the iteration's episodes")
    ax.plot(t, rolling_mean(returns, SMOOTHING), label=f"mean of the last {SMOOTHING} iterations")
    ax.set_xlabel("wall-clock (s)")
    ax.set_ylabel("episode return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, run_dir / "return.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(t, [_num(m.get("effective_throughput")) for m in metrics], marker=".", label="effective (valid steps / s)")
    ax.plot(t, [_num(m.get("raw_throughput")) for m in metrics], linestyle="--", label="raw (all steps / s)")
    ax.set_xlabel("wall-clock (s)")
    ax.set_ylabel("sampling throughput (steps / s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, run_dir / "throughput.png"))

    lengths = [n for m in metrics for n in m.get("episode_lengths") or []]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if lengths:
        ax.hist(lengths, bins=min(50, max(5, len(set(lengths)))))
    ax.set_xlabel("episode length (steps), every iteration")
    ax.set_ylabel("episodes")
    ax.set_title(f"{len(lengths)} episodes", fontsize=9)
    paths.append(_save(fig, run_dir / "episode_lengths.png"))
    plt.close("all")
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def write_report(run_dir: Path) -> Path:
    """Write report.md and the plots into run_dir; returns the report's path."""
    run_dir = Path(run_dir)
    metrics = read_metrics(run_dir)
    write_plots(run_dir, metrics)
    evaluation = _read_json(run_dir / "eval.json")
    outcome = _read_json(run_dir / "outcome.json")
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        config = {}
    train = config.get("train", {}) if isinstance(config, dict) else {}
    external = config.get("simulators") if isinstance(config, dict) else None
    skipped = evaluation.get("skipped") if evaluation else None
    if skipped:
        evaluation = None
    first, last = metrics[0], metrics[-1]
    t = wall_clock(metrics)

    rows = [
        ("mode", str(last.get("mode", train.get("mode", "?")))),
        ("wall-clock, training iterations", f"{t[-1]:.1f} s"),
    ]
    if isinstance(external, dict):
        rows.insert(1, ("simulators", _external(external)))
    if outcome:
        rows.append(
            (
                "wall-clock, whole run (start-up, evaluation, shutdown)",
                f"{outcome.get('wall_clock_s', float('nan')):.1f} s",
            )
        )
        rows.append(("outcome", f"{outcome.get('outcome')} (exit code {outcome.get('exit_code')})"))
    planned = train.get("iterations")
    rows += [
        ("iterations", f"{len(metrics)}" + (f" of {planned}" if planned else "")),
        ("valid transitions", f"{sum(m.get('valid_transitions', 0) for m in metrics):,}"),
        (
            "return, first -> last iteration (training episodes)",
            f"{_fmt(first.get('episode_return_mean'))} -> {_fmt(last.get('episode_return_mean'))}",
        ),
        (
            f"return, mean of the first {SMOOTHING} -> last {SMOOTHING} iterations",
            f"{_fmt(_mean_return(metrics[:SMOOTHING]))} -> {_fmt(_mean_return(metrics[-SMOOTHING:]))}",
        ),
    ]
    if evaluation:
        trained, random = evaluation["trained"]["summary"], evaluation["random"]["summary"]
        initial = evaluation.get("initial", {}).get("summary", {})
        rows += [
            ("eval return, trained vs initial vs random", _three(trained, initial, random, "return_mean")),
            ("eval collision rate, trained vs initial vs random", _three(trained, initial, random, "collided_rate")),
            ("eval off-road rate, trained vs initial vs random", _three(trained, initial, random, "off_road_rate")),
            ("eval episode length, trained vs initial vs random", _three(trained, initial, random, "length_mean", 1)),
        ]
    if skipped:
        rows.append(("evaluation", f"skipped: {skipped}"))
    rows += [
        ("validity eta, last iteration", _fmt(last.get("validity"), 3)),
        ("time efficiency, last iteration", _fmt(last.get("time_efficiency"), 4)),
        ("effective throughput, last iteration", f"{_fmt(last.get('effective_throughput'), 0)} valid steps/s"),
    ]
    limit = _sampling_limit(metrics, train, external)
    if limit is not None:
        rows.append(limit)

    name = train.get("name") or run_dir.name
    lines = [f"# Training run `{name}`", "", "| | |", "| --- | --- |"]
    lines += [f"| {label} | {value} |" for label, value in rows]
    lines += [
        "",
        "![return against wall-clock](return.png)",
        "",
        "![effective throughput against wall-clock](throughput.png)",
        "",
        "![episode length histogram](episode_lengths.png)",
        "",
    ]
    if evaluation:
        lines += _evaluation_section(evaluation)
    if train:
        lines += ["## Settings", "", "```yaml", yaml.safe_dump(train, sort_keys=False).rstrip(), "```", ""]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def _sampling_limit(metrics: list[dict], train: dict, external) -> tuple[str, str] | None:
    """The run's sampling seconds against the least its simulators' costs allow the patterns it
    sampled (jobs/bench/limits.py `least_sampling`): the preset's costs, or for external simulators,
    whose costs are not known, the step bound alone. None without `pool_calls` or known servers."""
    if isinstance(external, dict):
        costs, servers, whose = costs_from_describe(None), len(external.get("servers") or ()), "step bound alone"
    elif train.get("cost_preset") in PRESETS and train.get("servers"):
        costs, servers, whose = costs_from_describe(PRESETS[train["cost_preset"]]), int(train["servers"]), ""
    else:
        return None
    least = least_sampling(metrics, costs, servers) if servers else None
    if not least or not least["limited_iterations"] or least["sampling_s"] <= 0:
        return None
    share = least["limit_sampling_s"] / least["sampling_s"]
    bound = least["limit_binding"] + (f", {whose}" if whose else "")
    return (
        "sampling against the limit the simulators' costs allow",
        f"{least['sampling_s']:.1f} s, at least {least['limit_sampling_s']:.1f} s ({bound}): {share:.2f} of the limit",
    )


def _external(record: dict) -> str:
    servers = record.get("servers") or []
    slots = sum(s.get("num_slots", 0) for s in servers)
    first = servers[0] if servers else {}
    return (
        f"external: {', '.join(record.get('specs', []))} ({len(servers)} server(s), {slots} slots, "
        f"env {first.get('env_id', '?')}, {first.get('num_clips', '?')} clips; not started or stopped by the run)"
    )


def _three(trained: dict, initial: dict, random: dict, key: str, digits: int = 2) -> str:
    return " vs ".join(_fmt(d.get(key), digits) for d in (trained, initial, random))


def _evaluation_section(evaluation: dict) -> list[str]:
    trained, random = evaluation["trained"]["summary"], evaluation["random"]["summary"]
    initial = evaluation.get("initial", {}).get("summary", {})
    lines = [
        "## Evaluation on held-out clips",
        "",
        f"Policy version {evaluation['policy_version']} (from {evaluation['policy_source']}), "
        "acting deterministically, "
        f"against the initial policy (version 0, acting deterministically) and uniformly random actions; "
        f"{len(evaluation['clips'])} held-out clips x {evaluation['episodes_per_clip']} "
        f"episode(s), the same clips and seeds for all (seed {evaluation['seed']}).",
        "",
        "| metric (mean over episodes) | trained | initial | random |",
        "| --- | ---: | ---: | ---: |",
    ]
    for key in sorted((set(trained) | set(random)) - {"episodes"}):
        lines.append(
            f"| {key} | {_fmt(trained.get(key), 3)} | {_fmt(initial.get(key), 3)} | {_fmt(random.get(key), 3)} |"
        )
    return lines + [""]


def _mean_return(metrics: list[dict]) -> float:
    values = [v for v in (_num(m.get("episode_return_mean")) for m in metrics) if math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def _num(value) -> float:
    return float(value) if isinstance(value, (int, float)) else float("nan")


def _fmt(value, digits: int = 2) -> str:
    if not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}"
