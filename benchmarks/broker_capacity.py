"""Per-broker capacity, measured, and 2 broker/rank pairs against 1 (issue 29, item 4).

    python -m benchmarks.broker_capacity --out benchmarks/results/broker-capacity [--grid 8,16,...,512]
        [--repeats 3] [--warmup 2] [--iterations 5] [--steps 100] [--servers 4] [--step-latency-s 0.008]

Every measurement is a real `fast train` (jobs/train/orchestrate.py's `train`, the machinery of
`fast train --ranks R`): R learner ranks in one torch.distributed group, a broker process per rank
driving its own simulator server processes, each broker submitting to its own rank. The
simulators run the `step-only` preset with its step latency set to `--step-latency-s` (8 ms by
default: a wait, not CPU; resets free), through `FAST_SIM_STEP_LATENCY_S`, the variable every
simulator server the run starts reads (docs/cost_model.md).

The broker samples in mode `fast` with the broker's defaults (alpha 0.5, `carry`, unpipelined, as
`fast train` runs it). `fast` and not `autoreset`: it is the default mode and the one the issue's
target is set for, and with free resets the two differ only in how many slot-steps are padding,
which the effective throughput counts either way.

What is measured is the brokers' sampling throughput during collection, not training throughput:
an iteration is collection, then the ranks' update (which the brokers wait for), and the update
is not the broker's capacity. Per iteration, each broker's metrics line gives its collection
window (it ends `iteration_time_s - sampling_time_s` before the line's `time`) and its valid
transitions; with P pairs the figure is every broker's valid transitions over the span from the
first window's start to the last one's end (so a broker that samples alone for a while, with the
cores to itself, adds nothing it would not add side by side). The learner is made cheap (1 epoch,
1 minibatch) so that runs are short; that changes nothing inside the windows. An iteration asks
each broker for `--steps` lock-step steps of valid transitions (slots x steps), so that every slot
count gets windows of about the same length; the first `--warmup` iterations of each run are left
out (first resets, first connections, caches).

1. Capacity sweep: one pair at each slot count S of `--grid` (a doubling grid), the slots spread
   evenly over `--servers` simulator server processes (a fixed count, so that only S changes:
   a broker makes one Step call per server per lock-step step), repeats interleaved in a new
   shuffled order each time. Beside each S: the ideal S / step latency, with the latency the
   servers really measured (compute plus wait: `time_split_s.stepping` per lock-step step), and
   the fraction of it reached. The saturation point S_sat is the smallest S past which every
   doubling gains less than `--min-gain` (10%) (`saturation_point`).
2. Scaling: 1 pair and 2 pairs, each broker at S_sat (its own `--servers` servers), interleaved
   repeat by repeat in one run. The ratio of the totals is set beside the physical limit: the
   CPU cores of this machine over the cores one pair burns during collection (read from /proc,
   every process of the run), and 2.

Results: `capacity.json` (settings, every iteration measured, the summaries) and `README.md` (the
tables) in `--out`.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks.tools.loop_floor import processes_cpu_s  # noqa: E402

STEP_LATENCY_S = 0.008
DEFAULT_GRID = (8, 16, 32, 64, 128, 256, 512)
TARGET_RATIO = 1.7  # issue 29: 2 pairs at least 1.7x the effective throughput of 1
_ROLES = ("broker", "learner", "sim-server")  # `python -m fast ROLE ...`: the processes a run starts


# -- the pure rules ---------------------------------------------------------------------------------


def saturation_point(points: list[tuple[int, float]], min_gain: float = 0.10) -> int | None:
    """The smallest slot count S past which throughput grows less than `min_gain` at every doubling.

    `points`: (S, throughput) over a doubling grid. S qualifies when the doubling from S and every
    later one gain less than `min_gain` (T(2S') < (1 + min_gain) T(S') for every S' >= S on the grid),
    so a noisy dip followed by more growth does not count. None when the last doubling still gains
    `min_gain` or more (no saturation inside the grid), or with fewer than two points.
    """
    points = sorted(points)
    check_doubling([s for s, _ in points])
    saturated = None
    for (s, t), (_, t_next) in reversed(list(zip(points, points[1:]))):
        if t_next >= (1.0 + min_gain) * t:
            break
        saturated = s
    return saturated


def check_doubling(grid: list[int]) -> None:
    if len(grid) < 2 or any(b != 2 * a for a, b in zip(grid, grid[1:])) or grid[0] < 1:
        raise ValueError(f"the grid must be at least two slot counts, each double the one before: got {grid}")


def collection_window(line: dict) -> tuple[float, float]:
    """(start, end) of an iteration's collection, on time.time()'s clock, from its metrics line: the
    line is written at the iteration's end (`time`), `iteration_time_s` after it began with sampling."""
    start = line["time"] - line["iteration_time_s"]
    return start, start + line["sampling_time_s"]


def step_latency_s(line: dict) -> float:
    """Seconds the servers measured per lock-step step (the slowest server's, compute plus emulated wait)."""
    steps = line["transitions"] / max(line["num_slots"], 1)
    return line["time_split_s"]["stepping"] / max(steps, 1e-9)


def combine(lines: list[dict]) -> dict:
    """One iteration of P pairs, from each broker's metrics line of that iteration: every broker's valid
    transitions over the span of their collection windows, and the ideal (sum of slots / latency)."""
    windows = [collection_window(line) for line in lines]
    span = max(end for _, end in windows) - min(start for start, _ in windows)
    valid = sum(line["valid_transitions"] for line in lines)
    ideal = sum(line["num_slots"] / step_latency_s(line) for line in lines)
    return {
        "iteration": lines[0]["iteration"],
        "span_s": span,
        "valid": valid,
        "effective": valid / span,
        "raw": sum(line["transitions"] for line in lines) / span,  # padding included: what the ideal counts
        "ideal": ideal,
        "latency_ms": statistics.mean(step_latency_s(line) for line in lines) * 1e3,
        "validity": valid / sum(line["transitions"] for line in lines),
        "windows": windows,
    }


def by_iteration(per_broker: list[list[dict]], skip: int) -> list[dict]:
    """The iterations every broker completed, past the first `skip`, combined (`combine`)."""
    common = set.intersection(*({line["iteration"] for line in lines} for lines in per_broker))
    index = [{line["iteration"]: line for line in lines} for lines in per_broker]
    return [combine([lines[i] for lines in index]) for i in sorted(common) if i > skip]


@dataclass
class CpuTrace:
    """Cumulative CPU seconds of processes, sampled over time: `at` interpolates between samples."""

    times: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=dict)  # role -> cumulative seconds at each time

    def add(self, when: float, by_role: dict[str, float]) -> None:
        for role in set(self.cpu) | set(by_role):
            self.cpu.setdefault(role, [0.0] * len(self.times)).append(by_role.get(role, 0.0))
        self.times.append(when)

    def cores(self, role: str, start: float, end: float) -> float:
        """Mean cores the role's processes used from start to end (NaN where the trace does not cover it)."""
        if role not in self.cpu or not self.times or start < self.times[0] or end > self.times[-1] or end <= start:
            return math.nan
        used = np.interp(end, self.times, self.cpu[role]) - np.interp(start, self.times, self.cpu[role])
        return float(used / (end - start))


# -- running the stack ------------------------------------------------------------------------------


class _ChildCpu:
    """Samples the CPU of this process's children by role (/proc) every `period_s`, in a thread.
    A child's seconds are kept once it exits, so a role's sum never falls."""

    def __init__(self, period_s: float = 0.1) -> None:
        self.trace = CpuTrace()
        self.period_s = period_s
        self._stop = threading.Event()
        self._last: dict[int, tuple[str, float]] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _ChildCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            for pid, role in _children(os.getpid()).items():
                seconds = processes_cpu_s([pid])
                if math.isfinite(seconds):
                    self._last[pid] = (role, seconds)
            by_role: dict[str, float] = {}
            for role, seconds in self._last.values():
                by_role[role] = by_role.get(role, 0.0) + seconds
            self.trace.add(time.time(), by_role)


def _children(parent: int) -> dict[int, str]:
    """pid -> role of the `python -m fast ROLE` processes whose parent is `parent`."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = cmdline.read().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue
        if "fast" in argv:
            role = argv[argv.index("fast") + 1] if argv.index("fast") + 1 < len(argv) else ""
            if role in _ROLES:
                found[int(entry)] = role
    return found


@contextmanager
def _simulator_step_latency(seconds: float):
    """Every simulator server started meanwhile waits `seconds` a step: `fast train` starts its servers from
    its own config (cost preset only) and passes the environment on, and FAST_SIM_STEP_LATENCY_S overrides
    the preset's latency (docs/cost_model.md)."""
    name = "FAST_SIM_STEP_LATENCY_S"
    before = os.environ.get(name)
    os.environ[name] = repr(seconds)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def run_pairs(pairs: int, slots: int, args: argparse.Namespace, seed: int, runs_dir: Path) -> dict:
    """One `fast train` of `pairs` broker/rank pairs, each broker on `slots` slots over its own
    `args.servers` servers; the iterations past the warm-up, combined, and the cores used in them."""
    from rich.console import Console

    from jobs.train.config import TrainConfig
    from jobs.train.orchestrate import train

    cfg = TrainConfig(
        name=f"p{pairs}-s{slots}-seed{seed}-{time.strftime('%H%M%S')}",
        runs_dir=runs_dir,
        ranks=pairs,
        servers=args.servers * pairs,  # dealt round-robin: each broker gets args.servers of them
        slots=slots // args.servers,
        cost_preset="step-only",
        mode="fast",
        samples_per_iteration=slots * args.steps,
        iterations=args.warmup + args.iterations,
        update_epochs=1,
        num_minibatches=1,
        checkpoint_every=1000,
        keep_checkpoints=1,
        seed=seed,
        gateway=False,
        eval_episodes_per_clip=0,
    )
    log = io.StringIO()
    with _simulator_step_latency(args.step_latency_s), _ChildCpu() as cpu:
        code = train(cfg, Console(file=log, soft_wrap=True, width=200))
    if code != 0:
        raise RuntimeError(f"fast train of {pairs} pair(s) at {slots} slots failed ({code}):\n{log.getvalue()[-3000:]}")
    files = [cfg.run_dir / "metrics.jsonl", *(cfg.run_dir / f"rank-{r}" / "metrics.jsonl" for r in range(1, pairs))]
    per_broker = [[json.loads(line) for line in f.read_text().splitlines() if line.strip()] for f in files]
    iterations = by_iteration(per_broker, skip=args.warmup)
    if not iterations:
        raise RuntimeError(f"{pairs} pair(s) at {slots} slots: no iteration past the warm-up in {files}")
    for it in iterations:
        start, end = min(s for s, _ in it["windows"]), max(e for _, e in it["windows"])
        it["cores"] = {role: cpu.trace.cores(role, start, end) for role in _ROLES}
    return {"pairs": pairs, "slots": slots, "seed": seed, "iterations": iterations}


# -- summaries and the report -----------------------------------------------------------------------


def summarise(runs: list[dict]) -> dict:
    """Medians over every measured iteration of the runs of one configuration, and each run's median."""
    its = [it for run in runs for it in run["iterations"]]
    med = lambda key: statistics.median(it[key] for it in its)  # noqa: E731
    cores = {role: statistics.median(it["cores"][role] for it in its) for role in _ROLES}
    repeats = [statistics.median(it["effective"] for it in run["iterations"]) for run in runs]
    return {
        "pairs": runs[0]["pairs"],
        "slots": runs[0]["slots"],
        "effective": med("effective"),
        "ideal": med("ideal"),
        "share": statistics.median(it["effective"] / it["ideal"] for it in its),
        "raw_share": statistics.median(it["raw"] / it["ideal"] for it in its),
        "latency_ms": med("latency_ms"),
        "validity": med("validity"),
        "span_s": med("span_s"),
        "repeat_medians": repeats,
        "cores": cores,
        "cores_total": sum(v for v in cores.values() if math.isfinite(v)),
        "iterations_measured": len(its),
    }


def _sweep_table(rows: list[dict], servers: int) -> list[str]:
    lines = [
        "| slots | servers | step latency ms | ideal/s | effective/s | repeats (min-max) | eff/ideal | gain on S/2 "
        "| raw/ideal | eta | broker cores | servers' cores |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    previous = None
    for r in rows:
        gain = f"{r['effective'] / previous - 1:+.0%}" if previous else "-"
        spread = f"{min(r['repeat_medians']):,.0f}-{max(r['repeat_medians']):,.0f}"
        lines.append(
            f"| {r['slots']} | {servers} | {r['latency_ms']:.2f} | {r['ideal']:,.0f} | {r['effective']:,.0f} | "
            f"{spread} | {r['share']:.3f} | {gain} | {r['raw_share']:.3f} | {r['validity']:.2f} | "
            f"{r['cores']['broker']:.2f} | "
            f"{r['cores']['sim-server']:.2f} |"
        )
        previous = r["effective"]
    return lines


def _scaling_table(rows: list[dict]) -> list[str]:
    lines = [
        "| pairs | slots per broker | step latency ms | ideal/s | effective/s (total) | repeats (min-max) | eff/ideal "
        "| brokers' cores | all cores |",
        "|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        spread = f"{min(r['repeat_medians']):,.0f}-{max(r['repeat_medians']):,.0f}"
        lines.append(
            f"| {r['pairs']} | {r['slots']} | {r['latency_ms']:.2f} | {r['ideal']:,.0f} | {r['effective']:,.0f} | "
            f"{spread} | {r['share']:.3f} | {r['cores']['broker']:.2f} | {r['cores_total']:.2f} |"
        )
    return lines


def scaling_verdict(one: dict, two: dict, cores: int) -> dict:
    """The ratio of 2 pairs to 1 and what the machine allows: its cores over one pair's (2 at most)."""
    ratio = two["effective"] / one["effective"]
    limit = min(2.0, cores / one["cores_total"]) if one["cores_total"] > 0 else 2.0
    return {"ratio": ratio, "physical_limit": limit, "target": TARGET_RATIO, "met": ratio >= TARGET_RATIO}


def write_results(out: Path, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "capacity.json").write_text(json.dumps(result, indent=1, default=float))
    a = result["settings"]
    sat = result["saturation_slots"]
    text = [
        "# Per-broker capacity and 2 broker/rank pairs against 1 (issue 29)",
        "",
        f"Command: `python -m benchmarks.broker_capacity {' '.join(result['argv'])}`",
        "",
        f"Machine: {result['cores']} CPU cores. Started {result['started']}, {result['wall_clock_s'] / 60:.1f} min.",
        "",
        f"`fast train` runs (mode `fast`, broker defaults), `step-only` with a {a['step_latency_s'] * 1e3:g} ms "
        f"step (a wait; resets free), each broker over {a['servers']} simulator server processes; "
        f"{a['steps']} lock-step steps of valid transitions per iteration, {a['warmup']} warm-up iteration(s) "
        f"left out, {a['iterations']} measured per run, {a['repeats']} repeat(s). Effective throughput: valid "
        "transitions per second of collection (the update left out), medians over the measured iterations. "
        "Ideal: slots / the step latency the servers measured. Cores: CPU during collection, from /proc.",
        "",
        "## Capacity of one broker",
        "",
        *_sweep_table(result["sweep"], a["servers"]),
        "",
    ]
    if sat is None:
        text.append(
            f"No saturation inside the grid: the last doubling still gained {a['min_gain']:.0%} or more; the "
            f"scaling below uses the largest slot count, {result['scaling_slots']}."
        )
    else:
        text.append(
            f"Saturation point (every doubling past it gains less than {a['min_gain']:.0%}): **{sat} slots**, "
            f"{next(r['effective'] for r in result['sweep'] if r['slots'] == sat):,.0f} valid transitions/s."
        )
    v = result["verdict"]
    text += [
        "",
        f"## 2 pairs against 1, each broker at {result['scaling_slots']} slots",
        "",
        *_scaling_table(result["scaling"]),
        "",
        f"Ratio 2 pairs / 1 pair: **{v['ratio']:.2f}x** (target {v['target']}x: {'met' if v['met'] else 'not met'}). "
        f"Physical limit on this machine: {v['physical_limit']:.2f}x ({result['cores']} cores over the "
        f"{result['scaling'][0]['cores_total']:.2f} cores one pair burns during collection, at most 2).",
        "",
    ]
    if v["physical_limit"] < v["target"]:
        text += [
            f"On this machine the target cannot be reached: one pair needs {result['scaling'][0]['cores_total']:.2f} "
            f"of its {result['cores']} cores while it collects, so two pairs side by side share cores that one "
            "pair alone already nearly fills.",
            "",
        ]
    (out / "README.md").write_text("\n".join(text))


def main(args: argparse.Namespace) -> None:
    check_doubling(args.grid)
    if any(s % args.servers for s in args.grid):
        raise SystemExit(f"--grid: every slot count must divide over --servers {args.servers}: got {args.grid}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    started, clock = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), time.perf_counter()
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory(prefix="broker-capacity-") as tmp:
        runs_dir = Path(tmp)
        sweep_runs: dict[int, list[dict]] = {s: [] for s in args.grid}
        for repeat in range(args.repeats):
            for j in rng.permutation(len(args.grid)):  # interleaved, a new order each repeat
                slots = args.grid[j]
                run = run_pairs(1, slots, args, args.seed + repeat, runs_dir)
                sweep_runs[slots].append(run)
                print(f"sweep repeat {repeat + 1}/{args.repeats}: {_progress(run)}", flush=True)
        sweep = [summarise(sweep_runs[s]) for s in args.grid]
        sat = saturation_point([(r["slots"], r["effective"]) for r in sweep], args.min_gain)
        slots = sat if sat is not None else args.grid[-1]
        scaling_runs: dict[int, list[dict]] = {1: [], 2: []}
        for repeat in range(args.repeats):
            for pairs in rng.permutation([1, 2]):
                run = run_pairs(int(pairs), slots, args, args.seed + repeat, runs_dir)
                scaling_runs[int(pairs)].append(run)
                print(f"scaling repeat {repeat + 1}/{args.repeats}: {_progress(run)}", flush=True)
    scaling = [summarise(scaling_runs[p]) for p in (1, 2)]
    result = {
        "argv": sys.argv[1:],
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cores": cores,
        "started": started,
        "wall_clock_s": time.perf_counter() - clock,
        "sweep": sweep,
        "saturation_slots": sat,
        "scaling_slots": slots,
        "scaling": scaling,
        "verdict": scaling_verdict(scaling[0], scaling[1], cores),
        "runs": {"sweep": [r for s in args.grid for r in sweep_runs[s]], "scaling": scaling_runs[1] + scaling_runs[2]},
    }
    write_results(args.out, result)
    print((args.out / "README.md").read_text())


def _progress(run: dict) -> str:
    """One run's line: its medians, with the ideal and the share of it reached beside them."""
    its = run["iterations"]
    eff, ideal = (statistics.median(it[key] for it in its) for key in ("effective", "ideal"))
    latency = statistics.median(it["latency_ms"] for it in its)
    return (
        f"{run['pairs']} pair(s) x {run['slots']} slots: effective {eff:,.0f}/s, ideal {ideal:,.0f}/s "
        f"(step {latency:.2f} ms measured), {eff / ideal:.3f} of it"
    )


def _positive(text: str) -> int:
    value = int(text)  # ValueError: argparse names the flag and the value
    if value < 1:
        raise ValueError(text)
    return value


def _grid(text: str) -> list[int]:
    grid = [int(x) for x in text.split(",")]  # ValueError: argparse names the flag and the value
    check_doubling(grid)
    return grid


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for capacity.json and README.md")
    p.add_argument("--grid", type=_grid, default=list(DEFAULT_GRID), help="slot counts, each double the last")
    p.add_argument("--servers", type=_positive, default=4, help="simulator server processes per broker")
    p.add_argument("--repeats", type=_positive, default=3, help="runs per configuration, interleaved")
    p.add_argument("--warmup", type=int, default=2, help="iterations left out at the start of each run")
    p.add_argument("--iterations", type=_positive, default=5, help="iterations measured per run")
    p.add_argument("--steps", type=_positive, default=100, help="lock-step steps of valid transitions per iteration")
    p.add_argument("--step-latency-s", type=float, default=STEP_LATENCY_S, help="the emulated step (a wait)")
    p.add_argument("--min-gain", type=float, default=0.10, help="a doubling gaining less is saturated")
    p.add_argument("--seed", type=int, default=0)
    return p


if __name__ == "__main__":
    main(parser().parse_args())
