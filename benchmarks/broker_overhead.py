"""Framework overhead of the broker: effective throughput against the ideal slots / step latency.

    python benchmarks/broker_overhead.py [--iterations 3] [--samples 3000] [--servers 1,2,3] [--profile]
        [--pipeline off,on] [--transport grpc,local]
    python -m benchmarks.broker_overhead [the same flags]   # the same command, from the repository root

Takeover workload with only the step latency on (preset `step-only`: 1.6 ms a step, resets
free), `fast` mode, a freshly initialised policy, 10 and 30 slots over 2 and 3 simulator
server processes. The ideal is what the slots would do if nothing but the simulator's step
took time: slots / step latency, with the latency the servers really measured (compute plus
emulated wait, reported per call). Prints, per configuration, the raw and effective throughput
as fractions of the ideal and where each lock-step step's time went (medians over iterations).
Each configuration measures every combination of `--pipeline` (rounds pipelined across servers or
not) and `--transport` (steps over gRPC StepStream, or over the servers' local step sockets,
sim_server/local_step.py) on the same server processes, their iterations interleaved.

With --profile, one more iteration per configuration runs under py-spy (benchmarks/tools/hot_path.py),
attached to this process (the broker's sampler, pool and inference run here) and to the first
simulator server, and a second table gives each one's main thread per lock-step step, in ms, by
kind of work: waiting (the event loop idle: for the broker, on the servers), simulator,
inference, serialisation, transport (grpc), event loop scheduling, bookkeeping. The profiled
iteration is not among the measured ones (py-spy samples from another process, but it shares
the cores).

The ideal is not reachable by any closed loop: each step, every server wakes on its message and
the driver wakes on the answers. So each configuration also measures the closed-loop floor
(benchmarks/tools/loop_floor.py) between the broker's iterations: as many probe server processes and
slots, doing per step only the servers' measured compute and the rest of the latency's wait, and
a driver that does nothing but write and read. Its share of its ideal is what this machine
allows; `raw/floor` is the broker's share over it. Between them sits the bare driver
(benchmarks/tools/bare_driver.py), also measured between the broker's iterations: the very server
processes the broker steps, over the same sockets and messages, stepped by a loop that only writes
fixed actions and reads and decodes the answers, each server on its own. Floor to bare is the
servers' own per-call work (decoding, checks, building the answer) and its transport; `raw/bare`,
the broker's raw throughput over the bare driver's on the same servers, is the broker's own part.
A last table gives the CPU each side burns per lock-step step (user and system time of every
thread: this process's clock for the broker and the floor's driver, /proc for the servers and the
probes), the measure that a loaded machine disturbs least: on two cores a process's CPU per step,
not its wall time, is what the others wait for.
"""

from __future__ import annotations

import argparse
import asyncio
import builtins
import dataclasses
import functools
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.tools import hot_path  # noqa: E402
from benchmarks.tools.bare_driver import run_bare  # noqa: E402
from benchmarks.tools.loop_floor import LoopFloor, processes_cpu_s  # noqa: E402
from broker.dealer import HOLDOUT_EVERY, ClipDealer  # noqa: E402
from broker.policy_runner import PolicyRunner  # noqa: E402
from broker.pool import PoolCounters, SimulatorPool  # noqa: E402
from broker.samplers import make_sampler  # noqa: E402
from jobs.processes import start_service  # noqa: E402
from sim_server.cost_model import PRESETS  # noqa: E402

DEFAULT_STEP_LATENCY_S = PRESETS["step-only"].step_latency_s
FLOOR_STEPS = 300  # lock-step steps of the closed-loop floor per iteration, about as many as a broker iteration's
BARE_ROWS = 300  # Step calls per server of the bare driver per iteration


async def measure(
    slots: int, servers: int, pipelines: list[bool], iterations: int, samples: int, alpha: float, t_max: int,
    profile: Path | None, step_latency_s: float | None = None, transports: tuple[str, ...] = ("grpc",),
) -> list[dict]:  # fmt: skip
    """One row per (pipeline, transport), measured on the same server processes, iterations interleaved."""
    latency_args = ["--step-latency-s", repr(step_latency_s)] if step_latency_s is not None else []
    per_server = slots // servers
    sizes = [per_server + (1 if i < slots % servers else 0) for i in range(servers)]
    procs = [
        start_service(
            f"sim-{i}",
            ["sim-server", "--slots", str(k), "--port", "0", "--cost-preset", "step-only", *latency_args],
        )
        for i, k in enumerate(sizes)
    ]
    pools = {}
    try:
        for transport in transports:
            pools[transport] = SimulatorPool(use_local_step=transport == "local")
            for p in procs:
                await pools[transport].add(p.address)
        samplers = {}
        before = dataclasses.replace(next(iter(pools.values())).counters)  # a copy: the pool adds to its own
        for transport, pool in pools.items():
            for pipeline in pipelines:
                runner = PolicyRunner(pool.observation_space, pool.action_space, (64, 64), seed=0)
                dealer = ClipDealer(pool.num_clips, holdout_every=HOLDOUT_EVERY, seed=0)
                samplers[pipeline, transport] = make_sampler(
                    "fast", pool, runner, dealer, samples_per_iteration=samples, alpha=alpha, t_max=t_max,
                    pipeline=pipeline,
                )  # fmt: skip
                await samplers[pipeline, transport].sample()  # warm-up
        floor = _floor(next(iter(pools.values())), before, sizes, step_latency_s or DEFAULT_STEP_LATENCY_S)
        rows: dict[tuple, list[dict]] = {variant: [] for variant in samplers}
        floors, bares = [], []
        addresses = [p.address for p in procs]
        async with floor:
            pids = [p.pid for p in procs]
            for _ in range(iterations):
                for variant, sampler in samplers.items():
                    cpu_before, servers_before = time.process_time(), processes_cpu_s(pids)
                    batch, stats = await sampler.sample()
                    cpu = (time.process_time() - cpu_before, processes_cpu_s(pids) - servers_before)
                    rows[variant].append(_row(slots, batch, stats, cpu))
                floors.append(await floor.run(FLOOR_STEPS))
                # The same server processes, stepped by a loop that does nothing else (a sampler's
                # next iteration starts with a reset of every slot, so the bare driver's resets are harmless).
                bares.append(await run_bare(addresses, BARE_ROWS))
        profiled = {}
        if profile:
            for (pipeline, transport), sampler in samplers.items():
                where = profile / f"{slots}x{servers}{'-pipelined' if pipeline else ''}-{transport}"
                profiled[pipeline, transport] = await _profile(sampler, os.getpid(), procs[0].pid, where)
    finally:
        for pool in pools.values():
            await pool.close()
        for p in procs:
            p.stop()
    floor_summary = {
        "share": statistics.median(f.share for f in floors),
        "raw": statistics.median(f.raw for f in floors),
        "latency_ms": statistics.median(f.latency_s for f in floors) * 1e3,
        "compute_ms": floor.compute_s * 1e3,
        "driver_cpu_ms": statistics.median(f.driver_cpu_s for f in floors) * 1e3,
        "servers_cpu_ms": statistics.median(f.servers_cpu_s for f in floors) * 1e3,
    }
    bare_summary = {
        "share": statistics.median(b.share for b in bares),
        "raw": statistics.median(b.raw for b in bares),
        "latency_ms": statistics.median(b.latency_s for b in bares) * 1e3,
        "driver_cpu_ms": statistics.median(b.driver_cpu_s for b in bares) * 1e3,
    }
    return [
        _summary(slots, servers, pipeline, transport, rows[pipeline, transport], profiled.get((pipeline, transport)))
        | {"floor": floor_summary, "bare": bare_summary}
        for pipeline, transport in samplers
    ]


def _floor(pool: SimulatorPool, before: PoolCounters, sizes: list[int], latency_s: float) -> LoopFloor:
    """The closed-loop floor's probe for this configuration: as many servers and slots, the compute
    the real servers reported during the warm-up, messages of the real ones' size."""
    calls = pool.counters.since(before)
    compute_s = min(calls.step_compute_s / max(calls.step_calls, 1), latency_s)
    obs, act = pool.observation_space, pool.action_space
    obs_bytes = math.prod(obs.shape) * np.dtype(obs.dtype).itemsize
    act_bytes = math.prod(act.shape) * (8 if act.kind == "discrete" else 4)
    return LoopFloor(
        sizes,
        compute_s=compute_s,
        latency_s=latency_s,
        request_bytes=max(sizes) * (act_bytes + 2) + 16,  # actions, slot ids and framing, as a StepRequest has
        answer_bytes_per_slot=obs_bytes + 8,  # observation, reward, flags and slot id
    )


def _row(slots: int, batch: dict, stats, cpu_s: tuple[float, float]) -> dict:
    """One iteration's figures; `cpu_s`: the CPU seconds this process (the broker) and the servers used in it."""
    steps = batch["valid_mask"].shape[0]
    latency = stats.step_server_s / steps  # what the servers measured per step call
    s = stats.summary()
    return {
        "latency_ms": latency * 1e3,
        "ideal": slots / latency,
        "raw": s["raw_throughput"],
        "effective": s["effective_throughput"],
        "validity": s["validity"],
        "per_step_ms": {k: v / steps * 1e3 for k, v in s["time_split_s"].items()},
        "step_ms": stats.wall_s / steps * 1e3,
        "ahead": stats.steps_ahead / steps,  # Step calls started before the row before them was judged, per row
        "broker_cpu_ms": cpu_s[0] / steps * 1e3,
        "servers_cpu_ms": cpu_s[1] / steps * 1e3,
    }


# Per-iteration figures whose median over the iterations a configuration's summary keeps.
_MEDIANS = (
    *("latency_ms", "ideal", "raw", "effective", "validity", "step_ms", "ahead"),
    *("broker_cpu_ms", "servers_cpu_ms"),
)


def _summary(slots: int, servers: int, pipeline: bool, transport: str, rows: list[dict], profiled: dict | None) -> dict:
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    split = {k: statistics.median(r["per_step_ms"][k] for r in rows) for k in rows[0]["per_step_ms"]}
    return {
        "slots": slots,
        "servers": servers,
        "pipeline": pipeline,
        "transport": transport,
        **{key: med(key) for key in _MEDIANS},
        "split": split,
        "profile": profiled,
    }


async def _profile(sampler, broker_pid: int, server_pid: int, out: Path) -> dict:
    """One iteration under py-spy: per lock-step step, ms of each kind of work in the broker and a server."""
    out.mkdir(parents=True, exist_ok=True)
    samplers = {
        "broker": hot_path.Sampler(broker_pid, out / "broker.txt"),
        "server": hot_path.Sampler(server_pid, out / "server.txt"),
    }
    hot_path.settle()
    batch, stats = await sampler.sample()
    raw = {name: s.stop() for name, s in samplers.items()}
    if not all(raw.values()):
        errors = "; ".join(f"{n}: {s.error}" for n, s in samplers.items())
        raise RuntimeError(f"py-spy recorded nothing ({errors})")
    steps = batch["valid_mask"].shape[0]
    return {
        "step_ms": stats.wall_s / steps * 1e3,
        **{name: hot_path.per_step_ms(text, samplers[name].rate_hz, stats.wall_s, steps) for name, text in raw.items()},
    }


async def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    results = []
    profile = None
    if args.profile:
        if not hot_path.can_attach():
            raise SystemExit("--profile: py-spy is missing or may not attach here (pip install py-spy; run as root)")
        profile = Path(tempfile.mkdtemp(prefix="broker-profile-"))
    for slots in (10, 30):
        for servers in args.servers:
            results += await measure(
                slots, servers, args.pipeline, args.iterations, args.samples, args.alpha, args.t_max, profile,
                args.step_latency_s, args.transport,
            )  # fmt: skip
    out = io.StringIO()
    print = functools.partial(builtins.print, file=_Tee(out))  # noqa: A001  (the report also goes to --out)
    latency_ms = (args.step_latency_s or DEFAULT_STEP_LATENCY_S) * 1e3
    print(
        f"fast mode, step-only preset ({latency_ms:g} ms step, free resets), "
        f"alpha={args.alpha} t_max={args.t_max}, "
        f"{args.samples} valid samples/iteration, medians of {args.iterations} iterations"
    )
    print(
        f"{'slots':>5} {'servers':>7} {'pipelined':>9} {'transport':>9} {'latency ms':>10} {'ideal/s':>9} {'raw/s':>8} "
        f"{'raw/ideal':>9} {'floor':>6} {'raw/floor':>9} {'bare':>6} {'raw/bare':>8} {'eff/s':>8} {'eff/ideal':>9} "
        f"{'eta':>5} {'step ms':>7} "
        f"{'ahead':>5}  per-step split ms (stepping inference transport waiting resetting)"
    )
    for r in results:
        sp = r["split"]
        print(
            f"{r['slots']:>5} {r['servers']:>7} {'yes' if r['pipeline'] else 'no':>9} {r['transport']:>9} "
            f"{r['latency_ms']:>10.2f} "
            f"{r['ideal']:>9.0f} {r['raw']:>8.0f} {r['raw'] / r['ideal']:>9.3f} {r['floor']['share']:>6.3f} "
            f"{r['raw'] / r['ideal'] / r['floor']['share']:>9.3f} {r['bare']['share']:>6.3f} "
            f"{r['raw'] / r['bare']['raw']:>8.3f} {r['effective']:>8.0f} "
            f"{r['effective'] / r['ideal']:>9.3f} {r['validity']:>5.2f} {r['step_ms']:>7.2f} {r['ahead']:>5.2f}  "
            f"{sp['stepping']:.2f} {sp['inference']:.2f} {sp['transport']:.2f} "
            f"{sp['waiting']:.2f} {sp['resetting']:.2f}"
        )
    print(
        "floor: the closed-loop floor's share of its ideal (benchmarks/tools/loop_floor.py: as many probe server "
        "processes and slots,\nthe servers' measured compute spun, the rest of the step latency waited as they wait, "
        "answers of the same size,\nno inference, encoding or checks), measured between the broker's iterations; "
        "raw/floor: the broker's share over the floor's;\nbare: the bare driver's share of its ideal "
        "(benchmarks/tools/bare_driver.py: the same server processes, sockets and messages, stepped by a loop\nthat "
        "only writes fixed actions, reads and decodes, each server on its own, resets left out), measured "
        "between the broker's iterations;\nraw/bare: the broker's raw throughput over the bare driver's on the same "
        "servers. floor -> bare is the servers' own per-call work; bare -> broker is the broker's"
    )
    for (slots, servers), r in {(r["slots"], r["servers"]): r for r in results}.items():
        f, b = r["floor"], r["bare"]
        print(
            f"  {slots} slots x {servers} servers: floor {f['raw']:.0f} raw/s at {f['latency_ms']:.2f} ms a step "
            f"(compute {f['compute_ms']:.2f} ms), {f['share']:.3f} of its ideal; bare driver {b['raw']:.0f} raw/s "
            f"at {b['latency_ms']:.2f} ms a step, {b['share']:.3f} of its ideal, {b['driver_cpu_ms']:.2f} ms CPU "
            "per call"
        )
    print(
        "CPU per lock-step step, ms (user + system, every thread; medians): the broker (this process) and all "
        "simulator servers together,\nbeside the floor's driver and probe servers (the same work but for inference, "
        "encoding, checks and bookkeeping)"
    )
    print(f"{'slots':>5} {'servers':>7} {'pipelined':>9} {'broker':>7} {'driver':>7} {'servers':>8} {'probes':>7}")
    for r in results:
        f = r["floor"]
        print(
            f"{r['slots']:>5} {r['servers']:>7} {'yes' if r['pipeline'] else 'no':>9} {r['broker_cpu_ms']:>7.2f} "
            f"{f['driver_cpu_ms']:>7.2f} {r['servers_cpu_ms']:>8.2f} {f['servers_cpu_ms']:>7.2f}"
        )
    if profile:
        print_profiles(results, profile, print)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "overhead.txt").write_text(out.getvalue())
        (args.out / "overhead.json").write_text(json.dumps({"args": sys.argv[1:], "results": results}, indent=1))


class _Tee:
    def __init__(self, copy: io.StringIO) -> None:
        self.copy = copy

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        self.copy.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


def print_profiles(results: list[dict], where: Path, print=builtins.print) -> None:  # noqa: A002
    kinds = list(hot_path.KINDS)
    print(
        f"\nper lock-step step, ms of each process's main thread by kind of work (py-spy, one profiled iteration "
        f"each; raw samples in {where})"
    )
    print(
        f"{'slots':>5} {'servers':>7} {'pipelined':>9} {'transport':>9} {'process':>7} {'step ms':>7} "
        + " ".join(f"{k:>13}" for k in kinds)
    )
    for r in results:
        p = r["profile"]
        for name in ("broker", "server"):
            print(
                f"{r['slots']:>5} {r['servers']:>7} {'yes' if r['pipeline'] else 'no':>9} {r['transport']:>9} "
                f"{name:>7} "
                f"{p['step_ms']:>7.2f} " + " ".join(f"{p[name][k]:>13.2f}" for k in kinds)
            )


def server_counts(text: str) -> list[int]:
    counts = [int(x) for x in text.split(",")]  # ValueError: argparse names the flag and the value
    if min(counts) < 1:
        raise ValueError(text)
    return counts


def transports(text: str) -> tuple[str, ...]:
    words = tuple(text.split(","))
    if not words or not set(words) <= {"grpc", "local"}:
        raise argparse.ArgumentTypeError("use grpc, local or grpc,local")
    return words


def _on_off(text: str) -> list[bool]:
    words = text.split(",")
    if not set(words) <= {"on", "off"}:
        raise argparse.ArgumentTypeError("use on, off or off,on")
    return [word == "on" for word in words]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--t-max", type=int, default=200)
    parser.add_argument(
        "--servers",
        type=server_counts,
        default=[1, 2, 3],
        help="server process counts to spread the slots over (comma list)",
    )
    parser.add_argument(
        "--pipeline",
        type=_on_off,
        default=[False, True],
        help="rounds pipelined across servers or not (broker/samplers/rounds.py): off,on measures both",
    )
    parser.add_argument(
        "--transport",
        type=transports,
        default=("grpc", "local"),
        help="how the broker steps the servers: gRPC StepStream, their local step sockets, or both (grpc,local)",
    )
    parser.add_argument(
        "--step-latency-s", type=float, default=None, help="the servers' emulated step latency (default: 1.6 ms)"
    )
    parser.add_argument("--out", type=Path, default=None, help="also write overhead.txt and overhead.json here")
    parser.add_argument("--profile", action="store_true", help="also break each step down with py-spy")
    asyncio.run(main(parser.parse_args()))
