"""The default `fast train` over gRPC and over the local step sockets, side by side.

    python benchmarks/transport_train.py [--iterations 100] [--seed 0] [--repeats 1] [--out DIR]
    python -m benchmarks.transport_train [the same flags]   # the same command, from the repository root

Runs `fast train` with its defaults (the README's default run, cut to `--iterations`, without the
final evaluation), alternately with the broker stepping its simulator servers over gRPC
(FAST_TRAIN_LOCAL_STEP=false) and over their local step sockets (the default), `--repeats` pairs,
one run at a time. Prints per run the training wall-clock, the sampling time and the part of it
the broker's time split books as transport, and the ratios of the pair; checks that the two runs
of a pair learnt the same thing (every metrics.jsonl figure but times, and the final weights).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from broker.metrics import without_timings  # noqa: E402
from learner.checkpoint import load_latest  # noqa: E402

TRANSPORTS = {"grpc": "false", "local": "true"}


def train(runs_dir: Path, name: str, transport: str, iterations: int, seed: int) -> dict:
    cmd = [sys.executable, "-m", "fast", "train", "--runs-dir", str(runs_dir), "--name", name,
           "--iterations", str(iterations), "--seed", str(seed), "--eval-episodes-per-clip", "0"]  # fmt: skip
    env = {**os.environ, "FAST_TRAIN_LOCAL_STEP": TRANSPORTS[transport]}
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"fast train {name} exited {done.returncode}:\n{done.stdout[-3000:]}")
    metrics = [json.loads(line) for line in (runs_dir / name / "metrics.jsonl").read_text().splitlines()]
    first = metrics[0]
    return {
        "name": name,
        "transport": transport,
        "whole_run_s": wall,
        "training_s": metrics[-1]["time"] - (first["time"] - first["iteration_time_s"]),
        "sampling_s": sum(m["sampling_time_s"] for m in metrics),
        "transport_s": sum(m["time_split_s"]["transport"] for m in metrics),
        "stepping_s": sum(m["time_split_s"]["stepping"] for m in metrics),
        "update_s": sum(m["iteration_time_s"] - m["sampling_time_s"] for m in metrics),
        "valid": sum(m["valid_transitions"] for m in metrics),
        "figures": [without_timings(m) for m in metrics],
    }


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_latest(a / "checkpoints"), load_latest(b / "checkpoints")
    return x.policy_version == y.policy_version and all(
        torch.equal(t, y.learner_state["policy"][k]) for k, t in x.learner_state["policy"].items()
    )


def positive(text: str) -> int:
    value = int(text)  # ValueError: argparse names the flag and the value
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive count")
    return value


def main(args: argparse.Namespace) -> None:
    runs_dir = Path(tempfile.mkdtemp(prefix="transport-train-"))
    pairs = []
    for r in range(args.repeats):
        pair = {t: train(runs_dir, f"{t}-{r}", t, args.iterations, args.seed) for t in TRANSPORTS}
        pair["same_figures"] = pair["grpc"]["figures"] == pair["local"]["figures"]
        pair["same_weights"] = same_weights(runs_dir / f"grpc-{r}", runs_dir / f"local-{r}")
        pairs.append(pair)
    lines = [
        f"fast train defaults, seed {args.seed}, {args.iterations} iterations, no final evaluation; "
        f"{args.repeats} pair(s), gRPC first in each; runs in {runs_dir}",
        f"{'run':>8} {'training s':>10} {'sampling s':>10} {'transport s':>11} {'stepping s':>10} "
        f"{'update s':>8} {'valid/s sampling':>16}",
    ]
    for pair in pairs:
        for t in TRANSPORTS:
            m = pair[t]
            lines.append(
                f"{m['name']:>8} {m['training_s']:>10.1f} {m['sampling_s']:>10.1f} {m['transport_s']:>11.1f} "
                f"{m['stepping_s']:>10.1f} {m['update_s']:>8.1f} {m['valid'] / m['sampling_s']:>16.0f}"
            )
        lines.append(
            f"{'ratio':>8} {pair['grpc']['training_s'] / pair['local']['training_s']:>9.2f}x "
            f"{pair['grpc']['sampling_s'] / pair['local']['sampling_s']:>9.2f}x "
            f"(gRPC over local)  same figures: {pair['same_figures']}, same weights: {pair['same_weights']}"
        )
    if len(pairs) > 1:
        ratio = statistics.median(p["grpc"]["training_s"] / p["local"]["training_s"] for p in pairs)
        lines.append(f"median training-time ratio gRPC/local: {ratio:.2f}x")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "transport_train.txt").write_text(text + "\n")
        for pair in pairs:
            for t in TRANSPORTS:
                pair[t].pop("figures")
        (args.out / "transport_train.json").write_text(json.dumps({"args": sys.argv[1:], "pairs": pairs}, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=positive, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=positive, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write transport_train.txt and .json here")
    main(parser.parse_args())
