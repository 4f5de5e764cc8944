"""The bare driver: the real simulator servers, stepped by a loop that does nothing else.

The broker's overhead benchmark sets two measurements beside the broker. The closed-loop floor
(loop_floor.py) has probe servers that only spin their compute and wait: what this machine allows
a closed loop at all. The bare driver steps the very server processes the broker steps, over the
same local step sockets and the same StepRequest and StepResponse messages, with a loop that does
only what any driver must: per server, write a request of fixed actions, read the answer, decode
it, drop the slots whose episode ended, repeat. No inference, no checks of the answer, no batch,
no rounds, and each server on its own (no lock step between servers, so never slower than a
lock-step driver). When half a server's slots have ended, or after `rows_per_reset` rows, its
slots are reset in one call, and the reset's time is left out.

Its share of the ideal splits the broker's gap in two: from the floor to the bare driver is what
the servers' own per-call work (decoding, slot and action checks, building the answer) and its
transport cost; from the bare driver to the broker is the broker's own (inference, checks,
batch, the rounds' bookkeeping). The ideal is taken as the broker's benchmark takes it: slots
over the step latency, per row the slowest server's own time (compute + emulated) for its call
of that row, averaged over the rows. Servers of different speeds could put the bare driver above that
lock-step ideal (it never waits for the slower one); the benchmark's servers are alike.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import numpy as np

from fast.spaces import SpaceSpec
from sim_server.client import ServerDescription, SimulatorClient

_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class BareResult:
    servers: int
    slots: int
    rows: int  # Step calls per server
    # Per row, the slowest server's own time for its call of that row (compute + emulated), mean
    # over the rows: the servers step at once, and the broker's benchmark takes its ideal so too.
    latency_s: float
    raw: float  # slot-steps a second, every slot of a server counted at each of its rows, resets left out
    ideal: float  # slots / latency_s
    resets: int  # Reset calls made (their time left out)
    driver_cpu_s: float = math.nan  # CPU of this process per row and server
    # Each server's slots over its own mean time a row, summed: the bound of drivers that never wait for
    # each other, as these do. `ideal` takes each row at its slowest server, so a late row of one server
    # and a late row of the other both count against it, and `raw` can pass it when they fall apart.
    servers_ideal: float = math.nan

    @property
    def share(self) -> float:
        return self.raw / self.ideal


@dataclass(frozen=True)
class _ServerRun:
    slots: int
    stepping_s: float  # wall time of the rows, resets left out
    latency_s: list[float]
    resets: int


def fixed_actions(space: SpaceSpec, k: int) -> np.ndarray:
    """k actions inside `space` that every step reuses: a Box's midpoint (0 where a bound is
    infinite), a Discrete's 0."""
    if space.kind == "discrete":
        return np.zeros(k, dtype=np.int64)
    low, high, _ = space.flat_bounds
    with np.errstate(invalid="ignore"):  # halves first: no overflow; an infinite bound gives inf or NaN
        middle = low / 2 + high / 2
    middle = np.clip(np.where(np.isfinite(middle), middle, 0.0), low, high)
    return np.broadcast_to(middle.reshape(space.shape).astype(space.dtype), (k, *space.shape)).copy()


async def _drive(client: SimulatorClient, server: ServerDescription, rows: int, rows_per_reset: int, clip_base: int):
    num_slots, num_clips = server.num_slots, server.num_clips
    ids = np.arange(num_slots)
    actions = fixed_actions(server.action_space, num_slots)
    stream = await client.local_step_stream(server.local_step_socket)
    resets = 0

    async def reset() -> float:
        nonlocal resets
        started = time.perf_counter()
        clips = (clip_base + resets * num_slots + ids) % num_clips
        await client.reset(ids, clips, ids, timeout_s=_TIMEOUT_S)
        resets += 1
        return time.perf_counter() - started

    try:
        reset_s = 0.0
        await reset()
        live = np.ones(num_slots, dtype=bool)
        latency = []
        started = time.perf_counter()
        for row in range(1, rows + 1):
            stepping = ids[live]
            async with asyncio.timeout(_TIMEOUT_S):  # no task per call, as the pool's
                reply = await stream.step(stepping, actions[: stepping.size])
            latency.append(reply.timing.compute_s + reply.timing.emulated_s)
            live[stepping[reply.terminated | reply.truncated]] = False
            if row < rows and (live.sum() * 2 <= num_slots or row % rows_per_reset == 0):
                reset_s += await reset()
                live[:] = True
        return _ServerRun(num_slots, time.perf_counter() - started - reset_s, latency, resets - 1)
    finally:
        stream.cancel()


async def run_bare(addresses: list[str], rows: int, *, rows_per_reset: int = 200) -> BareResult:
    """Step every server at `addresses` `rows` times over its local step socket, all at once, each
    on its own; the servers must name a local step socket in Describe (be on this machine)."""
    if not addresses:
        raise ValueError("addresses is empty; give at least one simulator server")
    if rows < 1 or rows_per_reset < 1:
        raise ValueError(f"rows and rows_per_reset must be at least 1, got {rows} and {rows_per_reset}")
    clients = [SimulatorClient(address, timeout_s=_TIMEOUT_S) for address in addresses]
    try:
        descriptions = [await client.describe() for client in clients]
        missing = [a for a, d in zip(addresses, descriptions) if not d.local_step_socket]
        if missing:
            raise ValueError(f"simulator {missing[0]} names no local step socket; the bare driver needs one")
        cpu_before = time.process_time()
        runs = await asyncio.gather(
            *(
                _drive(client, server, rows, rows_per_reset, clip_base=7 * i)
                for i, (client, server) in enumerate(zip(clients, descriptions))
            )
        )
        cpu_s = time.process_time() - cpu_before
    finally:
        for client in clients:
            await client.close()
    latency_s = float(np.max([run.latency_s for run in runs], axis=0).mean())  # per row the slowest server
    slots = sum(run.slots for run in runs)
    return BareResult(
        servers=len(runs),
        slots=slots,
        rows=rows,
        latency_s=latency_s,
        raw=sum(run.slots * rows / run.stepping_s for run in runs),
        ideal=slots / latency_s,
        resets=sum(run.resets for run in runs),
        driver_cpu_s=cpu_s / (rows * len(runs)),
        servers_ideal=sum(run.slots / float(np.mean(run.latency_s)) for run in runs),
    )
