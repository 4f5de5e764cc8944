"""Simulator server overhead: gRPC against in-process stepping, measured side by side.

    python benchmarks/sim_server.py [--env takeover] [--slots 8] [--steps 2000] [--repeats 3]
    python -m benchmarks.sim_server [the same flags]   # the same command, from the repository root

One `fast sim-server` process (cost model off) and the same environment built in this
process, stepped with the same random actions in lock-step over all slots, interleaved
repeat by repeat so machine drift hits both alike. Prints slot-steps per second for
in-process, unary Step and StepStream, their ratios, and reset latency (one slot, and all
slots in one batched call). Time spent resetting ended episodes is excluded from stepping.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fast.spaces import random_actions  # noqa: E402
from jobs.processes import start_service  # noqa: E402
from sim_server.client import SimulatorClient  # noqa: E402
from sim_server.environments import make_env  # noqa: E402


def step_in_process(env, actions: np.ndarray, clips: np.ndarray) -> float:
    slots = np.arange(env.num_slots)
    env.reset(slots, clips[: slots.size], slots)
    stepping = 0.0
    for t in range(actions.shape[0]):
        started = time.perf_counter()
        r = env.step(slots, actions[t])
        stepping += time.perf_counter() - started
        ended = slots[r.terminated | r.truncated]
        if ended.size:
            env.reset(ended, clips[(t + ended) % clips.size], ended)
    return actions.shape[0] * slots.size / stepping


async def step_over_grpc(client: SimulatorClient, actions: np.ndarray, clips: np.ndarray, *, stream: bool) -> float:
    slots = np.arange(actions.shape[1])
    await client.reset(slots, clips[: slots.size], slots)
    stepper = client.step_stream() if stream else client
    stepping = 0.0
    for t in range(actions.shape[0]):
        started = time.perf_counter()
        r = await stepper.step(slots, actions[t])
        stepping += time.perf_counter() - started
        ended = slots[r.terminated | r.truncated]
        if ended.size:
            await client.reset(ended, clips[(t + ended) % clips.size], ended)
    if stream:
        await stepper.close()
    return actions.shape[0] * slots.size / stepping


async def reset_latency(
    client: SimulatorClient, env, slots: np.ndarray, clips: np.ndarray, rounds: int
) -> dict[str, float]:
    out: dict[str, list[float]] = {"grpc_one": [], "grpc_all": [], "inproc_one": [], "inproc_all": []}
    for i in range(rounds):
        c = clips[(i + slots) % clips.size]
        started = time.perf_counter()
        await client.reset(slots[:1], c[:1], [i])
        out["grpc_one"].append(time.perf_counter() - started)
        started = time.perf_counter()
        await client.reset(slots, c, slots)
        out["grpc_all"].append(time.perf_counter() - started)
        started = time.perf_counter()
        env.reset(slots[:1], c[:1], np.array([i]))
        out["inproc_one"].append(time.perf_counter() - started)
        started = time.perf_counter()
        env.reset(slots, c, slots)
        out["inproc_all"].append(time.perf_counter() - started)
    return {k: statistics.median(v) for k, v in out.items()}


async def main(args: argparse.Namespace) -> None:
    server = start_service(
        "sim-server",
        ["sim-server", "--env", args.env, "--slots", str(args.slots), "--port", "0", "--cost-preset", "off"],
    )
    try:
        env = make_env(args.env, args.slots)
        rng = np.random.default_rng(0)
        actions = np.stack([random_actions(env.action_space, args.slots, rng) for _ in range(args.steps)])
        clips = rng.permutation(env.num_clips)
        results: dict[str, list[float]] = {"in-process": [], "grpc unary Step": [], "grpc StepStream": []}
        async with SimulatorClient(server.address) as client:
            await client.wait_ready()
            await step_over_grpc(client, actions[:100], clips, stream=False)  # warm-up
            for _ in range(args.repeats):
                results["in-process"].append(step_in_process(env, actions, clips))
                results["grpc unary Step"].append(await step_over_grpc(client, actions, clips, stream=False))
                results["grpc StepStream"].append(await step_over_grpc(client, actions, clips, stream=True))
            resets = await reset_latency(client, env, np.arange(args.slots), clips, rounds=50)
    finally:
        server.stop()

    base = statistics.median(results["in-process"])
    print(f"env={args.env} slots={args.slots} steps={args.steps} repeats={args.repeats} cost model off; medians")
    print(f"{'mode':<18}{'slot-steps/s':>14}{'vs in-process':>15}")
    for name, values in results.items():
        rate = statistics.median(values)
        print(f"{name:<18}{rate:>14,.0f}{rate / base:>15.3f}")
    print(
        "stream / unary: "
        f"{statistics.median(results['grpc StepStream']) / statistics.median(results['grpc unary Step']):.3f}"
    )
    print(
        "reset latency (ms):  "
        f"1 slot gRPC {resets['grpc_one'] * 1e3:.2f}, in-process {resets['inproc_one'] * 1e3:.2f};  "
        f"{args.slots} slots batched gRPC {resets['grpc_all'] * 1e3:.2f}, in-process {resets['inproc_all'] * 1e3:.2f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="takeover")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
