"""Soak: a long `fast train` at many slots, with every process's memory and descriptors sampled.

    python benchmarks/soak.py --minutes 30 --servers 4 --slots 16 --preset calibrated
    python -m benchmarks.soak [the same flags]   # the same command, from the repository root

Starts `fast train` as a user does, reads the pids of its services from the run's config.yaml,
and samples each process's resident memory (VmRSS) and open file descriptors every
`--interval-s` seconds. After `--minutes` it stops the run with SIGINT (the way Ctrl-C does) and
writes benchmarks/results/soak/: soak.json (every sample), soak.md (the figures) and soak.png.

The judgement: RSS growth from the end of the warm-up (the first `--warmup-fraction` of the run,
when caches, allocator pools and the first checkpoints have settled) to the end, under 10% for
every process; open descriptors at the end no more than after the warm-up. The cost model is on
so that 64 slots fit two cores: the simulators mostly wait, as real ones would.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RSS_GROWTH_LIMIT = 0.10


def rss_bytes(pid: int) -> int | None:
    """Resident set size from /proc, or None when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def service_pids(run_dir: Path, timeout_s: float) -> dict[str, int]:
    """The services' pids, once `fast train` has written them to config.yaml with the broker's."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = run_dir / "config.yaml"
        if path.is_file():
            processes = (yaml.safe_load(path.read_text()) or {}).get("processes") or {}
            if "broker" in processes:
                return {name: int(entry["pid"]) for name, entry in processes.items()}
        time.sleep(1.0)
    raise RuntimeError(f"fast train wrote no process list to {run_dir / 'config.yaml'} within {timeout_s:g} s")


def summarize(samples: list[dict], warmup_fraction: float) -> list[dict]:
    """Per process: RSS and descriptors after the warm-up and at the end, the growth, and the verdict."""
    end_t = samples[-1]["t"]
    after_warmup = next(s for s in samples if s["t"] >= warmup_fraction * end_t)
    rows = []
    for name in samples[0]["rss"]:
        rss_w, rss_end = after_warmup["rss"].get(name), samples[-1]["rss"].get(name)
        fds_w, fds_end = after_warmup["fds"].get(name), samples[-1]["fds"].get(name)
        alive = rss_w is not None and rss_end is not None
        growth = (rss_end - rss_w) / rss_w if alive else None
        rows.append(
            {
                "process": name,
                "rss_start_mb": samples[0]["rss"][name] / 2**20 if samples[0]["rss"][name] else None,
                "rss_after_warmup_mb": rss_w / 2**20 if alive else None,
                "rss_end_mb": rss_end / 2**20 if alive else None,
                "rss_peak_mb": max((s["rss"].get(name) or 0) for s in samples) / 2**20,
                "rss_growth": growth,
                "fds_after_warmup": fds_w,
                "fds_end": fds_end,
                "ok": alive and growth < RSS_GROWTH_LIMIT and fds_end <= fds_w,
            }
        )
    return rows


def write_results(out: Path, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=1))
    samples, cfg = result["samples"], result["config"]
    minutes = [s["t"] / 60 for s in samples]
    fig, (ax_rss, ax_fds) = plt.subplots(1, 2, figsize=(11, 4))
    for name in samples[0]["rss"]:
        ax_rss.plot(minutes, [(s["rss"].get(name) or float("nan")) / 2**20 for s in samples], label=name)
        ax_fds.plot(minutes, [s["fds"].get(name) or float("nan") for s in samples], label=name)
    for ax, title in ((ax_rss, "resident memory (MiB)"), (ax_fds, "open file descriptors")):
        ax.axvline(cfg["warmup_fraction"] * minutes[-1], color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("minutes")
        ax.set_title(title)
    ax_rss.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=110)
    plt.close(fig)

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    lines = [
        "# Soak: `fast train` for a long run, memory and descriptors of every process",
        "",
        f"Command: `{result['command']}`",
        "",
        f"`fast train` with {cfg['servers']} simulator servers x {cfg['slots']} slots ({cfg['servers'] * cfg['slots']} "
        f"slots), mode fast, cost preset `{cfg['preset']}`, {cfg['samples_per_iteration']} valid transitions per "
        f"iteration, for {result['minutes_run']:.1f} min ({result['iterations']} iterations); samples every "
        f"{cfg['interval_s']:g} s. Warm-up: the first {cfg['warmup_fraction']:.0%} of the run. Target: RSS growth "
        f"after the warm-up under {RSS_GROWTH_LIMIT:.0%}, no descriptor growth. Exit code of `fast train`: "
        f"{result['exit_code']}.",
        "",
        "| process | RSS start MiB | after warm-up | end | peak | growth after warm-up | fds after warm-up | "
        "fds end | ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["summary"]:
        lines.append(
            f"| {r['process']} | {fmt(r['rss_start_mb'], '.0f')} | {fmt(r['rss_after_warmup_mb'], '.0f')} | "
            f"{fmt(r['rss_end_mb'], '.0f')} | {r['rss_peak_mb']:.0f} | "
            f"{'-' if r['rss_growth'] is None else format(100 * r['rss_growth'], '+.1f') + '%'} | "
            f"{fmt(r['fds_after_warmup'], 'd')} | {fmt(r['fds_end'], 'd')} | {'yes' if r['ok'] else '**no**'} |"
        )
    lines += ["", "![memory and descriptors](soak.png)", ""]
    (out / "soak.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=16, help="per server")
    parser.add_argument("--preset", default="calibrated", help="cost preset (docs/cost_model.md)")
    parser.add_argument("--samples-per-iteration", type=int, default=2048)
    parser.add_argument("--interval-s", type=float, default=60.0)
    parser.add_argument("--warmup-fraction", type=float, default=0.2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak")
    args = parser.parse_args(argv)
    for name, ok, rule in (
        ("--minutes", args.minutes > 0, "> 0"),
        ("--servers", args.servers >= 1, ">= 1"),
        ("--slots", args.slots >= 1, ">= 1"),
        ("--interval-s", args.interval_s > 0, "> 0"),
        ("--warmup-fraction", 0 <= args.warmup_fraction < 1, "in [0, 1)"),
    ):
        if not ok:
            parser.error(f"{name} must be {rule}")

    runs_dir = Path(tempfile.mkdtemp(prefix="fast-soak-"))
    name = "soak"
    command = [
        sys.executable, "-m", "fast", "train", "--name", name, "--runs-dir", str(runs_dir),
        "--servers", str(args.servers), "--slots", str(args.slots), "--cost-preset", args.preset,
        "--samples-per-iteration", str(args.samples_per_iteration), "--iterations", "1000000",
        "--eval-episodes-per-clip", "0",
    ]  # fmt: skip
    log = open(runs_dir / "fast-train.log", "w")
    train = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    samples: list[dict] = []
    pids = {"fast train": train.pid}
    try:
        pids.update(service_pids(runs_dir / name, timeout_s=180))
        started = time.monotonic()
        while True:
            t = time.monotonic() - started
            samples.append(
                {
                    "t": t,
                    "rss": {n: rss_bytes(p) for n, p in pids.items()},
                    "fds": {n: open_fds(p) for n, p in pids.items()},
                }
            )
            last = samples[-1]
            sizes = (f"{n} {(last['rss'][n] or 0) / 2**20:.0f}MiB/{last['fds'][n]}fd" for n in pids)
            print(f"{t / 60:5.1f} min  " + "  ".join(sizes), flush=True)
            if t >= args.minutes * 60 or train.poll() is not None:
                break
            time.sleep(min(args.interval_s, max(0.0, args.minutes * 60 - t)))
    finally:
        if train.poll() is None:
            train.send_signal(signal.SIGINT)  # as Ctrl-C: the broker stops, the learner checkpoints
        try:
            code = train.wait(timeout=180)
        except subprocess.TimeoutExpired:
            train.kill()
            code = train.wait()
        log.close()
    metrics = runs_dir / name / "metrics.jsonl"
    iterations = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
    result = {
        "command": "python benchmarks/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "minutes_run": samples[-1]["t"] / 60,
        "iterations": iterations,
        "exit_code": code,
        "pids": pids,
        "samples": samples,
        "summary": summarize(samples, args.warmup_fraction),
    }
    write_results(args.out, result)
    print((args.out / "soak.md").read_text())
    return 0 if all(r["ok"] for r in result["summary"]) else 1


if __name__ == "__main__":
    sys.exit(main())
