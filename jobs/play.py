"""`fast play`: drive a simulator server over gRPC with a random policy.

The smallest end-to-end run of the stack: it starts a server process (or uses one at
`address`), resets every slot in one batched call, steps all slots in lock-step, resets
the slots whose episodes ended (per-slot autoreset), and prints what the episodes measured.
A server it starts gets a token of its own; one at `address` is asked with the environment's
(FAST_AUTH_TOKEN, FAST_AUTH_TOKEN_FILE or ~/.fast/token; docs/security.md).
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import numpy as np
from rich.console import Console
from rich.table import Table

from fast.spaces import random_actions
from jobs.processes import start_service
from jobs.tokens import temporary_job_token
from sim_server.client import SimulatorClient
from sim_server.config import SimServerConfig


async def play(*, env: str, slots: int, steps: int, address: str | None, seed: int) -> None:
    console = Console()
    server, credentials = None, None
    cleanup = ExitStack()
    try:
        if address is None:
            token = cleanup.enter_context(temporary_job_token())
            credentials = token.credentials
            config = SimServerConfig(env=env, slots=slots, port=0)
            server = start_service("sim-server", ["sim-server", *config.to_argv()], env=token.env)
            address = server.address
            console.print(f"started [bold]fast sim-server[/] (pid {server.pid}) on {address}")
        async with SimulatorClient(address, timeout_s=30.0, credentials=credentials) as client:
            await client.wait_ready()
            desc = await client.describe()
            console.print(
                f"{desc.env_id}: {desc.num_slots} slots, {desc.num_clips} clips, "
                f"obs {list(desc.observation_space.shape)}, "
                f"action {desc.action_space.kind} {list(desc.action_space.shape)}"
            )
            rng = np.random.default_rng(seed)
            slot_ids = np.arange(desc.num_slots)
            clip_order = rng.permutation(desc.num_clips)
            next_clip = desc.num_slots
            await client.reset(slot_ids, clip_order[slot_ids % desc.num_clips], slot_ids)
            episodes = []
            started = time.perf_counter()
            for _ in range(steps):
                reply = await client.step(slot_ids, random_actions(desc.action_space, slot_ids.size, rng))
                episodes.extend(reply.episodes)
                ended = slot_ids[reply.terminated | reply.truncated]
                if ended.size:
                    clips = clip_order[(next_clip + np.arange(ended.size)) % desc.num_clips]
                    next_clip += ended.size
                    await client.reset(ended, clips, ended + next_clip)
            elapsed = time.perf_counter() - started
    finally:
        if server is not None:
            server.stop()
        cleanup.close()
    console.print(
        f"{steps * slot_ids.size} slot-steps in {elapsed:.2f} s ({steps * slot_ids.size / elapsed:,.0f} slot-steps/s), "
        f"{len(episodes)} episodes ended"
    )
    if episodes:
        _print_metrics(console, episodes)


def _print_metrics(console: Console, episodes) -> None:
    table = Table(title="Random policy: closed-loop metrics of finished episodes")
    for col in ("metric", "mean", "min", "max"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    lengths = np.array([e.length for e in episodes], dtype=float)
    rows = {
        "length": lengths,
        "return": np.array([e.episode_return for e in episodes]),
        "terminated": np.array([float(e.terminated) for e in episodes]),
    }
    for name in sorted(episodes[0].metrics):
        if name not in ("length", "return", "clip_id"):
            rows[name] = np.array([e.metrics.get(name, np.nan) for e in episodes])
    for name, values in rows.items():
        table.add_row(name, f"{np.nanmean(values):.3f}", f"{np.nanmin(values):.3f}", f"{np.nanmax(values):.3f}")
    console.print(table)
