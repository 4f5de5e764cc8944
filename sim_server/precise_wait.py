"""Waiting for a precise duration: `precise_wait` inside an event loop, `precise_sleep` blocking a process.

Both make one kind of wait: time.sleep until shortly before the deadline (it oversleeps by
~0.1 ms here), then spin to it, and return the wait actually made. They differ where their
callers differ, so both are kept:

- `precise_wait` (a simulator server's CostModel) must keep the loop free for other calls.
  asyncio timers fire on whole milliseconds here (a 1.6 ms sleep takes about 2.1 ms), which
  would inflate an emulated 1.6 ms step by a third. So it sleeps on the loop for all but the
  last 2 ms, then finishes in a worker thread that yield-spins with time.sleep(0) (which
  releases the GIL each turn, so the loop thread runs). Handing the result back to the loop
  takes about 0.1 ms, so the thread stops that much early. Measured here: 1.6 ms waits
  1.61 ms (median; p10 1.54, p90 1.63).
- `precise_sleep` (the Gymnasium reference's SyncCostModel, one env per process) blocks its
  whole process, which has nothing else to do. Dozens of env processes share a few cores, so
  it sleeps to 0.15 ms before the deadline (time.sleep's overshoot: median 0.1 ms, p10
  0.09 ms) and spins with os.sched_yield: a short spin that lets another runnable env
  process on the core wake up on time.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

_LOOP_SLACK_S = 0.002
_THREAD_SLEEP_SLACK_S = 0.0002  # time.sleep's usual overshoot here; the rest is spun
_HANDBACK_S = 0.0001  # waking the loop from the worker thread (measured ~0.1 ms here)
_PROCESS_SLEEP_SLACK_S = 0.00015  # shorter: a long spin in one env process delays the others
# Many concurrent calls may each be finishing a wait; threads only sleep, so many are cheap.
_WAIT_THREADS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="precise-wait")


async def precise_wait(seconds: float) -> float:
    """Wait `seconds` without blocking the loop; returns the seconds actually waited."""
    start = time.perf_counter()
    if seconds <= 0:
        return 0.0
    coarse = seconds - _LOOP_SLACK_S
    if coarse > 0:
        await asyncio.sleep(coarse)
    deadline = start + seconds - _HANDBACK_S
    if deadline > time.perf_counter():
        await asyncio.get_running_loop().run_in_executor(
            _WAIT_THREADS, _sleep_until, deadline, _THREAD_SLEEP_SLACK_S, _release_gil
        )
    return time.perf_counter() - start


def precise_sleep(seconds: float) -> float:
    """Block `seconds` (sleep, then a short spin to the deadline); returns the seconds really waited."""
    start = time.perf_counter()
    if seconds <= 0:
        return 0.0
    _sleep_until(start + seconds, _PROCESS_SLEEP_SLACK_S, os.sched_yield)
    return time.perf_counter() - start


def _sleep_until(deadline: float, sleep_slack_s: float, spin: Callable[[], None]) -> None:
    """time.sleep to `sleep_slack_s` before the deadline, then call `spin` until it passes."""
    coarse = deadline - time.perf_counter() - sleep_slack_s
    if coarse > 0:
        time.sleep(coarse)
    while time.perf_counter() < deadline:
        spin()


def _release_gil() -> None:
    time.sleep(0)
