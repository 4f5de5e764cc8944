"""Framework overhead of the broker: effective throughput against the ideal slots / step latency.

    python benchmarks/broker_overhead.py [--iterations 3] [--samples 3000]

Takeover workload with only the step latency on (preset `step-only`: 1.6 ms a step, resets
free), `fast` mode, a freshly initialised policy, 10 and 30 slots over 2 and 3 simulator
server processes. The ideal is what the slots would do if nothing but the simulator's step
took time: slots / step latency, with the latency the servers really measured (compute plus
emulated wait, reported per call). Prints, per configuration, the raw and effective throughput
as fractions of the ideal and where each lock-step step's time went (medians over iterations).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from broker.dealer import HOLDOUT_EVERY, ClipDealer  # noqa: E402
from broker.policy_runner import PolicyRunner  # noqa: E402
from broker.pool import SimulatorPool  # noqa: E402
from broker.samplers import make_sampler  # noqa: E402
from jobs.processes import start_service  # noqa: E402


async def measure(slots: int, servers: int, iterations: int, samples: int, alpha: float, t_max: int) -> dict:
    per_server = slots // servers
    sizes = [per_server + (1 if i < slots % servers else 0) for i in range(servers)]
    procs = [
        start_service(f"sim-{i}", ["sim-server", "--slots", str(k), "--port", "0", "--cost-preset", "step-only"])
        for i, k in enumerate(sizes)
    ]
    try:
        pool = SimulatorPool()
        for p in procs:
            await pool.add(p.address)
        runner = PolicyRunner(pool.observation_space, pool.action_space, (64, 64), seed=0)
        dealer = ClipDealer(pool.num_clips, holdout_every=HOLDOUT_EVERY, seed=0)
        sampler = make_sampler("fast", pool, runner, dealer, samples_per_iteration=samples, alpha=alpha, t_max=t_max)
        await sampler.sample()  # warm-up
        rows = []
        for _ in range(iterations):
            batch, stats = await sampler.sample()
            steps = batch["valid_mask"].shape[0]
            latency = stats.step_server_s / steps  # what the servers measured per step call
            s = stats.summary()
            rows.append(
                {
                    "latency_ms": latency * 1e3,
                    "ideal": slots / latency,
                    "raw": s["raw_throughput"],
                    "effective": s["effective_throughput"],
                    "validity": s["validity"],
                    "per_step_ms": {k: v / steps * 1e3 for k, v in s["time_split_s"].items()},
                    "step_ms": stats.wall_s / steps * 1e3,
                }
            )
        await pool.close()
    finally:
        for p in procs:
            p.stop()
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    split = {k: statistics.median(r["per_step_ms"][k] for r in rows) for k in rows[0]["per_step_ms"]}
    return {
        "slots": slots,
        "servers": servers,
        "latency_ms": med("latency_ms"),
        "ideal": med("ideal"),
        "raw": med("raw"),
        "effective": med("effective"),
        "validity": med("validity"),
        "step_ms": med("step_ms"),
        "split": split,
    }


async def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    results = []
    for slots in (10, 30):
        for servers in (2, 3):
            results.append(await measure(slots, servers, args.iterations, args.samples, args.alpha, args.t_max))
    print(
        f"fast mode, step-only preset (1.6 ms step, free resets), alpha={args.alpha} t_max={args.t_max}, "
        f"{args.samples} valid samples/iteration, medians of {args.iterations} iterations"
    )
    print(
        f"{'slots':>5} {'servers':>7} {'latency ms':>10} {'ideal/s':>9} {'raw/s':>8} {'raw/ideal':>9} "
        f"{'eff/s':>8} {'eff/ideal':>9} {'eta':>5} {'step ms':>7}  "
        "per-step split ms (stepping inference transport waiting resetting)"
    )
    for r in results:
        sp = r["split"]
        print(
            f"{r['slots']:>5} {r['servers']:>7} {r['latency_ms']:>10.2f} {r['ideal']:>9.0f} {r['raw']:>8.0f} "
            f"{r['raw'] / r['ideal']:>9.3f} {r['effective']:>8.0f} {r['effective'] / r['ideal']:>9.3f} "
            f"{r['validity']:>5.2f} {r['step_ms']:>7.2f}  "
            f"{sp['stepping']:.2f} {sp['inference']:.2f} {sp['transport']:.2f} "
            f"{sp['waiting']:.2f} {sp['resetting']:.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--t-max", type=int, default=200)
    asyncio.run(main(parser.parse_args()))
